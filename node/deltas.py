"""The weight-delta exchange of one node: when to share, what to accept, how to merge.

Only what the node trains itself is shared. The exchange keeps `theta_last_shared`
(float32 copies of the parameters as of the last share) and the error-feedback residual:
- A share (every `every_k_steps` optimizer steps) compresses
  `theta_now - theta_last_shared` plus the residual, keeps as the new residual what the
  packet did not carry, and sets `theta_last_shared = theta_now`. It must be `theta_now`
  and not what peers reconstruct (`theta_last_shared + transmitted`): the residual
  already carries the untransmitted part, and counting it in both places would send it
  twice. (The two are equivalent ways to do error feedback; this one keeps the residual
  explicit so it can be checkpointed and inspected.)
- A merge adds `mixing_weight * aggregate(peer deltas)` to the parameters and adds the
  change it actually made to `theta_last_shared` as well, so the next share does not
  echo peers' deltas back to them as ours: each share is this node's own training only.
  Merge at share steps (`due`), not every round: the robust statistics need several
  peers' packets at once (a merge of one packet is just that packet, clipped).

Peer packets (`receive`) are refused by raising `node.rescore.Refused(reason)`:
`wrong_family`, `wrong_scheme` (a packet of another `[deltas] scheme`, such as a
CHOCO keyframe, which holds weights, not a delta), `stale` (from an older policy
version of that sender than the packet already held; not the sender's fault),
`pending_full` (not the sender's fault), or the codec's `bad_delta` / `wrong_shape` /
`non_finite`. At most one packet per sender is held (its newest version); pending
packets are dropped at each merge, used or not, and are not checkpointed. Staleness is
measured locally (`swarm.staleness`): a packet merges only within `max_staleness` of
our own rounds after it arrived.

Threads: `receive` may run in one worker thread while `merge_into` runs in another
(`merge_into` swaps the pending map out in one rebinding, and `receive` reads the map
once into a local, so a swap in the middle of `receive` cannot make it look up a sender
that is gone); `maybe_make_packet`, `merge_into` and training change or read the
parameters and must not overlap one another.

A node whose every peer sends poison keeps training: NaN/Inf packets are refused at the
codec, and finite poison is bounded by norm clipping (capped by this node's own update
norm) and the robust aggregate, then scaled by `mixing_weight`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from node.rescore import Refused
from policy.aggregation import AggregateStats, aggregate_with_stats, global_norm
from policy.compression import ENCODINGS, CompressedDelta, compress, decompress
from policy.delta_codec import DeltaCodecError, decode_packet, encode_packet
from swarm.config.deltas import DeltasConfig
from swarm.messages import DeltaPacket
from swarm.staleness import is_fresh

_RESIDUAL = "residual/"
_LAST_SHARED = "last_shared/"
_LAST_STEP = "meta/last_step"
_OWN_NORM = "meta/own_norm"


def model_params(model: torch.nn.Module) -> dict[str, Tensor]:
    """The trainable parameters of `model` by name, as detached tensors sharing storage
    (in-place changes to them change the model)."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


@dataclass(frozen=True)
class PendingDelta:
    """A validated peer packet waiting for the next merge."""

    arrival_round: int
    """Our `rounds_done` when the packet arrived."""
    sender_version: int
    """The sender's policy version when it sealed the packet."""
    base_version: int
    compressed: CompressedDelta


@dataclass(frozen=True)
class MergeStats:
    """What one merge did (a metrics record)."""

    pending: int
    """Packets held when the merge began."""
    stale: int
    """Of those, dropped as beyond `max_staleness` at merge time."""
    aggregate: AggregateStats | None
    """The aggregation's own stats (None when nothing was merged)."""
    applied_norm: float
    """L2 norm of the change made to the parameters."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "stale": self.stale,
            "applied_norm": self.applied_norm,
            **({"aggregate": self.aggregate.as_dict()} if self.aggregate else {}),
        }


class DeltaExchange:
    """One node's side of delta sharing (see module docstring). Synchronous and
    CPU-bound: a node calls it off the event loop, between training steps."""

    def __init__(
        self,
        config: DeltasConfig,
        model_family: str,
        params: Mapping[str, Tensor],
        step: int = 0,
        *,
        max_packet_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.model_family = model_family
        self.shapes = {name: tuple(t.shape) for name, t in sorted(params.items())}
        self.max_packet_bytes = max_packet_bytes
        self._last_shared = {
            name: t.detach().to(torch.float32).clone() for name, t in params.items()
        }
        self._residual = {name: torch.zeros_like(t) for name, t in self._last_shared.items()}
        self._last_step = step
        self._own_norm: float | None = None
        self.pending: dict[str, PendingDelta] = {}
        self.last_packet_bytes = 0
        """Payload (safetensors) bytes of the last packet made."""

    # ---- sharing ---------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether `step` (the policy version) is a share step."""
        return step - self._last_step >= self.config.every_k_steps

    def maybe_make_packet(self, step: int, params: Mapping[str, Tensor]) -> DeltaPacket | None:
        """Every K steps: this node's compressed training delta since its last share.

        `base_version` is the policy version the delta starts from (the last share);
        `meta["version"]` the one it ends at. Raises ValueError if the parameters hold
        NaN/Inf (a broken local model is not shared).
        """
        if not self.due(step):
            return None
        self._check_names(params)
        delta = {
            name: params[name].detach().to(torch.float32) - self._last_shared[name]
            for name in self.shapes
        }
        c = self.config
        compressed, residual = compress(
            delta,
            self._residual,
            encoding=c.encoding,
            density=c.density,
            bits=c.bits,
            chunk_size=c.chunk_size,
        )
        sent = {
            name: delta[name] + self._residual[name] - residual[name].to(delta[name].device)
            for name in self.shapes
        }
        self._own_norm = global_norm(sent)
        self._residual = {
            name: t.to(self._last_shared[name].device) for name, t in residual.items()
        }
        for name, last in self._last_shared.items():
            last.copy_(params[name].detach())
        base = self._last_step
        self._last_step = step
        tensors = encode_packet(compressed)
        self.last_packet_bytes = len(tensors)
        return DeltaPacket(
            model_family=self.model_family,
            base_version=base,
            encoding=compressed.encoding,
            tensors=tensors,
            meta={"version": str(step)},
        )

    # ---- receiving -------------------------------------------------------------------

    def receive(
        self, sender: str, sender_version: int, packet: DeltaPacket, arrival_round: int
    ) -> None:
        """Validate a peer's packet and hold it for the next merge, or raise `Refused`."""
        if packet.model_family != self.model_family:
            raise Refused("wrong_family")
        if packet.meta.get("scheme", "merge") != "merge":  # e.g. a CHOCO keyframe: absolute
            raise Refused("wrong_scheme")
        pending = self.pending  # one read: `merge_into` may rebind it from another thread
        held = pending.get(sender)
        if held is not None and held.sender_version > sender_version:
            raise Refused("stale")
        if packet.encoding not in ENCODINGS:
            raise Refused("bad_delta")
        try:
            compressed = decode_packet(packet.tensors, self.shapes, max_bytes=self.max_packet_bytes)
        except DeltaCodecError as exc:
            raise Refused(exc.reason) from None
        if compressed.encoding != packet.encoding:
            raise Refused("bad_delta")
        if held is None and len(pending) >= self.config.max_pending_peers:
            arrivals = {s: p.arrival_round for s, p in list(pending.items())}
            stalest = min(arrivals, key=arrivals.__getitem__)
            if arrivals[stalest] >= arrival_round:
                raise Refused("pending_full")
            pending.pop(stalest, None)
        self.pending[sender] = PendingDelta(
            arrival_round, sender_version, packet.base_version, compressed
        )

    # ---- merging ---------------------------------------------------------------------

    def merge_into(self, params: Mapping[str, Tensor], own_round: int | None = None) -> MergeStats:
        """Apply `mixing_weight * robust_aggregate(pending)` to `params` in place (those
        beyond `max_staleness` of `own_round` are skipped); clear the pending packets."""
        self._check_names(params)
        pending, self.pending = self.pending, {}  # one rebinding: safe against `receive`
        held = list(pending.values())
        fresh = [
            p
            for p in held
            if own_round is None or is_fresh(own_round, p.arrival_round, self.config.max_staleness)
        ]
        stale = len(held) - len(fresh)
        if not fresh:
            return MergeStats(len(held), stale, None, 0.0)
        deltas = [decompress(p.compressed, self.shapes) for p in fresh]
        c = self.config
        combined, agg_stats = aggregate_with_stats(
            deltas, c.aggregator, c.trim_fraction, c.clip_multiple, own_norm=self._own_norm
        )
        applied_sq = 0.0
        with torch.no_grad():
            for name, param in params.items():
                before = param.detach().to(torch.float32).clone()
                step = (c.mixing_weight * combined[name]).to(device=param.device, dtype=param.dtype)
                param.add_(step)
                applied = param.detach().to(torch.float32) - before
                self._last_shared[name] += applied.to(self._last_shared[name].device)
                applied_sq += float(applied.double().pow(2).sum())
        return MergeStats(len(held), stale, agg_stats, math.sqrt(applied_sq))

    # ---- checkpoint state ------------------------------------------------------------

    def state_tensors(self) -> dict[str, Tensor]:
        """Residual, `theta_last_shared` and two scalars, for a safetensors checkpoint."""
        state = {_RESIDUAL + n: t.detach().cpu().contiguous() for n, t in self._residual.items()}
        state.update(
            {_LAST_SHARED + n: t.detach().cpu().contiguous() for n, t in self._last_shared.items()}
        )
        state[_LAST_STEP] = torch.tensor([self._last_step], dtype=torch.int64)
        own = -1.0 if self._own_norm is None else self._own_norm
        state[_OWN_NORM] = torch.tensor([own], dtype=torch.float64)
        return state

    def load_state_tensors(self, state: Mapping[str, Tensor]) -> None:
        """Restore what `state_tensors` returned; ValueError if it does not fit."""
        expected = {_RESIDUAL + n for n in self.shapes} | {_LAST_SHARED + n for n in self.shapes}
        expected |= {_LAST_STEP, _OWN_NORM}
        if set(state) != expected:
            raise ValueError("delta state does not match this model's parameters")
        for name, shape in self.shapes.items():
            for prefix in (_RESIDUAL, _LAST_SHARED):
                t = state[prefix + name]
                if tuple(t.shape) != shape or not bool(torch.isfinite(t).all()):
                    raise ValueError(f"delta state {prefix + name} has a bad shape or values")
        for name in self.shapes:
            device = self._last_shared[name].device
            self._residual[name] = state[_RESIDUAL + name].to(device, torch.float32).clone()
            self._last_shared[name] = state[_LAST_SHARED + name].to(device, torch.float32).clone()
        self._last_step = int(state[_LAST_STEP][0])
        own = float(state[_OWN_NORM][0])
        self._own_norm = None if own < 0 else own
        self.pending.clear()

    def rebase(self, params: Mapping[str, Tensor], step: int) -> None:
        """Start afresh from `params` at `step`: `theta_last_shared = params`, zero
        residual, nothing pending. For a resume from a checkpoint without delta state (the
        snapshot taken at construction would otherwise make the first share carry all
        training since then)."""
        self._check_names(params)
        for name, last in self._last_shared.items():
            last.copy_(params[name].detach())
            self._residual[name].zero_()
        self._last_step = step
        self._own_norm = None
        self.pending = {}

    # ---- helpers ---------------------------------------------------------------------

    @property
    def last_step(self) -> int:
        return self._last_step

    @property
    def last_shared(self) -> Mapping[str, Tensor]:
        """`theta_last_shared` by name (float32), to read: `rebase` changes it."""
        return MappingProxyType(self._last_shared)

    @property
    def own_norm(self) -> float | None:
        """L2 norm of the last delta this node transmitted (the clipping cap)."""
        return self._own_norm

    def _check_names(self, params: Mapping[str, Tensor]) -> None:
        shapes = {name: tuple(t.shape) for name, t in params.items()}
        if shapes != self.shapes:
            raise ValueError("parameters differ from those the exchange was built with")
