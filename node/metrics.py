"""Per-round metrics: one JSON object per line in `<data_dir>/metrics.jsonl`.

Invariants:
- Each line is complete and written (one unbuffered append) before the next round starts,
  so a reader (`swarm status`) never sees a torn line except possibly the very last one
  (of a node that is writing or was killed), which readers skip.
- Writing never stops the node: a line that cannot be written (disk full, quota, file
  too large, I/O error) is dropped, counted in `MetricsWriter.dropped` and logged. The
  part of it that reached the file is cut off again, and a torn last line left by a
  killed node is cut off when the file is opened, so every line before the last one
  stays a complete record.
- With `rotate_bytes`, the file is moved to the next segment (`node.metrics_segments`)
  right after the line that took it to that size, so a segment ends with a whole line;
  the next line starts a fresh file. `take_rotated` hands the segment to whoever
  compresses it. `read_metrics` reads the segments and the live file, in order.
- `<data_dir>/node-info.json` (`write_node_info`) says who the process writing the
  metrics is (peer id, listen addresses), for the dashboard; replaced atomically, and a
  failed write is logged, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from node.metrics_segments import iter_metrics, rotate

log = logging.getLogger("swarm.node.metrics")


def histogram(values: list[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(values).items())}


def mean_or_none(values: Iterable[float]) -> float | None:
    items = list(values)
    return statistics.fmean(items) if items else None


def mean_by_key(pairs: Iterable[tuple[str, float]]) -> dict[str, float]:
    """The mean value per key, rounded for a metrics line."""
    sums: dict[str, list[float]] = {}
    for key, value in pairs:
        sums.setdefault(key, []).append(value)
    return {key: round(statistics.fmean(values), 4) for key, values in sums.items()}


def round_seconds(
    total: float, critical: Mapping[str, float], compute: Mapping[str, float]
) -> dict[str, float]:
    """A round's time split. `critical`: the phases the round waited for, one after the
    other; with `other` (the rest of `total`: hand-offs, selection, the record) they sum
    to `total`. `compute`: the worker's own seconds for work that can run ahead of the
    round or beside it (sampling and scoring), reported as measured and not part of that
    sum."""
    out = {k: round(v, 4) for k, v in critical.items()}
    out["other"] = round(max(total - sum(critical.values()), 0.0), 4)
    out["total"] = round(total, 4)
    out.update({k: round(v, 4) for k, v in compute.items()})
    return out


def _complete_length(fd: int) -> int:
    """The length of the file up to and including its last newline."""
    end = os.fstat(fd).st_size
    position = end
    while position > 0:
        start = max(position - 65536, 0)
        block = os.pread(fd, position - start, start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


class MetricsWriter:
    def __init__(self, path: Path, rotate_bytes: int | None = None) -> None:
        self.path = path
        self.rotate_bytes = rotate_bytes
        self._rotated: Path | None = None
        self.dropped = 0
        """Lines that could not be written."""
        self.last_error: str | None = None
        self._fd: int | None = None
        self._open()

    def _open(self) -> bool:
        """Open for appending and cut off a torn last line; on failure log and stay closed."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            self._error("cannot open", exc)
            return False
        try:
            complete = _complete_length(fd)
            if complete < os.fstat(fd).st_size:
                log.warning("%s: cutting off a torn last line", self.path)
                os.ftruncate(fd, complete)
        except OSError as exc:
            os.close(fd)
            self._error("cannot repair", exc)
            return False
        self._fd = fd
        return True

    def _error(self, what: str, exc: OSError) -> None:
        self.last_error = f"{what} {self.path}: {exc}"
        log.error("metrics: %s", self.last_error)

    def write(self, record: dict[str, Any]) -> bool:
        """Append one record; False (dropped, counted, logged) if it could not be written."""
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        if self._fd is None and not self._open():
            self._drop()
            return False
        assert self._fd is not None
        fd = self._fd
        try:
            before = os.fstat(fd).st_size
        except OSError as exc:
            self._error("cannot stat", exc)
            self._drop()
            return False
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            self._error("cannot write", exc)
            self._drop()
            self._cut_back(fd, before)
            return False
        if self.rotate_bytes is not None and before + len(line) >= self.rotate_bytes:
            self._rotate()
        return True

    def _rotate(self) -> None:
        """Move the full file to the next segment; the next write opens a fresh one. A
        failed rename is logged and the file simply grows (tried again next line)."""
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        try:
            self._rotated = rotate(self.path)
        except OSError as exc:
            self._error("cannot rotate", exc)

    def take_rotated(self) -> Path | None:
        """The segment the last rotation made, once (None if none since the last call)."""
        rotated, self._rotated = self._rotated, None
        return rotated

    def _drop(self) -> None:
        self.dropped += 1
        log.error("metrics: dropped a line (%d so far)", self.dropped)

    def _cut_back(self, fd: int, length: int) -> None:
        """Remove the part of a failed line; if even that fails, close: reopening cuts it."""
        try:
            os.ftruncate(fd, length)
        except OSError as exc:
            self._error("cannot cut off a partial line in", exc)
            os.close(fd)
            self._fd = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """All complete records of a node's metrics, its rotated segments first (a torn last
    line is skipped). For long runs prefer streaming them: `iter_metrics`."""
    return list(iter_metrics(path))


NODE_INFO = "node-info.json"


def write_node_info(data_dir: Path, *, peer_id: str, listen: Sequence[str]) -> bool:
    """Say in `<data_dir>/node-info.json` who the running node is: its peer id and the
    addresses it listens on (call once it listens). False (logged) if not written."""
    path = Path(data_dir) / NODE_INFO
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(json.dumps({"peer_id": peer_id, "listen": list(listen)}))
        os.replace(temporary, path)
    except OSError as exc:
        log.warning("%s not written: %s", path, exc)
        return False
    return True


def read_node_info(data_dir: Path) -> dict[str, Any] | None:
    """What `write_node_info` wrote, or None (no file, or not one it wrote)."""
    try:
        info = json.loads((Path(data_dir) / NODE_INFO).read_text())
    except (OSError, ValueError):
        return None
    if not (
        isinstance(info, dict)
        and isinstance(info.get("peer_id"), str)
        and isinstance(info.get("listen"), list)
        and all(isinstance(a, str) for a in info["listen"])
    ):
        return None
    return info
