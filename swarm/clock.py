"""Time: the `Clock` protocol (wall or virtual).

Invariant: there is no swarm-wide clock. Each node measures staleness in its own rounds
and against its peers' own policy versions (`swarm.staleness`); nothing a peer sends
moves a node's sense of time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Seconds and sleeping; wall time in production, virtual time in simnet."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
