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


_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


class WallClock:
    """Seconds that also count while the machine is suspended (Linux's boot clock), so a
    laptop's sleep is time that passed for its rate limits, ignore periods and stall
    checks (`gossip.ratelimit`) as it did for its peers. `time.monotonic` stops during a
    suspend; it is the fallback where there is no boot clock."""

    def now(self) -> float:
        if _BOOTTIME is None:
            return time.monotonic()
        return time.clock_gettime(_BOOTTIME)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
