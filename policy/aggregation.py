"""Robust merging of peers' weight deltas: pure functions on torch tensors.

Steps of `aggregate`, in order:
1. Peers whose delta holds any NaN/Inf are dropped whole (a peer is one vote).
2. Norm clipping (unless `clip_multiple` is None): each remaining peer's delta is scaled
   down to at most `clip_multiple * reference`, where `reference` is the median of the
   peers' global L2 norms, capped by `own_norm` when given (this node's own last update
   norm: a majority of peers inflating their norms cannot raise the bound above it).
3. A coordinate-wise combination across the n peers: `mean` (sum / n), or a robust
   statistic over the peers that *sent* the coordinate, scaled by their share:
   `robust(values of the m voters) * m / n`, where a peer votes at a coordinate when its
   value there is non-zero. `median` takes the voters' median (the mean of the two
   middle values for an even count); `trimmed_mean` sorts the voters' values, drops
   `floor(trim_fraction * m)` from each end (always leaving one) and averages the rest.
   Why voters: top-k deltas are sparse and peers pick mostly different coordinates, so
   a plain coordinate-wise median over all n peers is zero almost everywhere and would
   throw away nearly all honest signal. With one voter the result is that value / n,
   exactly the mean; a hostile peer alone on a coordinate is bounded by the clipping.
   For dense deltas (no zeros) these are the usual median and trimmed mean.

Invariants: inputs are never modified; the result has the deltas' names and shapes, in
float32, always finite (averages are sums of `x / count`, so finite inputs cannot
overflow); with no usable peer it is all zeros. Where honest peers are the majority of
a coordinate's voters, `median`, and `trimmed_mean` with `floor(trim_fraction * m)` at
least the number of hostile voters, stay within `m / n` times the range of the (clipped)
honest values at that coordinate, however large or sign-flipped the hostile values are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Method = Literal["trimmed_mean", "median", "mean"]
METHODS: tuple[str, ...] = ("trimmed_mean", "median", "mean")
_EPS = 1e-12


@dataclass(frozen=True)
class AggregateStats:
    """What one aggregation did (for metrics)."""

    peers: int
    """Deltas given."""
    dropped_nonfinite: int
    """Peers dropped for NaN/Inf."""
    clipped: int
    """Peers whose delta was scaled down."""
    clip_bound: float | None
    """The norm bound applied (None: no clipping or no peers)."""
    median_norm: float | None
    """Median peer norm before clipping."""
    result_norm: float
    """L2 norm of the aggregate."""

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "peers": self.peers,
            "dropped_nonfinite": self.dropped_nonfinite,
            "clipped": self.clipped,
            "clip_bound": self.clip_bound,
            "median_norm": self.median_norm,
            "result_norm": self.result_norm,
        }


def global_norm(delta: Mapping[str, Tensor]) -> float:
    """L2 norm over every tensor (float64 accumulation)."""
    total = 0.0
    for t in delta.values():
        total += float(t.detach().double().pow(2).sum())
    return math.sqrt(total)


def is_finite(delta: Mapping[str, Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in delta.values())


def _median_of_sorted(s: Tensor) -> Tensor:
    n = s.shape[0]
    mid = n // 2
    if n % 2:
        return s[mid]
    return s[mid - 1] * 0.5 + s[mid] * 0.5


def combine(stacked: Tensor, method: Method, trim_fraction: float) -> Tensor:
    """Coordinate-wise combination along dim 0 of a (peers, ...) float tensor, treating
    exact zeros as abstentions for `median` and `trimmed_mean` (module docstring)."""
    n = stacked.shape[0]
    if method == "mean":
        return (stacked / n).sum(0)
    if method not in ("median", "trimmed_mean"):
        raise ValueError(f"unknown aggregation method {method!r}")
    sent = stacked != 0
    voters = sent.sum(0)
    ordered = torch.where(sent, stacked, float("nan")).sort(dim=0).values  # NaN sort last
    if method == "median":
        lo = ((voters - 1).clamp(min=0) // 2).unsqueeze(0)
        hi = (voters // 2).clamp(max=n - 1).unsqueeze(0)
        robust = (ordered.gather(0, lo) * 0.5 + ordered.gather(0, hi) * 0.5).squeeze(0)
    else:
        trim = torch.minimum(
            torch.floor(voters.double() * trim_fraction).long(), (voters - 1).clamp(min=0) // 2
        )
        pos = torch.arange(n, device=stacked.device).view(-1, *([1] * (stacked.dim() - 1)))
        keep = (pos >= trim) & (pos < voters - trim)
        count = (voters - 2 * trim).clamp(min=1)
        robust = (torch.where(keep, ordered, 0.0) / count).sum(0)
    return torch.where(voters > 0, robust * (voters.float() / n), 0.0)


def aggregate_with_stats(
    deltas: Sequence[Mapping[str, Tensor]],
    method: Method = "trimmed_mean",
    trim_fraction: float = 0.2,
    clip_multiple: float | None = 2.0,
    *,
    own_norm: float | None = None,
    template: Mapping[str, Tensor] | None = None,
) -> tuple[dict[str, Tensor], AggregateStats]:
    """The robust aggregate of `deltas` (see module docstring) and what it did.

    All deltas must have the same names and shapes (ValueError otherwise); `template`
    gives them when `deltas` may be empty (an empty result otherwise).
    """
    if method not in METHODS:
        raise ValueError(f"unknown aggregation method {method!r}")
    if not 0.0 <= trim_fraction < 0.5:
        raise ValueError("trim_fraction must be in [0, 0.5)")
    if clip_multiple is not None and not clip_multiple > 0:
        raise ValueError("clip_multiple must be positive or None")
    shape_of = template if template is not None else (deltas[0] if deltas else {})
    shapes = {name: tuple(t.shape) for name, t in shape_of.items()}
    for d in deltas:
        if {name: tuple(t.shape) for name, t in d.items()} != shapes:
            raise ValueError("deltas differ in names or shapes")
    devices = {name: t.device for name, t in shape_of.items()}
    usable = [d for d in deltas if is_finite(d)]
    dropped = len(deltas) - len(usable)
    zeros = {
        name: torch.zeros(s, dtype=torch.float32, device=devices[name])
        for name, s in shapes.items()
    }
    if not usable:
        stats = AggregateStats(len(deltas), dropped, 0, None, None, 0.0)
        return zeros, stats
    norms = [global_norm(d) for d in usable]
    median_norm = float(_median_of_sorted(torch.tensor(sorted(norms), dtype=torch.float64)))
    factors = [1.0] * len(usable)
    bound = None
    if clip_multiple is not None:
        reference = median_norm if own_norm is None else min(median_norm, own_norm)
        bound = clip_multiple * reference
        factors = [min(1.0, bound / (norm + _EPS)) if norm > bound else 1.0 for norm in norms]
    clipped = sum(1 for f in factors if f < 1.0)
    result = {}
    for name in shapes:
        stacked = torch.stack(
            [
                d[name].detach().to(device=devices[name], dtype=torch.float32) * f
                for d, f in zip(usable, factors, strict=True)
            ]
        )
        result[name] = combine(stacked, method, trim_fraction)
    stats = AggregateStats(len(deltas), dropped, clipped, bound, median_norm, global_norm(result))
    return result, stats


def aggregate(
    deltas: Sequence[Mapping[str, Tensor]],
    method: Method = "trimmed_mean",
    trim_fraction: float = 0.2,
    clip_multiple: float | None = 2.0,
    *,
    own_norm: float | None = None,
) -> dict[str, Tensor]:
    """The robust aggregate of `deltas` (see module docstring)."""
    return aggregate_with_stats(deltas, method, trim_fraction, clip_multiple, own_norm=own_norm)[0]
