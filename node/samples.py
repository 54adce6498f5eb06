"""Recent completions with their rewards, for people: `<data_dir>/samples.jsonl`.

Invariants:
- One JSON line per sampled group (round, policy version, task reference, the task's
  question, completions, rewards, finished bits), appended after each round.
- Bounded: past `2 * keep` lines the file is rewritten (atomically: temp file, rename)
  with the newest `keep`, so it never grows beyond about `2 * keep` groups.
- Best effort: an I/O error is logged and counted in `dropped`, never raised (samples
  are for reading, not for resuming).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from node.learner import LocalGroup

log = logging.getLogger("swarm.node.samples")

DEFAULT_KEEP = 200


class SamplesLog:
    def __init__(self, path: Path, keep: int = DEFAULT_KEEP) -> None:
        self.path = path
        self.keep = keep
        self.dropped = 0
        self._lines = self._count_lines()

    def _count_lines(self) -> int:
        try:
            with self.path.open("rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return 0

    def append(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(text)
            self._lines += len(records)
            if self._lines > 2 * self.keep:
                self._trim()
        except OSError as exc:
            self.dropped += len(records)
            log.warning("cannot write %s: %s", self.path, exc)

    def _trim(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)[-self.keep :]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        os.replace(tmp, self.path)
        self._lines = len(lines)


def group_records(
    round_done: int, policy_version: int, groups: Sequence[LocalGroup]
) -> list[dict[str, Any]]:
    """The samples lines of one round's own groups."""
    return [
        {
            "round": round_done,
            "policy_version": policy_version,
            "task": g.ref.to_wire(),
            "prompt": g.prompt,
            "completions": list(g.completions),
            "rewards": list(g.rewards),
            "finished": list(g.finished) if g.finished else None,
        }
        for g in groups
    ]


def read_samples(path: Path, last: int | None = None) -> list[dict[str, Any]]:
    """The records of a samples file (a torn last line is skipped)."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    for line in lines[-last:] if last else lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
