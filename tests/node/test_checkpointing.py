"""`node.checkpointing`: what a background checkpoint leaves on the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node import checkpoints
from node.checkpointing import Checkpointer


class _Learner:
    """Captures nothing but a marker file, written by the returned write step."""

    def capture(self, directory: Path, manifest: dict[str, Any]) -> Callable[[], None]:
        def write() -> None:
            directory.mkdir(parents=True)
            (directory / "weights").write_text(str(manifest))

        return write


async def _run(data_dir: Path, rounds: list[int]) -> Checkpointer:
    ckpt = Checkpointer(data_dir, asyncio.to_thread, every=1)
    for r in rounds:
        await ckpt.checkpoint(r, _Learner(), {"rounds_done": r}, background=True)  # type: ignore[arg-type]
    await ckpt.settle()
    return ckpt


def test_background_checkpoints_write_and_prune_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`node.json` (two fsyncs) and pruning (deleting whole old checkpoints) used to run on
    the event loop after each background write, stalling everything on it."""
    loop_thread = threading.get_ident()
    calls: list[tuple[str, bool]] = []
    for name in ("write_node_state", "prune"):
        real = getattr(checkpoints, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append((_name, threading.get_ident() == loop_thread))
            return _real(*args)

        monkeypatch.setattr(checkpoints, name, spy)
    monkeypatch.setattr(checkpoints, "node_state_problem", lambda state, directory: None)
    ckpt = asyncio.run(_run(tmp_path, [1, 2, 3, 4]))
    assert ckpt.errors == 0
    assert {n for n, _ in calls} == {"write_node_state", "prune"}
    assert not [c for c in calls if c[1]], f"ran on the event loop: {calls}"
    kept = [p.name for p in checkpoints.list_checkpoints(tmp_path)]
    assert len(kept) == 2 and checkpoints.is_valid(checkpoints.checkpoint_dir(tmp_path, 4))
