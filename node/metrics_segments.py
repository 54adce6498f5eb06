"""Finished parts of a node's metrics: `metrics-<n>.jsonl.gz` beside `metrics.jsonl`.

A node that runs for days would otherwise grow `metrics.jsonl` without bound (the built-in
model writes about 3 KB a round, several rounds a second: about 2 GB a day). Once the live
file reaches `node.metrics_rotate_mb`, its writer renames it to the next segment
(`metrics-000001.jsonl`, ...) and starts a fresh one; the writer thread then compresses
the segment (about 10x) and removes the oldest compressed ones past `node.metrics_keep_mb`.

Invariants:
- Order: segment numbers grow in the order segments were written, and the live file comes
  after all of them; `iter_metrics` yields every record in the order it was written.
- Every record readable exactly once, whenever a crash comes: a segment is compressed into
  a temporary file that is renamed to `.gz` before the plain segment is removed, and a
  reader that finds both reads the plain one. A plain segment left behind by a crash is
  compressed at the next rotation; leftover temporary files are removed then.
- Bounded: only whole compressed segments are removed, oldest first, and never the first
  one (the run's start, which `swarm status` compares against), until the segments take
  at most `keep_bytes`. Removing is logged; nothing else here deletes data.
- A segment holds complete lines only: the writer rotates right after a whole line.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("swarm.node.metrics")

_SEGMENT = re.compile(r"^(?P<stem>.+)-(?P<number>\d{6,})\.jsonl(?P<gz>\.gz)?$")
_TMP_SUFFIX = ".tmp"


def segment_path(live: Path, number: int, compressed: bool = False) -> Path:
    return live.with_name(f"{live.stem}-{number:06d}.jsonl" + (".gz" if compressed else ""))


def list_segments(live: Path) -> list[tuple[int, Path]]:
    """(number, path) of every finished segment of `live`, oldest first; where a segment
    exists both plain and compressed (a compression not finished), the plain file."""
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(live.parent))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _SEGMENT.match(entry.name)
        if match is None or match["stem"] != live.stem:
            continue
        number = int(match["number"])
        if match["gz"] is None or number not in found:
            found[number] = live.with_name(entry.name)
    return sorted(found.items())


def rotate(live: Path) -> Path:
    """Rename the live file to the next segment; returns the segment's (plain) path. The
    caller has closed it and opens a fresh `live` for the next line."""
    segments = list_segments(live)
    target = segment_path(live, segments[-1][0] + 1 if segments else 1)
    os.rename(live, target)
    return target


def compress(segment: Path, level: int = 6) -> Path:
    """`segment` (plain) -> `segment.gz`, then the plain file removed (see the module)."""
    target = segment.with_name(segment.name + ".gz")
    tmp = target.with_name(target.name + _TMP_SUFFIX)
    with segment.open("rb") as src, gzip.open(tmp, "wb", compresslevel=level) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, target)
    segment.unlink()
    return target


def tidy(live: Path, keep_bytes: int | None) -> None:
    """Compress every plain segment, drop leftover temporary files, then remove the
    oldest compressed segments but the first past `keep_bytes` (None: keep all). An I/O
    error is logged and ends this tidy; the next one tries again."""
    try:
        for leftover in live.parent.glob(f"{live.stem}-*.jsonl.gz{_TMP_SUFFIX}"):
            leftover.unlink()
        for _, path in list_segments(live):
            if path.suffix == ".jsonl":
                compress(path)
        if keep_bytes is not None:
            _prune(live, keep_bytes)
    except OSError as exc:
        log.error("metrics: cannot tidy the segments of %s: %s", live, exc)


def _prune(live: Path, keep_bytes: int) -> None:
    segments = [(number, path, path.stat().st_size) for number, path in list_segments(live)]
    total = sum(size for _, _, size in segments)
    for _, path, size in segments[1:]:
        if total <= keep_bytes:
            break
        path.unlink()
        total -= size
        log.warning("metrics: removed %s (%d bytes) to keep %s's segments within %d bytes "
                    "(node.metrics_keep_mb)", path.name, size, live.name, keep_bytes)  # fmt: skip


def _parse(line: bytes, path: Path, number: int) -> dict[str, Any]:
    try:
        return json.loads(line)
    except ValueError:
        raise ValueError(f"{path}:{number}: corrupt metrics line") from None


def open_segment(path: Path) -> IO[bytes]:
    """A segment for reading; a plain one compressed (and removed) since it was listed is
    read from its `.gz` (whole: the plain file goes only once the `.gz` is in place)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    try:
        return path.open("rb")
    except FileNotFoundError:
        return gzip.open(path.with_name(path.name + ".gz"), "rb")


def iter_metrics(live: Path | str) -> Iterator[dict[str, Any]]:
    """Every record of a node's metrics, oldest first: its segments, then `live` (whose
    torn last line, of a node that is writing or was killed, is skipped). A corrupt line
    anywhere else raises ValueError naming the file and line."""
    live = Path(live)
    for _, path in list_segments(live):
        try:
            f = open_segment(path)
        except FileNotFoundError:
            continue  # pruned since it was listed
        with f:
            for number, line in enumerate(f, start=1):
                yield _parse(line, path, number)
    try:
        f = live.open("rb")
    except FileNotFoundError:
        return
    with f:
        yield from complete_records(f, live)


def complete_records(lines: Iterable[bytes], path: Path) -> Iterator[dict[str, Any]]:
    """The records of a metrics file being written, read line by line: every line that
    ends with a newline; the first one that does not ends the reading. That is the last
    line as of this read: torn by a killed node (skipped unless it parses), or being
    written now, whose rest a lazy reader may find after it has reached the end of the
    file (found by the full suite: the rest then read as a corrupt line of its own)."""
    for number, line in enumerate(lines, start=1):
        if not line.endswith(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                return  # torn, or still being written
            yield record
            return
        yield _parse(line, path, number)
