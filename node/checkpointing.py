"""Writing a node's checkpoints, optionally off the round's critical path.

Invariants:
- A checkpoint is the learner state captured at one moment (`Learner.capture`, a copy
  in memory) plus the node state captured at the same moment, written as
  `node.checkpoints` describes: learner files renamed into place, then `node.json` last.
  A SIGKILL at any point leaves either a complete checkpoint or debris that is never
  resumed from.
- In the background mode the capture is the only part the round waits for; the write,
  `node.json` and pruning older checkpoints run in a worker thread (never on the event
  loop) while the next rounds train. At most one write is in flight:
  the next checkpoint (and the final one, and `settle`) first waits for it.
- A write failing with `OSError` never stops the node: it is logged, counted in
  `errors` / `last_error`, its debris removed, and the newest valid checkpoint kept
  (older ones deleted when the disk is full). Any other exception is a bug and surfaces
  at the next checkpoint (or is logged if the node is already stopping).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from node import checkpoints
from node.learner import Learner

log = logging.getLogger("swarm.node")


class Checkpointer:
    def __init__(self, data_dir: Path, offload: Callable[..., Awaitable[Any]], every: int) -> None:
        self.data_dir = data_dir
        self.offload = offload
        self.every = every
        self.errors = 0
        """Failed checkpoint writes (disk full, I/O error, ...)."""
        self.last_error: str | None = None
        self._pending: asyncio.Task[Path | None] | None = None

    async def checkpoint(
        self,
        rounds_done: int,
        learner: Learner,
        node_state: dict[str, Any],
        *,
        background: bool = False,
    ) -> Path | None:
        """Checkpoint round `rounds_done`. Returns its directory once written (None if
        the write failed, or, in the background mode, while it is still being written)."""
        await self.settle()
        directory = checkpoints.checkpoint_dir(self.data_dir, rounds_done)
        if checkpoints.is_valid(directory):
            checkpoints.prune(self.data_dir)
            return directory
        try:
            checkpoints.remove_torn(directory)  # a crash before node.json left it
            write = await self.offload(
                learner.capture, directory, {"rounds_done": rounds_done}
            )
        except OSError as exc:
            return self._failed(directory, rounds_done, exc)
        finish = self._finish(directory, rounds_done, write, node_state)
        if not background:
            return await finish
        self._pending = asyncio.create_task(finish, name=f"checkpoint-{rounds_done}")
        return None

    async def _finish(
        self,
        directory: Path,
        rounds_done: int,
        write: Callable[[], None],
        node_state: dict[str, Any],
    ) -> Path | None:
        def write_all() -> None:
            write()
            checkpoints.write_node_state(directory, node_state)

        try:
            await self.offload(write_all)
        except OSError as exc:
            return self._failed(directory, rounds_done, exc)
        await self.offload(checkpoints.prune, self.data_dir)
        return directory

    async def settle(self) -> Path | None:
        """Wait for the write in flight, if any; its directory (None: failed or none)."""
        pending, self._pending = self._pending, None
        return None if pending is None else await pending

    async def settle_quietly(self) -> None:
        """`settle` for a node that is stopping anyway: a bug in the write is logged."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        await asyncio.wait({pending})
        if not pending.cancelled() and pending.exception() is not None:
            log.error("background checkpoint write failed: %r", pending.exception())

    def _failed(self, directory: Path, rounds_done: int, exc: OSError) -> Path | None:
        self.errors += 1
        reason = checkpoints.describe(exc)
        self.last_error = f"round {rounds_done}: {reason}"
        kept = checkpoints.discard_failed(self.data_dir, directory, exc)
        log.error(
            "checkpoint %s failed (%s); kept for a restart: %s; training goes on, "
            "next try in %d round(s)",
            directory,
            reason,
            kept or "nothing (no valid checkpoint)",
            self.every,
        )
        return None
