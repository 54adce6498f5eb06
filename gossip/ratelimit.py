"""Per-peer token buckets on an injected clock.

Invariants:
- Time comes only from the injected `Clock` (virtual in simnet, the boot clock in
  production: `swarm.clock.WallClock`), never from `time.time`; a clock that goes
  backwards adds no tokens.
- A peer seen for the first time starts with a full bucket (`burst` tokens); each
  accepted message costs one token; tokens refill at `rate_per_s` up to `burst`.
- At most `max_peers` buckets are kept; the least recently used one is forgotten.
  Forgetting a bucket can only *help* that peer (it comes back full), so an attacker
  cycling identities gains nothing it could not get from new identities anyway, and
  cannot drain an honest peer's bucket.
- A stall of this process (stopped by Ctrl-Z or SIGSTOP, a suspended laptop or VM, a
  machine too loaded to run it, an event loop held by one long step) is not charged to
  peers. They kept sending at their sustained rate meanwhile, and what the transports
  buffered then arrives at once, far beyond `burst`: refused as `rate_limited`, it got
  every such peer ignored (for 120 s after a 90 s stop, found by hand). A node that
  calls `note_alive` every `ALIVE_TICK_S` shows a stall as a gap of over
  `STALL_AFTER_S` between two signs of life (a tick, or any `allow`). For
  `STALL_GRACE_S` after one, buckets refill past `burst` by what the stall's length
  allows at the sustained rate (`rate_per_s` x stall), no further; a limiter never told
  it is alive (simnet, tests) never credits a stall.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.bounded import BoundedDict
from swarm.clock import Clock

ALIVE_TICK_S = 0.5
"""How often a running node calls `note_alive`."""
STALL_AFTER_S = 2.0
"""A gap this long between two signs of life is a stall of this process (four ticks
missed: an event loop merely busy runs its timers far more often than that)."""
STALL_GRACE_S = 30.0
"""How long after a stall its credit lasts: the backlog it left arrives within seconds."""


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
        self._buckets: BoundedDict[str, TokenBucket] = BoundedDict(max_peers)
        """The least recently allowed or refused peer leaves first."""
        self._alive_at: float | None = None
        self._credit = 0.0
        """Tokens a bucket may hold past `burst` until `_credit_until` (stalls)."""
        self._credit_until = float("-inf")
        self.stalls = 0
        """Stalls of this process seen (see the module invariants)."""
        self.stalled_s = 0.0
        """Their total length, seconds."""

    def __len__(self) -> int:
        return len(self._buckets)

    def tokens(self, peer: str) -> float:
        """Tokens `peer` has now (full for an unknown peer); does not spend any."""
        bucket = self._buckets.get(peer)
        if bucket is None:
            return float(self.burst)
        return self._refilled(bucket, self._clock.now())

    def note_alive(self) -> None:
        """A sign of life of this process, due every `ALIVE_TICK_S` (arms stall credit)."""
        self._check_stall(self._clock.now())

    def _check_stall(self, now: float) -> None:
        alive_at, self._alive_at = self._alive_at, now
        if alive_at is None or now - alive_at <= STALL_AFTER_S:
            return
        stalled = now - alive_at
        self.stalls += 1
        self.stalled_s += stalled
        active = self._credit if now <= self._credit_until else 0.0
        self._credit = active + stalled * self.rate_per_s
        self._credit_until = now + STALL_GRACE_S

    def allow(self, peer: str) -> bool:
        now = self._clock.now()
        if self._alive_at is not None:
            self._check_stall(now)
        bucket = self._buckets.get(peer)
        if bucket is None:
            bucket = TokenBucket(float(self.burst), now)
        else:
            bucket.tokens = self._refilled(bucket, now)
            bucket.updated = max(bucket.updated, now)
        self._buckets[peer] = bucket  # the newest; a new peer may push out the oldest
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _refilled(self, bucket: TokenBucket, now: float) -> float:
        elapsed = max(0.0, now - bucket.updated)
        cap = self.burst + (self._credit if now <= self._credit_until else 0.0)
        return min(cap, bucket.tokens + elapsed * self.rate_per_s)
