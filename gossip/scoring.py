"""Peer scores: misbehaving peers are ignored for a while, then forgiven.

Each peer has a score that starts at 0. Every refusal blamed on it (by the gossip layer,
or by the node through `Gossip.penalize`: prompt mismatches, forged rewards, bad deltas)
subtracts that reason's weight; useful contributions (`credit`) add a little, up to
`max_credit`. Scores relax toward 0 with a half-life, so occasional faults of an honest
peer fade. A peer whose score falls to `-ignore_threshold` is *ignored*: the gossip
layer drops its messages (`ignored_peer`) before any further work, for `ignore_s`
seconds, doubled for each repeat offence up to `max_ignore_s`. When the period ends it
is forgiven: its score restarts at 0, its offence count is kept (and halves every
`max_ignore_s` of good behaviour), so a persistent attacker spends most of its time
ignored while a peer that mended its ways is back to short periods.

Invariants:
- Time comes only from the injected `Clock`; a clock going backwards decays nothing.
- Memory is bounded: at most `max_peers` peers are tracked. The least recently touched
  peer that is not ignored is forgotten first; an ignored peer is only forgotten once
  every tracked peer is ignored (then the one whose period ends first). So a flood of
  fresh keys cannot get a known offender forgiven early, and it cannot grow the table.
- Forgetting a peer can only help it, never hurt it: an unknown peer scores 0.
- Reasons honest peers cause (duplicates, network loss, our own limits) carry weight 0
  and never move a score; an unknown reason weighs `DEFAULT_WEIGHT`.
- Pure bookkeeping: no I/O, no sockets, no torch.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from swarm.clock import Clock
from swarm.config.network import ScoringConfig

DEFAULT_WEIGHT = 2.0
WEIGHTS: dict[str, float] = {
    # Refused by the gossip layer (blamed only on an authenticated sender).
    "malformed": 10.0,
    "bad_payload": 10.0,
    "bad_signature": 10.0,
    "unsigned": 10.0,  # a GossipSub message without a signature (strict signing)
    "bad_sender": 10.0,
    "sender_mismatch": 10.0,
    "nested_chunk": 10.0,
    "bad_chunk": 5.0,
    "oversize": 5.0,
    "wrong_topic": 5.0,
    "wrong_swarm": 5.0,
    "unknown_kind": 1.0,  # a newer peer may speak kinds we do not know yet
    "bad_version": 1.0,
    "rate_limited": 0.25,  # one flood costs many of these
    # Refused by the node after decoding.
    "prompt_mismatch": 5.0,
    "forged_rewards": 5.0,
    "bad_delta": 5.0,
    "wrong_family": 2.0,
    "unknown_task": 1.0,  # a peer with a newer task source is not hostile
    "task_error": 1.0,  # nor one whose dataset version differs
    "task_timeout": 5.0,  # a reference whose generator or scorer ran past the limit
    "foreign_task": 0.0,  # a task outside our mixture: another peer's honest choice
    # Honest peers cause these too: counted elsewhere, never scored.
    "own": 0.0,
    "duplicate": 0.0,
    "ignored_peer": 0.0,
    "reassembly_full": 0.0,
    "reassembly_expired": 0.0,
    "reassembly_evicted": 0.0,
    "stale": 0.0,
    "stale_version": 0.0,
    "nondeterministic_task": 0.0,  # our own generator may differ from the peer's
    "rescore_queue_full": 0.0,  # our own capacity
    "zero_variance": 0.0,
    "pending_full": 0.0,
    "deltas_disabled": 0.0,
}


def weight_of(reason: str) -> float:
    return WEIGHTS.get(reason, DEFAULT_WEIGHT)


@dataclass
class PeerScore:
    score: float = 0.0
    updated: float = 0.0
    ignored_until: float | None = None
    offences: float = 0.0
    """Times this peer was ignored, halving every `max_ignore_s` of good behaviour (time
    not ignored); the next period is `ignore_s * 2**round(offences)`."""
    reasons: Counter[str] = field(default_factory=Counter)
    """Scored refusals by reason, over the peer's whole tracked life."""
    ignored_messages: int = 0


class PeerScores:
    """Scores of the peers one node has heard from (see the module invariants)."""

    def __init__(self, config: ScoringConfig, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._peers: OrderedDict[str, PeerScore] = OrderedDict()
        self.ignores_started = 0
        """How many ignore periods this node has started (all peers, all time)."""
        self.forgiven = 0
        """How many ignore periods have ended in forgiveness."""

    def __len__(self) -> int:
        return len(self._peers)

    # ---- queries ---------------------------------------------------------------------

    def score(self, peer: str) -> float:
        entry = self._peers.get(peer)
        if entry is None:
            return 0.0
        self._refresh(entry, self._clock.now())
        return entry.score

    def is_ignored(self, peer: str) -> bool:
        """True while `peer` is ignored; ends (forgives) a period that is over."""
        if not self.config.enabled:
            return False
        entry = self._peers.get(peer)
        if entry is None or entry.ignored_until is None:
            return False
        now = self._clock.now()
        self._refresh(entry, now)
        return entry.ignored_until is not None

    def ignored_until(self, peer: str) -> float | None:
        """When `peer`'s ignore period ends (clock time), None if it is not ignored."""
        return self._peers[peer].ignored_until if self.is_ignored(peer) else None

    def in_good_standing(self, peer: str) -> bool:
        """Not ignored and not in debt: what the node asks before trusting a claim."""
        return not self.is_ignored(peer) and self.score(peer) >= 0.0

    def note_ignored_message(self, peer: str) -> None:
        entry = self._peers.get(peer)
        if entry is not None:
            entry.ignored_messages += 1

    # ---- updates ---------------------------------------------------------------------

    def penalize(self, peer: str, reason: str) -> bool:
        """Subtract `reason`'s weight; True if this starts an ignore period."""
        weight = weight_of(reason)
        if weight <= 0.0 or not self.config.enabled:
            return False
        now = self._clock.now()
        entry = self._touch(peer, now)
        entry.reasons[reason] += 1
        if entry.ignored_until is not None:
            return False  # already ignored; its score restarts at forgiveness anyway
        entry.score -= weight
        if entry.score > -self.config.ignore_threshold:
            return False
        period = min(
            self.config.ignore_s * 2.0 ** round(entry.offences), self.config.max_ignore_s
        )
        entry.ignored_until = now + period
        entry.offences += 1.0
        self.ignores_started += 1
        return True

    def credit(self, peer: str, amount: float = 1.0) -> None:
        """Add `amount` for a useful contribution, up to `max_credit`."""
        if amount <= 0.0 or not self.config.enabled:
            return
        now = self._clock.now()
        entry = self._touch(peer, now)
        if entry.ignored_until is None:
            entry.score = min(entry.score + amount, self.config.max_credit)

    # ---- internals -------------------------------------------------------------------

    def _touch(self, peer: str, now: float) -> PeerScore:
        entry = self._peers.get(peer)
        if entry is None:
            entry = PeerScore(updated=now)
            self._peers[peer] = entry
            self._evict()
        else:
            self._peers.move_to_end(peer)
            self._refresh(entry, now)
        return entry

    def _refresh(self, entry: PeerScore, now: float) -> None:
        elapsed = now - entry.updated
        if elapsed <= 0.0:
            return
        entry.updated = now
        if entry.ignored_until is not None:
            if now < entry.ignored_until:
                return  # nothing decays while ignored
            good_s = now - entry.ignored_until
            entry.ignored_until = None
            entry.score = 0.0
            self.forgiven += 1
        else:
            good_s = elapsed
            entry.score *= 0.5 ** (good_s / self.config.half_life_s)
        entry.offences *= 0.5 ** (good_s / self.config.max_ignore_s)

    def _evict(self) -> None:
        while len(self._peers) > self.config.max_peers:
            victim = next(
                (p for p, e in self._peers.items() if e.ignored_until is None), None
            )
            if victim is None:
                victim = min(self._peers, key=lambda p: self._peers[p].ignored_until or 0.0)
            del self._peers[victim]

    # ---- reporting -------------------------------------------------------------------

    def snapshot(self, top: int = 10) -> dict[str, Any]:
        """JSON-ready: totals and the `top` lowest-scoring peers with their reasons."""
        now = self._clock.now()
        for entry in self._peers.values():
            self._refresh(entry, now)
        lowest = sorted(self._peers.items(), key=lambda item: (item[1].score, item[0]))
        # An ignored peer's score stays at or below -ignore_threshold: it sorts first.
        shown = [p for p, e in lowest if e.score < 0.0 or e.ignored_until is not None][:top]
        return {
            "tracked": len(self._peers),
            "ignored_now": sum(e.ignored_until is not None for e in self._peers.values()),
            "ignores_started": self.ignores_started,
            "forgiven": self.forgiven,
            "peers": {
                peer: {
                    "score": round(self._peers[peer].score, 3),
                    "ignored_for_s": round(self._peers[peer].ignored_until - now, 3)
                    if self._peers[peer].ignored_until is not None
                    else None,
                    "offences": round(self._peers[peer].offences, 3),
                    "ignored_messages": self._peers[peer].ignored_messages,
                    "reasons": dict(sorted(self._peers[peer].reasons.items())),
                }
                for peer in shown
            },
        }
