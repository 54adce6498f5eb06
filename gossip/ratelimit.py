"""Per-peer token buckets on an injected clock.

Invariants:
- Time comes only from the injected `Clock` (virtual in simnet, monotonic in
  production), never from `time.time`; a clock that goes backwards adds no tokens.
- A peer seen for the first time starts with a full bucket (`burst` tokens); each
  accepted message costs one token; tokens refill at `rate_per_s` up to `burst`.
- At most `max_peers` buckets are kept; the least recently used one is forgotten.
  Forgetting a bucket can only *help* that peer (it comes back full), so an attacker
  cycling identities gains nothing it could not get from new identities anyway, and
  cannot drain an honest peer's bucket.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from swarm.clock import Clock


@dataclass
class TokenBucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token bucket per peer id: `allow(peer)` spends one token or says no."""

    def __init__(
        self, rate_per_s: float, burst: int, clock: Clock, max_peers: int = 4096
    ) -> None:
        if rate_per_s <= 0 or burst < 1 or max_peers < 1:
            raise ValueError("rate_per_s must be > 0, burst and max_peers >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_peers = max_peers
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def tokens(self, peer: str) -> float:
        """Tokens `peer` has now (full for an unknown peer); does not spend any."""
        bucket = self._buckets.get(peer)
        if bucket is None:
            return float(self.burst)
        return self._refilled(bucket, self._clock.now())

    def allow(self, peer: str) -> bool:
        now = self._clock.now()
        bucket = self._buckets.get(peer)
        if bucket is None:
            bucket = TokenBucket(float(self.burst), now)
            self._buckets[peer] = bucket
            while len(self._buckets) > self.max_peers:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(peer)
            bucket.tokens = self._refilled(bucket, now)
            bucket.updated = max(bucket.updated, now)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _refilled(self, bucket: TokenBucket, now: float) -> float:
        elapsed = max(0.0, now - bucket.updated)
        return min(float(self.burst), bucket.tokens + elapsed * self.rate_per_s)
