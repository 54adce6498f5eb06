"""Where checkpoints live and which one to resume from.

Invariants:
- Checkpoints are directories `<data_dir>/checkpoints/round-<8 digits>`. The learner
  writes its files into a temporary sibling and renames it into place (atomic on POSIX);
  the node then writes `node.json` (its own state) inside, atomically, last.
- A directory without a readable `node.json` (a write cut short) is never resumed from;
  the learner also verifies its own files on load, and the node falls back to an older
  checkpoint if they are torn. Only the newest `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

_NAME = re.compile(r"^round-(\d{8})$")
NODE_STATE = "node.json"


def checkpoint_root(data_dir: Path) -> Path:
    return data_dir / "checkpoints"


def checkpoint_dir(data_dir: Path, rounds_done: int) -> Path:
    return checkpoint_root(data_dir) / f"round-{rounds_done:08d}"


def read_node_state(directory: Path) -> dict | None:
    try:
        state = json.loads((directory / NODE_STATE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "rounds_done" in state else None


def is_valid(directory: Path) -> bool:
    return read_node_state(directory) is not None


def write_node_state(directory: Path, state: dict) -> None:
    """Write `node.json` atomically (temp file, fsync, rename, fsync dir)."""
    tmp = directory / f".{NODE_STATE}.tmp"
    with tmp.open("w") as f:
        json.dump(state, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(directory / NODE_STATE)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def valid_newest_first(data_dir: Path) -> list[Path]:
    return [p for p in reversed(list_checkpoints(data_dir)) if is_valid(p)]


def list_checkpoints(data_dir: Path) -> list[Path]:
    root = checkpoint_root(data_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name)


def latest_valid(data_dir: Path) -> Path | None:
    found = valid_newest_first(data_dir)
    return found[0] if found else None


def prune(data_dir: Path, keep: int = 2) -> None:
    """Delete all but the newest `keep` valid checkpoints, and any stale temp dirs."""
    valid = [p for p in list_checkpoints(data_dir) if is_valid(p)]
    for old in valid[:-keep]:
        shutil.rmtree(old)
    root = checkpoint_root(data_dir)
    if root.is_dir():
        for leftover in root.iterdir():
            if leftover.name.startswith(".") and leftover.is_dir():
                shutil.rmtree(leftover)  # temp dirs of writes that were cut short
