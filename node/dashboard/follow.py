"""One node's data dir, followed as the node writes it.

Invariants:
- `metrics.jsonl` is read incrementally: each poll parses only the bytes appended since
  the last one, and only complete lines (a line being written stays for the next poll),
  into a `RunSummary` (bounded memory, whatever the run's length).
- A file that shrank or was replaced (a fresh run in the same dir) starts the summary
  over; a line that is not JSON is counted in `corrupt_lines` and skipped.
- Nothing here writes to the data dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from node.peer_table import read_peer_table
from node.run_summary import RunSummary
from node.samples import read_samples

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
        self._samples_key: tuple[float, int] | None = None
        self._samples: list[dict[str, Any]] = []

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
                self._restart(identity)
            f.seek(self._offset)
            while chunk := f.read(READ_CHUNK):
                self._offset += len(chunk)
                lines = (self._partial + chunk).split(b"\n")
                self._partial = lines.pop()
                for line in lines:
                    added += self._add(line)
        return added

    def _restart(self, identity: tuple[int, int]) -> None:
        self._identity = identity
        self._offset = 0
        self._partial = b""
        self.summary = RunSummary(self.last)

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
        for name in ("peers.json", "samples.jsonl"):
            try:
                stat = (self.data_dir / name).stat()
                stamps.append((stat.st_mtime_ns, stat.st_size))
            except FileNotFoundError:
                stamps.append(None)
        return (id(self.summary), self.summary.rounds_seen, self.corrupt_lines, *stamps)

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
