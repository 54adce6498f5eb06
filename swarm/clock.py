"""Time: the `Clock` protocol (wall or virtual) and the swarm-round Lamport clock.

Invariants:
- The swarm round only moves forward: +1 per local training step, and to
  `max(own, seen)` for every *accepted* message.
- A message more than `max_ahead` rounds beyond our own is refused ("from the future")
  and does not move the clock by itself, so one hostile peer cannot make honest work
  stale. A node that fell far behind (offline for a while) still catches up: once
  `catch_up_quorum` distinct senders have each claimed a round beyond `max_ahead`, the
  clock jumps to the highest round that many of them vouch for.
- Staleness of an item is `own_round - item_round`; usable iff `staleness <= max_staleness`.
  Negative staleness (an item from a round ahead of ours, within `max_ahead`) is usable:
  accepting its message has already moved our clock up to its round.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
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


def staleness(own_round: int, item_round: int) -> int:
    return own_round - item_round


def is_fresh(own_round: int, item_round: int, max_staleness: int) -> bool:
    return staleness(own_round, item_round) <= max_staleness


def is_from_future(own_round: int, item_round: int, max_ahead: int) -> bool:
    return item_round - own_round > max_ahead


@dataclass
class SwarmRound:
    """The Lamport clock over training steps (see module invariants)."""

    value: int = 0
    max_ahead: int = 8
    catch_up_quorum: int = 2
    max_claims: int = 256
    _future_claims: dict[str, int] = field(default_factory=dict, repr=False)

    def tick(self) -> int:
        self.value += 1
        return self.value

    def admits(self, seen_round: int) -> bool:
        return not is_from_future(self.value, seen_round, self.max_ahead)

    def observe(self, seen_round: int) -> None:
        """Move forward to an accepted message's round (callers check `admits` first)."""
        if self.admits(seen_round):
            self.value = max(self.value, seen_round)

    def note_future(self, sender: str, seen_round: int) -> bool:
        """Record a refused from-the-future claim by `sender`; True if the clock jumped.

        The jump target is the `catch_up_quorum`-th highest claim among distinct senders,
        so it is a round at least that many peers say they have reached.
        """
        claims = {
            s: r
            for s, r in self._future_claims.items()
            if is_from_future(self.value, r, self.max_ahead)
        }
        if sender in claims or len(claims) < self.max_claims:
            claims[sender] = max(claims.get(sender, 0), seen_round)
        self._future_claims = claims
        if len(claims) < self.catch_up_quorum:
            return False
        self.value = sorted(claims.values(), reverse=True)[self.catch_up_quorum - 1]
        self._future_claims = {}
        return True
