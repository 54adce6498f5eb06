"""One node's data dir, followed as the node writes it.

Invariants:
- `metrics.jsonl` is read incrementally: each poll parses only the bytes appended since
  the last one, and only complete lines (a line being written stays for the next poll),
  into a `RunSummary` (bounded memory, whatever the run's length).
- Rotated segments (`node.metrics_segments`) are part of the run: a summary starts from
  the segments, and when the followed file becomes the newest segment (the node rotated
  it), its unread rest is read from there and following goes on in the fresh file.
- A file that shrank or was replaced otherwise (a fresh run in the same dir) starts the
  summary over; a line that is not JSON is counted in `corrupt_lines` and skipped.
- Nothing here writes to the data dir.
- The node's own peer id comes from `node-info.json` (`node.metrics.write_node_info`),
  else from the data dir's `node.key` (its public id only; re-read when the file
  changes), else is unknown.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import IO, Any

from node.metrics import NODE_INFO, read_node_info
from node.metrics_segments import list_segments, open_segment
from node.peer_table import read_peer_table
from node.run_summary import RunSummary
from node.samples import read_samples
from swarm.errors import ConfigError
from swarm.identity import load_key_file

log = logging.getLogger("swarm.dashboard")

READ_CHUNK = 1 << 20


class DataDirFollower:
    def __init__(self, data_dir: Path, name: str | None = None, last: int = 10) -> None:
        self.data_dir = data_dir
        self.name = name or data_dir.name
        self.last = last
        self.summary = RunSummary(last)
        self.corrupt_lines = 0
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._head: bytes | None = None
        """The first line of the followed file (recognizes it once rotated)."""
        self._samples_key: tuple[float, int] | None = None
        self._samples: list[dict[str, Any]] = []
        self._key: tuple[tuple[int, int] | None, str | None] = (None, None)
        """(stamp of node.key, the peer id read from it)."""

    @property
    def metrics_path(self) -> Path:
        return self.data_dir / "metrics.jsonl"

    def poll(self) -> int:
        """Read what was appended since the last poll; return how many rounds were added."""
        try:
            fd = os.open(self.metrics_path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        added = 0
        with os.fdopen(fd, "rb") as f:
            stat = os.fstat(f.fileno())
            identity = (stat.st_dev, stat.st_ino)
            if identity != self._identity or stat.st_size < self._offset:
                rotated = self._rotated_to() if identity != self._identity else None
                if rotated is not None:
                    with open_segment(rotated) as old:
                        added += self._read_rest(old)
                    self._identity, self._offset, self._partial = identity, 0, b""
                    self._head = None
                else:
                    added += self._restart(identity)
            f.seek(self._offset)
            added += self._read_rest(f)
        return added

    def _read_rest(self, f: IO[bytes]) -> int:
        """Parse `f` from `_offset` (a compressed segment is read up to there) to its end."""
        added = 0
        if f.tell() != self._offset:
            f.seek(self._offset)
        while chunk := f.read(READ_CHUNK):
            if self._offset == 0 and self._head is None:
                self._head = chunk.split(b"\n", 1)[0]
            self._offset += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                added += self._add(line)
        return added

    def _rotated_to(self) -> Path | None:
        """The newest segment, if it is the file followed until now (same inode while
        plain; same first line once compressed), else None."""
        if self._identity is None or self._head is None:
            return None
        segments = list_segments(self.metrics_path)
        if not segments:
            return None
        path = segments[-1][1]
        try:
            if path.suffix != ".gz":
                stat = path.stat()
                return path if (stat.st_dev, stat.st_ino) == self._identity else None
            with open_segment(path) as f:
                head = f.readline().rstrip(b"\n")
        except OSError:
            return None
        return path if head == self._head else None

    def _restart(self, identity: tuple[int, int]) -> int:
        """A summary from scratch: every finished segment, then the live file from 0."""
        self._identity = identity
        self._offset = 0
        self._partial = b""
        self._head = None
        self.summary = RunSummary(self.last)
        added = 0
        for _, path in list_segments(self.metrics_path):
            try:
                with open_segment(path) as f:
                    for line in f:
                        added += self._add(line)
            except OSError as exc:  # pruned meanwhile, or unreadable: the rest still shows
                log.warning("dashboard: cannot read %s: %s", path, exc)
        return added

    def _add(self, line: bytes) -> int:
        if not line.strip():
            return 0
        try:
            record = json.loads(line)
            self.summary.add(record)
        except (ValueError, KeyError, TypeError):
            self.corrupt_lines += 1
            return 0
        return 1

    def state_key(self) -> tuple[Any, ...]:
        """Changes whenever what a view of this dir shows may have changed."""
        stamps = []
        for name in ("peers.json", "samples.jsonl", NODE_INFO):
            try:
                stat = (self.data_dir / name).stat()
                stamps.append((stat.st_mtime_ns, stat.st_size))
            except FileNotFoundError:
                stamps.append(None)
        return (id(self.summary), self.summary.rounds_seen, self.corrupt_lines, *stamps)

    def node_info(self) -> dict[str, Any]:
        """`{"peer_id": str | None, "listen": [...]}`: who the node says it is (see the
        module)."""
        info = read_node_info(self.data_dir)
        if info is not None:
            return {"peer_id": info["peer_id"], "listen": info["listen"]}
        return {"peer_id": self._peer_id_from_key(), "listen": []}

    def _peer_id_from_key(self) -> str | None:
        path = self.data_dir / "node.key"
        try:
            stat = path.stat()
        except OSError:
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._key[0]:
            try:
                peer_id: str | None = load_key_file(path).peer_id
            except (ConfigError, OSError):
                peer_id = None
            self._key = (stamp, peer_id)
        return self._key[1]

    def peer_table(self) -> dict[str, Any] | None:
        return read_peer_table(self.data_dir / "peers.json")

    def samples(self, last: int) -> list[dict[str, Any]]:
        """The newest `last` sampled groups (re-read only when the file changed)."""
        path = self.data_dir / "samples.jsonl"
        try:
            stat = path.stat()
        except FileNotFoundError:
            return []
        key = (stat.st_mtime, stat.st_size)
        if key != self._samples_key:
            self._samples_key = key
            self._samples = read_samples(path, last)
        return self._samples[-last:]
