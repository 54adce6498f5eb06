"""Trust a node earns for a sender: what decides how much of its learning new keys steer.

A key costs nothing, so the number of keys must not decide who fills a node's J external
slots: 8 Sybil keys sending bait that passes every check took every slot of a 4/4 signal
node (`docs/sapo_grid.md`). This module keeps, per sender, only what this node measured
itself, and turns it into one question: is this sender *established* here yet?

- `SenderHistory`: the own round of the sender's first verified group here, the number of
  distinct own rounds in which it delivered verified groups (`active_rounds`), and the
  last such round.
- A sender is established once `active_rounds >= earn_rounds`: it kept delivering groups
  that passed this node's re-scoring for that many of this node's rounds. Until then it
  is a *newcomer*, and all newcomers together share `newcomer_slots` of the J slots per
  round (`node.selection.select_by_signal`, `node.pool.RolloutPool.select`): 8 or 800
  fresh keys get the same budget as one, and a genuine newcomer still gets slots from its
  first round (it competes only with other newcomers for them).
- A blamed refusal (a forged reward claim, a mismatched prompt: what `node.intake` blames
  on the sender) restarts the sender's count: trust is lost faster than it is earned.

Invariants: pure bookkeeping of this node's own observations (no peer's word enters);
bounded (`max_senders`: the least recently active sender is forgotten first, so a flood
of fresh keys forgets other fresh keys before established ones, which are active every
round); deterministic; persisted with the pool's state so that a restart does not make
every peer a newcomer again.

What it does not do: tell apart keys that arrived together with the honest peers and keep
behaving (tenure cannot), or measure the effect a sender's groups had on this node's
reward (at the tiny model's scale one group moves the round's reward by ~3e-4 against a
round-to-round noise of ~0.05: `docs/sybil.md`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_SENDERS = 4096
"""Senders remembered (as the peer table's cap)."""


@dataclass
class SenderHistory:
    first_round: int
    """Our round when its first verified group arrived."""
    active_rounds: int = 0
    """Distinct own rounds with at least one verified group of it (since its last blame)."""
    last_round: int = -1
    """Our last round with a verified group of it."""


class TrustBook:
    """Per-sender histories and the established / newcomer split (see the module doc)."""

    def __init__(self, earn_rounds: int, max_senders: int = MAX_SENDERS) -> None:
        if earn_rounds < 0:
            raise ValueError("earn_rounds must be >= 0")
        if max_senders < 1:
            raise ValueError("max_senders must be >= 1")
        self.earn_rounds = earn_rounds
        self.max_senders = max_senders
        self._senders: OrderedDict[str, SenderHistory] = OrderedDict()

    def __len__(self) -> int:
        return len(self._senders)

    def history(self, sender: str) -> SenderHistory | None:
        return self._senders.get(sender)

    def note_verified(self, sender: str, own_round: int) -> None:
        """A group of `sender` passed our checks in our round `own_round`."""
        history = self._senders.get(sender)
        if history is None:
            history = self._senders[sender] = SenderHistory(first_round=own_round)
            while len(self._senders) > self.max_senders:
                self._senders.popitem(last=False)
        if own_round != history.last_round:
            history.active_rounds += 1
            history.last_round = own_round
        self._senders.move_to_end(sender)

    def note_blamed(self, sender: str) -> None:
        """`sender` sent something our checks blame on it: it earns trust from zero again."""
        history = self._senders.get(sender)
        if history is not None:
            history.active_rounds = 0
            history.last_round = -1

    def established(self, sender: str) -> bool:
        """True once `sender` delivered verified groups in `earn_rounds` of our rounds."""
        if self.earn_rounds == 0:
            return True
        history = self._senders.get(sender)
        return history is not None and history.active_rounds >= self.earn_rounds

    def state_dict(self) -> dict[str, Any]:
        return {
            "senders": [
                [sender, h.first_round, h.active_rounds, h.last_round]
                for sender, h in self._senders.items()
            ]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._senders.clear()
        for sender, first, active, last in state.get("senders", [])[-self.max_senders :]:
            self._senders[str(sender)] = SenderHistory(int(first), int(active), int(last))
