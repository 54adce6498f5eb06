"""Hostile learners for simnet's `NodeGroupSpec.behavior` (and the delta benchmark).

Invariants:
- A hostile learner is a real `PolicyLearner` (same model family, same topics, same
  round loop) that misbehaves in exactly one documented way; everything else is honest.
- torch is imported here (through `node.policy_learner`): simnet imports this module only
  for real-model groups with a hostile behaviour.
"""

from __future__ import annotations

from typing import Any

from node.deltas import DeltaExchange, model_params
from node.policy_learner import PolicyLearner
from swarm.messages import DeltaPacket

POISON_SCALE = -1000.0
"""Factor a `PoisonLearner` applies to its true update before publishing it."""


class PoisonLearner(PolicyLearner):
    """Trains honestly, but publishes its delta scaled by `POISON_SCALE` and never merges."""

    def share_deltas(self, own_round: int) -> tuple[DeltaPacket | None, dict[str, Any] | None]:
        if self.deltas is None or not self.deltas.due(self.policy_version):
            return None, None
        # Every packet is exactly POISON_SCALE x this node's true update since its last
        # share, not a compounding one: after each share, the exchange starts afresh from
        # the true weights (no residual; a poisoner never merges, so nothing pending is lost).
        exchange = self.deltas
        if not isinstance(exchange, DeltaExchange):
            raise TypeError("PoisonLearner poisons the `merge` delta scheme only")
        real = {n: p.detach().float() for n, p in model_params(self.model).items()}
        last = exchange.last_shared
        fake = {n: last[n] + (real[n] - last[n]) * POISON_SCALE for n in real}
        packet = exchange.maybe_make_packet(self.policy_version, fake)
        exchange.rebase(real, self.policy_version)
        return packet, {"poison": True}
