"""Per-round metrics: one JSON object per line in `<data_dir>/metrics.jsonl`.

Invariant: each line is complete and flushed before the next round starts, so a reader
(`swarm status`) never sees a torn line except possibly the very last one, which
readers skip.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def histogram(values: list[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(values).items())}


class MetricsWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics file (a torn last line is skipped)."""
    records = []
    if not path.exists():
        return records
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # torn last line of a node that is writing or was killed
            raise ValueError(f"{path}:{number}: corrupt metrics line") from None
    return records
