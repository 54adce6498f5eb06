"""Choosing what a node trains on: the round's own training batch and the external groups.

Pure functions (no node state, no RNG of their own) plus `RecentTasks`, the small memory
of which tasks this node trained lately.

- `training_batch(groups, cap)`: the first `cap` of this round's own groups, those with
  reward variance first (stable within each kind). With `sapo.sampled_groups` S > I this
  is DAPO-style dynamic sampling: of S sampled groups, train on I, informative first.
  With S = I it returns the groups unchanged.
- `expected_signal(rewards, seen)`: how much GRPO signal a re-scored external group is
  expected to carry for this node: the population standard deviation of its rewards
  (0 without variance; for 0/1 rewards `sqrt(q (1 - q))`, largest at a pass rate q of
  1/2: GRPO's summed |advantage| under std normalisation is proportional to it) times
  the task's novelty `1 / (1 + seen)`, `seen` being how many times this node trained the
  same task (prompt) in its last `novelty_window` rounds.
- `select_by_signal(...)`: greedy by expected signal, ties broken by the caller's random
  order; it keeps the pool's guarantees: at most `per_sender_cap` per sender, each entry
  at most once (without replacement), and a task chosen twice in one call counts as seen
  for the second pick.

Invariants: every function here is deterministic given its inputs; none drops a group
for being stale (the pool filters staleness before calling); scores are >= 0.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from typing import Protocol, TypeVar


class _HasRewards(Protocol):
    @property
    def rewards(self) -> tuple[float, ...]: ...


G = TypeVar("G", bound=_HasRewards)


def informative(rewards: Sequence[float]) -> bool:
    """True when a group's rewards differ (GRPO learns only from such groups)."""
    return len(rewards) > 1 and max(rewards) > min(rewards)


def training_batch(groups: Sequence[G], cap: int) -> list[G]:
    """At most `cap` groups: those with reward variance first, then the others, each kind
    in the given order. The identity when `len(groups) <= cap`."""
    if len(groups) <= cap:
        return list(groups)
    rich = [g for g in groups if informative(g.rewards)]
    poor = [g for g in groups if not informative(g.rewards)]
    return (rich + poor)[:cap]


def reward_std(rewards: Sequence[float]) -> float:
    """Population standard deviation (0.0 for fewer than two rewards)."""
    if len(rewards) < 2:
        return 0.0
    mean = math.fsum(rewards) / len(rewards)
    return math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))


def expected_signal(rewards: Sequence[float], seen: int = 0) -> float:
    """Reward spread times novelty: `reward_std(rewards) / (1 + seen)`."""
    if seen < 0:
        raise ValueError("seen must be >= 0")
    return reward_std(rewards) / (1 + seen)


def select_by_signal(
    candidates: Sequence[tuple[str, str, Sequence[float]]],
    count: int,
    per_sender_cap: int,
    seen: dict[str, int],
) -> list[int]:
    """Indices of at most `count` candidates `(sender, task_key, rewards)`, highest
    `expected_signal` first (ties: lower index first, so pass candidates in random
    order), at most `per_sender_cap` per sender, each index once. `seen` counts recent
    trainings per task key (not modified)."""
    chosen: list[int] = []
    per_sender: Counter[str] = Counter()
    seen_now = Counter(seen)
    spread = [reward_std(rewards) for _, _, rewards in candidates]  # = expected_signal(r, 0)
    remaining = list(range(len(candidates)))
    while len(chosen) < count and remaining:
        best, best_score = -1, -1.0
        for i in remaining:
            sender, task, _ = candidates[i]
            if per_sender[sender] >= per_sender_cap:
                continue
            score = spread[i] / (1 + seen_now[task])
            if score > best_score:
                best, best_score = i, score
        if best < 0:  # every remaining sender is at its cap
            break
        sender, task, _ = candidates[best]
        chosen.append(best)
        per_sender[sender] += 1
        seen_now[task] += 1
        remaining.remove(best)
    return chosen


class RecentTasks:
    """How often each task (key: its prompt) was trained in our last `window` rounds.

    Bounded: holds `window` rounds of keys (each round's list as given)."""

    def __init__(self, window: int) -> None:
        if window < 0:
            raise ValueError("window must be >= 0")
        self.window = window
        self._rounds: deque[tuple[int, tuple[str, ...]]] = deque()
        self._counts: Counter[str] = Counter()

    def note(self, own_round: int, keys: Sequence[str]) -> None:
        """Record keys trained in `own_round` (may be called more than once per round)."""
        if self.window == 0 or not keys:
            return
        self._rounds.append((own_round, tuple(keys)))
        self._counts.update(keys)
        self._expire(own_round)

    def _expire(self, own_round: int) -> None:
        while self._rounds and self._rounds[0][0] <= own_round - self.window:
            _, keys = self._rounds.popleft()
            self._counts.subtract(keys)
            for key in keys:
                if self._counts[key] <= 0:
                    del self._counts[key]

    def counts(self, own_round: int) -> dict[str, int]:
        """Task key -> trainings within the window ending at `own_round` (inclusive)."""
        self._expire(own_round)
        return dict(self._counts)
