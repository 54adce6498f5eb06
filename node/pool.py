"""The rollout pool: external groups waiting to be trained on.

Invariants:
- Bounded: at most `max_groups` entries and `max_bytes` of text, logprobs and token ids
  (4 bytes a token each); when full, an entry of the sender holding the most entries
  goes (the stalest of theirs; ties: the newest arrival), so a flooding sender pushes
  out its own groups before anyone else's, and a crowd of fresh (sybil) keys cannot
  push out the groups already held.
- Only groups that were re-scored locally enter (the caller re-scores; advisory rewards
  from peers are never stored as training rewards), and zero-variance groups never enter.
- Staleness is `swarm.staleness.StalenessRule`: an entry is usable for `max_staleness`
  of our own rounds after it arrived (`arrival_round`), and while its group's policy
  version is within `max_version_lag` of what its sender currently runs (the caller
  passes `sender_version`, read from the sender's newest envelope). `evict_stale`
  removes every entry that is no longer usable; `select` only draws usable ones.
- `select` draws without replacement, with at most `per_sender_cap` entries per sender;
  a drawn entry leaves the pool (used once). `selection = "uniform"`: uniformly at random
  from a seeded RNG. `"signal"`: highest expected learning signal first
  (`node.selection.select_by_signal`: reward spread times the task's novelty against
  what this node trained in its last `novelty_window` rounds, `trained` plus earlier
  selections, times the entry's trainable share), ties in the same seeded random order.
  The memory of recent tasks is not checkpointed (after a restart every task is novel
  again).
- `choose` is `select` as the round trains it: `ExternalGroup`s with the rewards we
  computed, each with its age and version lag at selection (for the round's record).
- Sybil bound (`node.trust`), under both rules: every accepted group notes its sender's
  first sighting; with `cohort_rounds` > 0 each pick of a `select` first draws an
  arrival cohort (weighted by its age, from the pool's seeded RNG), then the rule picks
  within it; `senders_first` spreads picks over senders first, `networks_first` over
  the networks the transport saw senders at (`node.trust`). The sightings are
  checkpointed with the pool cursor.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from node.learner import ExternalGroup
from node.selection import RecentTasks, draw_slots, select_by_signal
from node.trust import TrustBook
from swarm.config import SapoConfig
from swarm.messages import RolloutGroup
from swarm.staleness import StalenessRule, age, version_lag

SenderVersion = Callable[[str], int]
"""sender -> the policy version that sender currently runs."""


@dataclass(frozen=True, eq=False)
class PoolEntry:
    """One held group. Compared by identity: `arrival` is unique per pool, so no two
    entries were ever equal field by field, and `list.remove` need not compare groups."""

    sender: str
    arrival_round: int
    """Our `rounds_done` when the group arrived."""
    arrival_time: float
    """Our clock when the group arrived (for the optional `max_age_s`)."""
    group: RolloutGroup
    rewards: tuple[float, ...]  # re-scored locally
    size_bytes: int
    arrival: int
    trainable_share: float = 1.0
    """Share of its GRPO signal the trainer will train on (`node.selection.trainable_share`)."""


@dataclass(frozen=True)
class Chosen:
    """A round's peers' groups and, per group, its age and version lag at selection."""

    external: list[ExternalGroup]
    ages: list[int]
    lags: list[int]


@dataclass
class RolloutPool:
    max_groups: int
    max_bytes: int
    rule: StalenessRule
    per_sender_cap: int
    seed: int = 0
    selection: Literal["uniform", "signal"] = "uniform"
    novelty_window: int = 8
    cohort_rounds: int = 0
    """Arrival cohorts' window in own rounds (`node.trust`; 0: one cohort, no bound)."""
    cohort_ramp_rounds: int = 32
    """Rounds over which a new cohort's draw weight grows to an established one's."""
    cohort_weight: str = "one"
    """How a grown cohort weighs (`node.trust.WEIGHTINGS`)."""
    cohort_older_share: float = 0.0
    """Earned weights: a cohort's cap as a share of all older cohorts (0: none)."""
    senders_first: bool = False
    """Spread each `select`'s picks over senders before any sender gets a second."""
    networks_first: bool = False
    """Spread each `select`'s picks over senders' networks (`node.trust`) first."""
    entries: list[PoolEntry] = field(default_factory=list)
    bytes_held: int = 0
    evicted: Counter = field(default_factory=Counter)
    _arrivals: int = 0
    _rng: random.Random = field(init=False)

    @classmethod
    def for_node(cls, sapo: SapoConfig, rule: StalenessRule, seed: int) -> RolloutPool:
        """The pool a node's `[sapo]` settings ask for."""
        return cls(
            max_groups=sapo.pool_max_groups,
            max_bytes=sapo.pool_max_bytes,
            rule=rule,
            per_sender_cap=sapo.per_sender_cap,
            seed=seed,
            selection=sapo.external_selection,
            novelty_window=sapo.novelty_window,
            cohort_rounds=sapo.cohort_rounds,
            cohort_ramp_rounds=sapo.cohort_ramp_rounds,
            cohort_weight=sapo.cohort_weight,
            cohort_older_share=sapo.cohort_older_share,
            senders_first=sapo.senders_first,
            networks_first=sapo.networks_first,
        )

    def __post_init__(self) -> None:
        if self.selection not in ("uniform", "signal"):
            raise ValueError(f"selection must be 'uniform' or 'signal', not {self.selection!r}")
        self._rng = random.Random(self.seed)
        self.recent = RecentTasks(self.novelty_window)
        """Tasks (prompts) this node trained lately, for `signal` selection."""
        self.trust = TrustBook(
            self.cohort_rounds,
            self.cohort_ramp_rounds,
            weighting=self.cohort_weight,
            older_share=self.cohort_older_share,
        )
        """When this node first accepted each sender (`node.trust`): every group
        accepted here notes its sender; `node.intake` reports blamed refusals."""

    def __len__(self) -> int:
        return len(self.entries)

    def add(
        self,
        sender: str,
        group: RolloutGroup,
        rewards: tuple[float, ...],
        *,
        own_round: int,
        sender_version: int,
        now: float,
        trainable_share: float = 1.0,
        network: str | None = None,
    ) -> str | None:
        """Insert a re-scored group that arrived now. Returns None, or why it was refused
        (counted in `evicted` too): `stale_version` (its version already lags what its
        sender runs too far) or `too_large` (bigger than the whole pool).
        `trainable_share` weighs it in `signal` selection; `network`: where the transport
        sees its sender now (`node.trust`)."""
        if version_lag(sender_version, group.policy_version) > self.rule.max_version_lag:
            self.evicted["stale_on_arrival"] += 1
            return "stale_version"
        size = len(group.prompt) + sum(map(len, group.completions))
        size += 4 * sum(map(len, group.logprobs))  # as on the wire (float32)
        size += 4 * sum(map(len, group.token_ids))  # as on the wire (uint32)
        if size > self.max_bytes:
            self.evicted["too_large"] += 1
            return "too_large"
        self._arrivals += 1
        self.trust.note_verified(sender, own_round)
        self.trust.note_network(sender, network)
        self.entries.append(
            PoolEntry(sender, own_round, now, group, rewards, size, self._arrivals, trainable_share)
        )
        self.bytes_held += size
        while len(self.entries) > self.max_groups or self.bytes_held > self.max_bytes:
            held = Counter(e.sender for e in self.entries)
            most = max(held.values())
            victim = min(
                (e for e in self.entries if held[e.sender] == most),
                key=lambda e: (e.group.policy_version, -e.arrival),
            )
            self._remove(victim)
            self.evicted["capacity"] += 1
        return None

    def usable(
        self, entry: PoolEntry, own_round: int, sender_version: SenderVersion, now: float
    ) -> bool:
        return self.rule.usable(
            own_round=own_round,
            arrival_round=entry.arrival_round,
            item_version=entry.group.policy_version,
            sender_version=sender_version(entry.sender),
            now=now,
            arrival_time=entry.arrival_time,
        )

    def _remove(self, entry: PoolEntry) -> None:
        self.entries.remove(entry)
        self.bytes_held -= entry.size_bytes

    def evict_stale(self, own_round: int, sender_version: SenderVersion, now: float) -> int:
        """Remove every entry `usable` refuses (asking `sender_version` once per sender:
        it must not change during the call); keeps the others in order."""
        versions: dict[str, int] = {}
        usable = self.rule.usable
        keep: list[PoolEntry] = []
        for entry in self.entries:
            version = versions.get(entry.sender)
            if version is None:
                version = versions[entry.sender] = sender_version(entry.sender)
            if usable(
                own_round=own_round,
                arrival_round=entry.arrival_round,
                item_version=entry.group.policy_version,
                sender_version=version,
                now=now,
                arrival_time=entry.arrival_time,
            ):
                keep.append(entry)
            else:
                self.bytes_held -= entry.size_bytes
        stale = len(self.entries) - len(keep)
        self.entries[:] = keep
        self.evicted["stale"] += stale
        return stale

    def select(
        self,
        count: int,
        own_round: int,
        sender_version: SenderVersion,
        now: float,
        trained: Sequence[str] = (),
    ) -> list[PoolEntry]:
        """Draw up to `count` usable entries, at most `per_sender_cap` per sender.
        `trained`: prompts of this round's own training batch (recent tasks for `signal`
        selection; the chosen entries' prompts are noted too)."""
        self.evict_stale(own_round, sender_version, now)
        self.recent.note(own_round, trained)
        candidates = list(self.entries)
        self._rng.shuffle(candidates)
        cohorts = None
        if self.cohort_rounds > 0:
            cohorts = [self.trust.cohort(e.sender) for e in candidates]
        bounds = {
            "cohorts": cohorts,
            "pick_cohort": lambda found: self.trust.draw_cohort(found, own_round, self._rng),
            "senders_first": self.senders_first,
            "networks": (
                [self.trust.network(e.sender) for e in candidates] if self.networks_first else None
            ),
        }
        if self.selection == "signal":
            picked = select_by_signal(
                [(e.sender, e.group.prompt, e.rewards) for e in candidates],
                count,
                self.per_sender_cap,
                self.recent.counts(own_round),
                [e.trainable_share for e in candidates],
                **bounds,
            )
        else:  # equal scores: the shuffled order decides
            picked = draw_slots(
                [(e.sender, e.group.prompt) for e in candidates],
                [1.0] * len(candidates),
                count,
                self.per_sender_cap,
                None,
                **bounds,
            )
        chosen = [candidates[i] for i in picked]
        for entry in chosen:
            self._remove(entry)
        self.recent.note(own_round, [e.group.prompt for e in chosen])
        return chosen

    def choose(
        self,
        count: int,
        own_round: int,
        sender_version: SenderVersion,
        now: float,
        trained: Sequence[str] = (),
    ) -> Chosen:
        """`select`, as groups to train on, with each one's age (our rounds since it
        arrived) and version lag (versions behind its sender) at selection: the round's
        training lets senders move on meanwhile."""
        entries = self.select(count, own_round, sender_version, now, trained)
        return Chosen(
            [ExternalGroup.of(e.sender, e.group, e.rewards) for e in entries],
            [age(own_round, e.arrival_round) for e in entries],
            [version_lag(sender_version(e.sender), e.group.policy_version) for e in entries],
        )

    def state_dict(self) -> dict:
        """The pool cursor for checkpoints: RNG state and arrival counter (entries are
        not persisted: after a restart they would be stale or re-sent by peers)."""
        version, internal, gauss = self._rng.getstate()
        return {
            "rng": [version, list(internal), gauss],
            "arrivals": self._arrivals,
            "trust": self.trust.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._arrivals = int(state["arrivals"])
        self.trust.load_state_dict(state.get("trust", {}))  # absent before trust existed
