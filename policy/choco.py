"""CHOCO gossip averaging (Koloskova, Stich, Jaggi 2019): the tensor math and the
stream rules, as pure functions (no I/O, no clocks, no peers' identities).

The scheme, per share of node i (after its own optimizer steps moved `x_i`):
1. `q_i = Q(x_i - xhat_i)` with the top-k codec (`policy.compression`); publish `q_i`.
2. `xhat_i += q_i` on the sender and, for every receiver, `xhat_i(copy at j) += q_i`: a
   node keeps a *public copy* (estimate) of each same-family peer that it updates only
   with what that peer published, so sender and receivers hold bit-identical copies.
3. Consensus step: `x_i += gamma * sum_j w_ij (xhat_j - xhat_i)` over the peers j in
   sync, with uniform weights `w_ij = 1 / (n + 1)` (n peers in sync, the node itself
   counted once), here with each peer's term clipped (`consensus_direction`).
Error feedback is built in: what `Q` drops stays in `x_i - xhat_i` and is sent later,
so `xhat_i` tracks `x_i`; the consensus step pulls each `x_i` toward the estimates'
mean, which (for symmetric weights and no clipping) keeps the mean of the `x_i` fixed
while their spread contracts geometrically for a small enough `gamma` (Theorem 2 of the
paper; `tests/policy/test_choco.py` checks it on a toy problem with our codec).

Streams (open swarm: packets get lost, peers restart): a node's packets form a *stream*
(a random id chosen when its estimate starts) of sequence numbers 1, 2, 3, ... A
*keyframe* carries the sender's whole estimate (dense float16; the sender sets its own
`xhat_i` to exactly the decoded values, so both sides agree bit for bit); a *diff*
carries `q`. `classify` decides what a receiver does with each packet:
- a keyframe newer than what is held (or from a new stream) resynchronizes the copy;
- the next diff in sequence (`seq == held + 1`) is applied;
- a diff after a gap (`seq > held + 1`), or on a stream the receiver holds no copy of,
  makes the copy unusable until the sender's next keyframe (a missed `q` cannot be
  recovered in pure gossip: no resync requests, the sender does not know who missed);
- an old or duplicate packet (`seq <= held`) is ignored.

Invariants: inputs are never modified except where a function says "in place"; every
result is finite for finite inputs (norms in float64, factors in [0, 1]); a copy that
became non-finite is reported, never used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from policy.aggregation import global_norm

Frame = Literal["key", "diff"]
Verdict = Literal["resync", "apply", "gap", "wait", "old"]
_EPS = 1e-12


@dataclass(frozen=True)
class StreamPosition:
    """Where a receiver's copy of one peer stands."""

    stream: str
    """The peer's stream id."""
    seq: int
    """The sequence number of the last packet folded into the copy."""
    in_sync: bool
    """Whether the copy equals the peer's own estimate (False after a gap)."""


def classify(held: StreamPosition | None, stream: str, seq: int, frame: Frame) -> Verdict:
    """What to do with a peer's packet `(stream, seq, frame)` given the copy `held`.

    `resync`: replace the copy with the keyframe; `apply`: add the diff to the copy;
    `gap`: a diff was missed, the copy is unusable until the next keyframe; `wait`: a
    diff for a copy that is already unusable or absent; `old`: already seen or
    superseded, ignore. Packets of one peer must be classified in increasing `seq` order
    (a receiver sorts what it holds before folding it in).
    """
    same = held is not None and held.stream == stream
    if frame == "key":
        if same and held is not None and seq <= held.seq:
            return "old"
        return "resync"
    if not same or held is None:
        return "wait"
    if seq <= held.seq:
        return "old"
    if not held.in_sync:
        return "wait"
    if seq == held.seq + 1:
        return "apply"
    return "gap"


def difference(params: Mapping[str, Tensor], estimate: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """`x - xhat` in float32 (what `Q` compresses at a share)."""
    if set(params) != set(estimate):
        raise ValueError("parameters and estimate name different tensors")
    return {
        n: params[n].detach().to(torch.float32) - estimate[n].to(params[n].device) for n in params
    }


def add_into(estimate: Mapping[str, Tensor], q: Mapping[str, Tensor]) -> bool:
    """`estimate += q` in place; return whether the estimate is still finite."""
    if set(estimate) != set(q):
        raise ValueError("estimate and increment name different tensors")
    finite = True
    for name, t in estimate.items():
        t.add_(q[name].to(device=t.device, dtype=t.dtype))
        finite = finite and bool(torch.isfinite(t).all())
    return finite


@dataclass(frozen=True)
class ConsensusStats:
    """What one consensus step did (a metrics record)."""

    peers: int
    """Peer copies used (in sync and fresh)."""
    clipped: int
    """Peers whose term was scaled down."""
    clip_bound: float | None
    """The norm bound on each term (None: no clipping or no peers)."""
    median_gap: float | None
    """Median of `||xhat_j - xhat_i||` over the peers used (a local consensus distance)."""
    direction_norm: float
    """L2 norm of the direction (before `gamma`)."""

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "peers": self.peers,
            "clipped": self.clipped,
            "clip_bound": self.clip_bound,
            "median_gap": self.median_gap,
            "direction_norm": self.direction_norm,
        }


def consensus_direction(
    own: Mapping[str, Tensor],
    peers: Sequence[Mapping[str, Tensor]],
    clip_multiple: float | None,
) -> tuple[dict[str, Tensor], ConsensusStats]:
    """`sum_j w (xhat_j - xhat_i) * f_j` with `w = 1 / (n + 1)`, n = len(peers).

    `f_j = min(1, clip_multiple * median_k ||xhat_k - xhat_i|| / ||xhat_j - xhat_i||)`
    (1 for every peer when `clip_multiple` is None): a hostile peer whose copy sits far
    from ours moves us by at most `clip_multiple` times the median peer's distance, so
    while honest peers are the majority the bound is an honest distance, and it shrinks
    as the honest nodes agree. Non-finite peer copies raise ValueError (the caller drops
    them before: `add_into` reports them). The result is float32, on `own`'s devices.
    """
    if clip_multiple is not None and not clip_multiple > 0:
        raise ValueError("clip_multiple must be positive or None")
    zero = {n: torch.zeros_like(t, dtype=torch.float32) for n, t in own.items()}
    if not peers:
        return zero, ConsensusStats(0, 0, None, None, 0.0)
    gaps = []
    for p in peers:
        if set(p) != set(own):
            raise ValueError("a peer copy names different tensors")
        gaps.append({n: p[n].to(own[n].device, torch.float32) - own[n].float() for n in own})
    norms = [global_norm(g) for g in gaps]
    if not all(math.isfinite(x) for x in norms):
        raise ValueError("a peer copy holds NaN or Inf")
    ordered = sorted(norms)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
    bound = None if clip_multiple is None else clip_multiple * median
    factors = [1.0 if bound is None or x <= bound else bound / (x + _EPS) for x in norms]
    weight = 1.0 / (len(peers) + 1)
    for g, f in zip(gaps, factors, strict=True):
        for n, t in zero.items():
            t.add_(g[n], alpha=weight * f)
    stats = ConsensusStats(
        len(peers), sum(1 for f in factors if f < 1.0), bound, median, global_norm(zero)
    )
    return zero, stats


def step_into(params: Mapping[str, Tensor], direction: Mapping[str, Tensor], gamma: float) -> float:
    """`params += gamma * direction` in place (in each parameter's dtype); return the L2
    norm of the change actually made."""
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    total = 0.0
    with torch.no_grad():
        for name, p in params.items():
            before = p.detach().to(torch.float32).clone()
            p.add_((gamma * direction[name]).to(device=p.device, dtype=p.dtype))
            total += float((p.detach().to(torch.float32) - before).double().pow(2).sum())
    return math.sqrt(total)


def consensus_distance(models: Sequence[Mapping[str, Tensor]]) -> float:
    """`mean_i ||x_i - mean_k x_k||` over whole models (the figure the docs plot)."""
    if not models:
        return 0.0
    names = sorted(models[0])
    flat = torch.stack(
        [torch.cat([m[n].detach().reshape(-1).double().cpu() for n in names]) for m in models]
    )
    return float((flat - flat.mean(0)).norm(dim=1).mean())
