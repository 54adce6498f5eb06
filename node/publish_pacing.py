"""Our rollout batches paced under what peers take from one sender.

Peers accept at most `gossip.rate_limit_per_s` messages a second from one sender (50 by
default) and ignore a sender that keeps sending more (scored `rate_limited`). A node
whose rounds are faster than that was ignored for being quick (found by hand: the
built-in model with one group of 2 a round ran 40-48 rounds a second here, one batch
each; a peer limiting at 20 a second ignored it within seconds, and a machine a few
times faster than this one meets the default 50 the same way). So a node publishes at
most `MAX_BATCHES_PER_S` rollout batches a second: groups of a round that ends sooner
wait and go with the next round's batch, each group keeping its own sampled version
(receivers judge every group by its own version, so a batch may mix rounds).

Invariants:
- `offer` returns a batch at most once per `1 / MAX_BATCHES_PER_S` seconds of the
  injected clock, and always at the first offer after that; it never returns an empty
  batch.
- A batch holds at most `MAX_GROUPS` groups (what `RolloutBatch.from_wire` accepts);
  the pending groups never exceed it either: past it, the oldest are dropped and
  counted (`dropped`), since the newest are the ones peers can still use.
- Nothing else changes: a node whose rounds take longer than the interval (every real
  model; simnet's modeled rounds) publishes each round's batch at once, as before.
- Pure bookkeeping: no I/O, no asyncio.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from swarm.messages import RolloutGroup

MAX_BATCHES_PER_S = 10.0
"""A fifth of the default rate limit: room for hellos, deltas and chunked messages."""
MAX_GROUPS = 1024
"""Groups in one `RolloutBatch` on the wire (`swarm.messages`)."""


class BatchPacer:
    """Holds our groups until a batch may go (see the module invariants)."""

    def __init__(self, max_batches_per_s: float = MAX_BATCHES_PER_S) -> None:
        if max_batches_per_s <= 0:
            raise ValueError("max_batches_per_s must be > 0")
        self.min_interval_s = 1.0 / max_batches_per_s
        self._pending: deque[RolloutGroup] = deque()
        self._last_sent: float | None = None
        self.dropped = 0
        """Groups dropped unsent because more than `MAX_GROUPS` were waiting."""
        self.held = 0
        """Offers whose groups waited for a later batch."""

    def offer(self, groups: Sequence[RolloutGroup], now: float) -> tuple[RolloutGroup, ...] | None:
        """Add a round's groups; the batch to publish now, or None while they wait."""
        self._pending.extend(groups)
        while len(self._pending) > MAX_GROUPS:
            self._pending.popleft()
            self.dropped += 1
        if not self._pending:
            return None
        if self._last_sent is not None and now - self._last_sent < self.min_interval_s:
            self.held += 1
            return None
        self._last_sent = now
        batch = tuple(self._pending)
        self._pending.clear()
        return batch
