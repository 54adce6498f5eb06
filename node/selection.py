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
- `trainable_share(rewards, trainable)`: the share of a group's GRPO signal (its summed
  |reward - group mean|) carried by completions the trainer will train on (`trainable`:
  `trainable_mask(finished, rule)`, from `train.foreign_trajectory`: under `ended` only
  completions that ended). 1.0 when every completion is trainable; 0.0 when none that
  deviates from the mean is: such a group would fill an external slot and teach nothing.
- `select_by_signal(...)`: greedy by expected signal (times each candidate's trainable
  share), ties broken by the caller's random order; it keeps the pool's guarantees: at
  most `per_sender_cap` per sender, each entry at most once (without replacement), and a
  task chosen twice in one call counts as seen for the second pick.
- `draw_slots(...)`: the greedy draw under both rules, with the Sybil bound of
  `node.trust`: each pick first draws one of the arrival cohorts that have a candidate,
  then takes that cohort's best; `senders_first` spreads the picks over senders before
  it gives any sender a second one, and `networks` over networks before any network
  gets a second (each level of spread applies before the next).

Invariants: every function here is deterministic given its inputs; none drops a group
for being stale (the pool filters staleness before calling); scores are >= 0.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
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


def trainable_mask(finished: Sequence[bool], rule: str) -> tuple[bool, ...]:
    """Which of a peer group's completions the trainer may train under
    `train.foreign_trajectory` = `rule`: `ended` those that ended (the wire's `finished`
    bit); `whole` and `text` all of them (whether an unfinished one fills the local budget
    is only known once re-tokenized, so it counts as trainable here)."""
    if rule == "ended":
        return tuple(bool(f) for f in finished)
    return (True,) * len(finished)


def trainable_share(rewards: Sequence[float], trainable: Sequence[bool]) -> float:
    """Share of the summed |reward - mean| carried by `trainable` completions (0.0 for a
    group without variance)."""
    if len(trainable) != len(rewards):
        raise ValueError("one trainable flag per reward")
    if len(rewards) < 2:
        return 0.0
    mean = math.fsum(rewards) / len(rewards)
    deviations = [abs(r - mean) for r in rewards]
    total = math.fsum(deviations)
    if total == 0.0:
        return 0.0
    return math.fsum(d for d, t in zip(deviations, trainable, strict=True) if t) / total


def select_by_signal(
    candidates: Sequence[tuple[str, str, Sequence[float]]],
    count: int,
    per_sender_cap: int,
    seen: dict[str, int],
    shares: Sequence[float] | None = None,
    *,
    cohorts: Sequence[int] | None = None,
    pick_cohort: Callable[[set[int]], int] | None = None,
    senders_first: bool = False,
    networks: Sequence[str] | None = None,
) -> list[int]:
    """Indices of at most `count` candidates `(sender, task_key, rewards)`, highest
    `expected_signal` (times the candidate's `shares` entry, its trainable share; None:
    all 1) first (ties: lower index first, so pass candidates in random order), at most
    `per_sender_cap` per sender, each index once. `seen` counts recent trainings per
    task key (not modified). `cohorts`, `pick_cohort`, `senders_first`, `networks`: as
    `draw_slots`."""
    if shares is not None and len(shares) != len(candidates):
        raise ValueError("one share per candidate")
    spread = [reward_std(rewards) for _, _, rewards in candidates]  # = expected_signal(r, 0)
    if shares is not None:
        spread = [s * share for s, share in zip(spread, shares, strict=True)]
    return draw_slots(
        [(sender, task) for sender, task, _ in candidates],
        spread,
        count,
        per_sender_cap,
        seen,
        cohorts=cohorts,
        pick_cohort=pick_cohort,
        senders_first=senders_first,
        networks=networks,
    )


def draw_slots(
    candidates: Sequence[tuple[str, str]],
    scores: Sequence[float],
    count: int,
    per_sender_cap: int,
    seen: dict[str, int] | None,
    *,
    cohorts: Sequence[int] | None = None,
    pick_cohort: Callable[[set[int]], int] | None = None,
    senders_first: bool = False,
    networks: Sequence[str] | None = None,
) -> list[int]:
    """The greedy draw behind both selection rules: repeatedly the eligible candidate
    `(sender, task_key)` with the highest `score / (1 + seen[task])` (`seen` None: the
    score alone; ties: lower index first), counting each pick's task as seen once more.
    Eligible: its sender below `per_sender_cap` picks (below 1 while, with
    `senders_first`, some other sender with an eligible candidate has none yet). With
    `cohorts` (one per candidate: its sender's arrival cohort, `node.trust`), each pick
    first asks `pick_cohort` for one of the cohorts that have an eligible candidate and
    takes the best candidate of that cohort. With `networks` (one per candidate: its
    sender's network, `node.trust`) a candidate is eligible only while its network has
    no more picks than every other network with an otherwise eligible candidate: each
    network's k-th pick comes after every such network's (k-1)-th."""
    if len(scores) != len(candidates):
        raise ValueError("one score per candidate")
    if networks is not None and len(networks) != len(candidates):
        raise ValueError("one network per candidate")
    if cohorts is not None and (len(cohorts) != len(candidates) or pick_cohort is None):
        raise ValueError("one cohort per candidate, and pick_cohort with them")
    chosen: list[int] = []
    per_sender: Counter[str] = Counter()
    seen_now: Counter[str] | None = None if seen is None else Counter(seen)
    per_network: Counter[str] = Counter()
    cap = 1 if senders_first else per_sender_cap
    network_cap = 1
    remaining = list(range(len(candidates)))
    while len(chosen) < count and remaining:
        eligible = [i for i in remaining if per_sender[candidates[i][0]] < cap]
        if networks is not None and eligible:
            level = [i for i in eligible if per_network[networks[i]] < network_cap]
            if not level:  # every network that has a candidate had its turn: next turn
                network_cap = 1 + min(per_network[networks[i]] for i in eligible)
                continue
            eligible = level
        if not eligible:
            if cap < per_sender_cap:  # every sender had its first pick: now its others
                cap = per_sender_cap
                continue
            break  # every remaining candidate's sender is at its cap
        if cohorts is not None:
            assert pick_cohort is not None
            cohort = pick_cohort({cohorts[i] for i in eligible})
            eligible = [i for i in eligible if cohorts[i] == cohort]
        best, best_score = -1, -1.0
        for i in eligible:
            task = candidates[i][1]
            score = scores[i] if seen_now is None else scores[i] / (1 + seen_now[task])
            if score > best_score:
                best, best_score = i, score
        sender, task = candidates[best]
        chosen.append(best)
        per_sender[sender] += 1
        if networks is not None:
            per_network[networks[best]] += 1
        if seen_now is not None:
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
