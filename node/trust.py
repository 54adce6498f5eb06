"""Arrival cohorts: what keeps the number of keys from deciding what a node learns from.

A key costs nothing, so a node cannot let the number of keys decide who fills its J
external slots: 8 Sybil keys sending bait that passes every check took every slot of a
4/4 signal node (`docs/sapo_grid.md`). Nothing in a bait group is provably wrong, and a
sender's effect on this node's reward is far below what a node can measure (at the tiny
model's scale one group moves a round's reward by ~3e-4 against a round-to-round noise of
~0.05: `docs/sybil.md`). What a node does know, from its own records alone, is *when* it
first heard of each sender. Keys minted together and sent together arrive together; so:

- A sender's *cohort* is the window of `cohort_rounds` own rounds in which this node
  first accepted a group of it, counted from the first sender it ever accepted.
  Honest nodes that start together form one cohort; a wave of 8 or 800 fresh keys,
  another.
- Each external slot goes to a cohort drawn at random with weight
  `min(1, (age + 1) / ramp_rounds)` (`age`: own rounds since the cohort's window
  opened), among the cohorts with a usable group; within the cohort, the selection rule
  decides as before (`node.selection.draw_slots`). So a wave of fresh keys, however many,
  gets a share that starts near 1/`ramp_rounds` of an established cohort's and grows to
  an equal one over `ramp_rounds` rounds; a genuine newcomer is its own cohort and is
  treated the same. With one cohort (a swarm that started together, or a node alone
  with its first peers) nothing changes.
- With `weighting = "earned"` a cohort's weight is instead
  `min(active senders, (age + 1) / ramp_rounds, the largest weight of an older cohort)`:
  it earns one sender's weight per `ramp_rounds` of its age, up to the number of its
  senders with a group accepted in our last `ramp_rounds` rounds, and never weighs more
  than a cohort that was here before it. The honest peers that started together then
  weigh as the people they are once they have been here long enough, a lone newcomer
  reaches one sender's weight (a fair share, where `"one"` gives it a whole cohort's),
  and a wave of keys is bounded by its age, not its number: at our round t a wave that
  arrived at t0 weighs at most (t - t0 + 1) / ramp_rounds against the founders'
  (t + 1) / ramp_rounds, and in the long run as much as they do (as with `"one"`),
  however many keys it holds. So its share is at no round larger than under `"one"`.
  With `older_share` (> 0, earned only) a cohort also weighs at most that share of all
  older cohorts' weights together: at 0.5 a wave never has more than a third of the
  draw against the founders (a half: up to a half), while a lone newcomer, at most one
  sender's weight, is not held back once the founders weigh 2 or more.
- Each sender also has a *network*: where the transport first saw a direct connection
  to it (`Transport.peer_network`: an IPv4 /24, an IPv6 /48, read from the connection,
  never from the peer), or `UNLOCATED`, one network for every sender never seen
  directly. Keys minted by one operator run from one machine or subnet however many
  they are, and arrival cannot tell apart keys there from the start; with
  `sapo.networks_first` the selection spreads its picks over networks before senders
  (`node.selection.draw_slots`), so such keys take one slot a round while another
  network offers a group. An attacker pays with address blocks (or the shared
  unlocated network), not keys.
- A refusal blamed on a sender (forged rewards, a mismatched prompt: what `node.intake`
  blames) moves it to the cohort of the current round: its age starts again.

On only with `sapo.cohort_rounds > 0` (off by default: windows count this node's
rounds, so a node much faster than an honest peer counts that peer a newcomer too).

What it does not do: tell apart keys that arrived together with the honest peers (they
share the honest cohort), nor an attacker that spreads its keys over many windows (each
becomes a cohort of its own once old enough): time is the only cost it imposes.

Invariants: pure bookkeeping of this node's own observations (no peer's word enters);
bounded (`max_senders`: the least recently active sender is forgotten first, so a flood
of fresh keys forgets other fresh keys before the senders active every round);
deterministic given the caller's RNG; persisted with the pool's state, so that a restart
keeps every sender's cohort.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from swarm.bounded import BoundedDict

UNLOCATED = "unlocated"
"""The network of every sender never seen over a direct connection: they share one."""

MAX_SENDERS = 4096
"""Senders remembered (as the peer table's cap)."""

WEIGHTINGS = ("one", "earned")
"""How a grown cohort weighs: as one sender (`one`) or as its active senders, earned one
per `ramp_rounds` of its age (`earned`)."""


@dataclass
class SenderHistory:
    first_round: int
    """Our round when its first accepted group arrived (or its last blame)."""
    last_round: int
    """Our last round with an accepted group of it."""
    network: str | None = None
    """Where the transport first saw a direct connection to it (`Transport.peer_network`)."""


class TrustBook:
    """Per-sender first sightings and the cohorts they make (see the module doc)."""

    def __init__(
        self,
        cohort_rounds: int,
        ramp_rounds: int = 32,
        max_senders: int = MAX_SENDERS,
        weighting: str = "one",
        older_share: float = 0.0,
    ) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, not {weighting!r}")
        if older_share < 0 or (older_share > 0 and weighting != "earned"):
            raise ValueError("older_share must be >= 0, and > 0 only with earned weights")
        if cohort_rounds < 0:
            raise ValueError("cohort_rounds must be >= 0")
        if ramp_rounds < 1:
            raise ValueError("ramp_rounds must be >= 1")
        if max_senders < 1:
            raise ValueError("max_senders must be >= 1")
        self.cohort_rounds = cohort_rounds
        self.ramp_rounds = ramp_rounds
        self.max_senders = max_senders
        self.weighting = weighting
        self.older_share = older_share
        self._senders: BoundedDict[str, SenderHistory] = BoundedDict(max_senders)
        self._origin: int | None = None
        """Our round when we accepted the first group of anyone (cohort 0 opens then)."""
        self._latest = 0
        """Our latest round with an accepted group (what a blame counts as now)."""

    def __len__(self) -> int:
        return len(self._senders)

    def history(self, sender: str) -> SenderHistory | None:
        return self._senders.get(sender)

    def note_verified(self, sender: str, own_round: int) -> None:
        """A group of `sender` passed our checks in our round `own_round`."""
        if self._origin is None:
            self._origin = own_round
        self._latest = max(self._latest, own_round)
        history = self._senders.get(sender)
        if history is None:
            history = SenderHistory(own_round, own_round)
        history.last_round = max(history.last_round, own_round)
        self._senders[sender] = history  # the newest; may forget the least recently active

    def note_network(self, sender: str, network: str | None) -> None:
        """The transport sees `sender` at `network` now. Its first network is kept (a key
        cannot leave the network it was first seen at by connecting from elsewhere)."""
        history = self._senders.get(sender)
        if history is not None and history.network is None and network is not None:
            history.network = network

    def network(self, sender: str) -> str:
        """The sender's network (`UNLOCATED` if never seen over a direct connection)."""
        history = self._senders.get(sender)
        return UNLOCATED if history is None or history.network is None else history.network

    def note_blamed(self, sender: str) -> None:
        """`sender` sent something our checks blame on it: it joins the current cohort
        (that of our latest round with an accepted group)."""
        history = self._senders.get(sender)
        if history is not None:
            history.first_round = max(history.first_round, self._latest)

    def cohort(self, sender: str) -> int:
        """The sender's cohort (0: the first; a sender never accepted: the newest)."""
        history = self._senders.get(sender)
        if self.cohort_rounds == 0 or self._origin is None or history is None:
            return 0 if self.cohort_rounds == 0 or self._origin is None else 1 << 30
        return (history.first_round - self._origin) // self.cohort_rounds

    def weight(self, cohort: int, own_round: int, active_senders: int = 1) -> float:
        """A cohort's draw weight at our round `own_round` by its own age and size: in
        (0, 1] with `one`; in (0, max(1, active_senders)] with `earned` (before the cap
        by older cohorts that `weights` applies; see the module doc)."""
        if self.cohort_rounds == 0 or self._origin is None:
            return 1.0
        opened = self._origin + cohort * self.cohort_rounds
        age = max(own_round - opened, 0)
        cap = max(1, active_senders) if self.weighting == "earned" else 1
        return min(float(cap), (age + 1) / self.ramp_rounds)

    def weights(self, cohorts: Iterable[int], own_round: int) -> dict[int, float]:
        """The draw weights of `cohorts` at our round `own_round` (see the module doc):
        with `earned`, each capped by the largest weight of an older cohort with active
        senders (whether or not it is among `cohorts`), and with `older_share` by that
        share of all older cohorts' weights together."""
        wanted = set(cohorts)
        if self.weighting != "earned":
            return {c: self.weight(c, own_round) for c in wanted}
        active = self.active_senders(own_round)
        out: dict[int, float] = {}
        older = older_total = 0.0
        for c in sorted(wanted | set(active)):
            w = self.weight(c, own_round, active[c])
            if older > 0:
                w = min(w, older)
            if self.older_share > 0 and older_total > 0:
                w = min(w, self.older_share * older_total)
            if c in wanted:
                out[c] = w
            older = max(older, w)
            older_total += w
        return out

    def active_senders(self, own_round: int) -> Counter[int]:
        """Per cohort, its senders with a group accepted in our last `ramp_rounds` rounds."""
        since = own_round - self.ramp_rounds
        return Counter(
            self.cohort(sender) for sender, h in self._senders.items() if h.last_round >= since
        )

    def draw_cohort(self, cohorts: Iterable[int], own_round: int, rng: random.Random) -> int:
        """One of `cohorts` (non-empty), drawn with `weight` (sorted first: the draw
        depends only on the set and the RNG)."""
        ordered = sorted(set(cohorts))
        if len(ordered) == 1:
            return ordered[0]
        weights = self.weights(ordered, own_round)
        return rng.choices(ordered, weights=[weights[c] for c in ordered])[0]

    def state_dict(self) -> dict[str, Any]:
        return {
            "origin": self._origin,
            "latest": self._latest,
            "senders": [
                [s, h.first_round, h.last_round, h.network] for s, h in self._senders.items()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._senders.clear()
        origin = state.get("origin")
        self._origin = None if origin is None else int(origin)
        self._latest = int(state.get("latest", 0))
        for row in state.get("senders", [])[-self.max_senders :]:
            sender, first, last = row[:3]
            network = row[3] if len(row) > 3 and row[3] is not None else None
            self._senders[str(sender)] = SenderHistory(
                int(first), int(last), None if network is None else str(network)
            )
