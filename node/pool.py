"""The rollout pool: external groups waiting to be trained on.

Invariants:
- Bounded: at most `max_groups` entries and `max_bytes` of text; when full, an entry of
  the sender holding the most entries goes (the stalest of theirs; ties: the newest
  arrival), so a flooding sender pushes out its own groups before anyone else's, and a
  crowd of fresh (sybil) keys cannot push out the groups already held.
- Only groups that were re-scored locally enter (the caller re-scores; advisory rewards
  from peers are never stored as training rewards), and zero-variance groups never enter.
- `evict_stale` removes every entry staler than `max_staleness` swarm rounds.
- `select` draws without replacement, uniformly at random from a seeded RNG, with at most
  `per_sender_cap` entries per sender; a drawn entry leaves the pool (used once).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from swarm.clock import is_fresh, staleness
from swarm.messages import RolloutGroup


@dataclass(frozen=True)
class PoolEntry:
    sender: str
    round: int
    group: RolloutGroup
    rewards: tuple[float, ...]  # re-scored locally
    size_bytes: int
    arrival: int


@dataclass
class RolloutPool:
    max_groups: int
    max_bytes: int
    max_staleness: int
    per_sender_cap: int
    seed: int = 0
    entries: list[PoolEntry] = field(default_factory=list)
    bytes_held: int = 0
    evicted: Counter = field(default_factory=Counter)
    _arrivals: int = 0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def __len__(self) -> int:
        return len(self.entries)

    def add(
        self,
        sender: str,
        round: int,
        group: RolloutGroup,
        rewards: tuple[float, ...],
        own_round: int,
    ) -> bool:
        """Insert a re-scored group; False (and counted) if it is too stale or too big."""
        if not is_fresh(own_round, round, self.max_staleness):
            self.evicted["stale_on_arrival"] += 1
            return False
        size = len(group.prompt) + sum(len(c) for c in group.completions)
        if size > self.max_bytes:
            self.evicted["too_large"] += 1
            return False
        self._arrivals += 1
        self.entries.append(PoolEntry(sender, round, group, rewards, size, self._arrivals))
        self.bytes_held += size
        while len(self.entries) > self.max_groups or self.bytes_held > self.max_bytes:
            held = Counter(e.sender for e in self.entries)
            most = max(held.values())
            victim = min(
                (e for e in self.entries if held[e.sender] == most),
                key=lambda e: (e.round, -e.arrival),
            )
            self._remove(victim)
            self.evicted["capacity"] += 1
        return True

    def _remove(self, entry: PoolEntry) -> None:
        self.entries.remove(entry)
        self.bytes_held -= entry.size_bytes

    def evict_stale(self, own_round: int) -> int:
        stale = [e for e in self.entries if not is_fresh(own_round, e.round, self.max_staleness)]
        for entry in stale:
            self._remove(entry)
        self.evicted["stale"] += len(stale)
        return len(stale)

    def select(self, count: int, own_round: int) -> list[PoolEntry]:
        """Draw up to `count` fresh entries, at most `per_sender_cap` per sender."""
        self.evict_stale(own_round)
        candidates = list(self.entries)
        self._rng.shuffle(candidates)
        chosen: list[PoolEntry] = []
        per_sender: Counter = Counter()
        for entry in candidates:
            if len(chosen) >= count:
                break
            if per_sender[entry.sender] >= self.per_sender_cap:
                continue
            per_sender[entry.sender] += 1
            chosen.append(entry)
        for entry in chosen:
            self._remove(entry)
        return chosen

    def staleness_of(self, entries: list[PoolEntry], own_round: int) -> list[int]:
        return [staleness(own_round, e.round) for e in entries]

    def state_dict(self) -> dict:
        """The pool cursor for checkpoints: RNG state and arrival counter (entries are
        not persisted: after a restart they would be stale or re-sent by peers)."""
        version, internal, gauss = self._rng.getstate()
        return {"rng": [version, list(internal), gauss], "arrivals": self._arrivals}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._arrivals = int(state["arrivals"])
