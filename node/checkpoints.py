"""Where checkpoints live and which one to resume from.

Invariants:
- Checkpoints are directories `<data_dir>/checkpoints/round-<8 digits>`, each written by
  the learner into a temporary sibling and renamed into place (atomic on POSIX), with a
  `manifest.json` written last inside it.
- A directory without a readable manifest (a torn write) is never resumed from; the
  newest valid one is. Only the newest `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

_NAME = re.compile(r"^round-(\d{8})$")
MANIFEST = "manifest.json"


def checkpoint_root(data_dir: Path) -> Path:
    return data_dir / "checkpoints"


def checkpoint_dir(data_dir: Path, rounds_done: int) -> Path:
    return checkpoint_root(data_dir) / f"round-{rounds_done:08d}"


def is_valid(directory: Path) -> bool:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("complete") is True


def list_checkpoints(data_dir: Path) -> list[Path]:
    root = checkpoint_root(data_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name)


def latest_valid(data_dir: Path) -> Path | None:
    for directory in reversed(list_checkpoints(data_dir)):
        if is_valid(directory):
            return directory
    return None


def prune(data_dir: Path, keep: int = 2) -> None:
    """Delete all but the newest `keep` valid checkpoints, and any stale temp dirs."""
    valid = [p for p in list_checkpoints(data_dir) if is_valid(p)]
    for old in valid[:-keep]:
        shutil.rmtree(old)
    root = checkpoint_root(data_dir)
    if root.is_dir():
        for leftover in root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=False)
