"""Robust aggregation of peers' deltas: exact small cases and hostile minorities."""

from __future__ import annotations

import math

import pytest
import torch

from policy.aggregation import aggregate, aggregate_with_stats, combine, global_norm

SHAPES = {"w": (32, 64), "b": (64,)}


def _honest(n: int, seed: int = 0) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """n honest deltas: one shared direction plus per-peer noise; and their mean."""
    g = torch.Generator().manual_seed(seed)
    signal = {k: torch.randn(s, generator=g) * 1e-3 for k, s in SHAPES.items()}
    peers = [
        {k: signal[k] + torch.randn(s, generator=g) * 3e-4 for k, s in SHAPES.items()}
        for _ in range(n)
    ]
    mean = {k: torch.stack([p[k] for p in peers]).mean(0) for k in SHAPES}
    return peers, mean


def _rel(a: dict, b: dict) -> float:
    return global_norm({k: a[k] - b[k] for k in a}) / global_norm(b)


def test_combine_exact_values() -> None:
    x = torch.tensor([[1.0], [2.0], [3.0], [100.0], [-50.0]])
    assert combine(x, "mean", 0.0).item() == pytest.approx(11.2)
    assert combine(x, "median", 0.0).item() == 2.0
    assert combine(x[:4], "median", 0.0).item() == 2.5
    assert combine(x, "trimmed_mean", 0.2).item() == 2.0  # drops -50 and 100
    assert combine(x, "trimmed_mean", 0.0).item() == pytest.approx(11.2)
    assert combine(x[:2], "trimmed_mean", 0.49).item() == 1.5  # never trims everything


def test_zeros_abstain_in_the_robust_statistics() -> None:
    # coordinate 0: three voters (1, 2, 90) of five; coordinate 1: one voter; 2: none
    x = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [90.0, 4.0, 0.0], [0.0] * 3, [0.0] * 3])
    assert combine(x, "median", 0.0).tolist() == pytest.approx([2.0 * 3 / 5, 4.0 / 5, 0.0])
    assert combine(x, "trimmed_mean", 0.34).tolist() == pytest.approx([2.0 * 3 / 5, 4.0 / 5, 0.0])
    assert combine(x, "trimmed_mean", 0.0).tolist() == pytest.approx(combine(x, "mean", 0).tolist())
    even = torch.tensor([[1.0], [3.0], [0.0]])
    assert combine(even, "median", 0.0).item() == pytest.approx(2.0 * 2 / 3)


def test_sparse_honest_deltas_keep_their_signal() -> None:
    """Top-k-like deltas with mostly disjoint supports: the robust statistics must not
    collapse to zero (a plain coordinate-wise median over all peers would)."""
    peers, _ = _honest(5)
    g = torch.Generator().manual_seed(5)
    sparse = [
        {k: v * (torch.rand(v.shape, generator=g) < 0.1) for k, v in p.items()} for p in peers
    ]
    mean = aggregate(sparse, "mean", 0.0, None)
    for method in ("median", "trimmed_mean"):
        assert _rel(aggregate(sparse, method, 0.2, None), mean) < 0.1  # type: ignore[arg-type]


def test_nan_peers_are_dropped_and_all_nan_gives_zeros() -> None:
    peers, mean = _honest(3)
    bad = {k: v.clone() for k, v in peers[0].items()}
    bad["b"][0] = float("nan")
    result, stats = aggregate_with_stats([*peers, bad], "mean", clip_multiple=None)
    assert stats.dropped_nonfinite == 1 and stats.peers == 4
    assert all(torch.allclose(result[k], mean[k]) for k in SHAPES)
    result, stats = aggregate_with_stats([bad, bad], "trimmed_mean")
    assert stats.dropped_nonfinite == 2
    assert all(not result[k].any() and result[k].shape == SHAPES[k] for k in SHAPES)
    assert aggregate([]) == {}


@pytest.mark.parametrize("method", ["trimmed_mean", "median"])
def test_a_hostile_minority_is_ignored(method: str) -> None:
    peers, honest_mean = _honest(7)
    g = torch.Generator().manual_seed(99)
    hostile = [
        {k: v * 1000 for k, v in peers[0].items()},  # scaled x1000
        {k: -v for k, v in peers[1].items()},  # sign-flipped
        {k: torch.full(s, float("nan")) for k, s in SHAPES.items()},  # NaN
        {k: torch.randn(s, generator=g) for k, s in SHAPES.items()},  # large noise
    ]
    everyone = peers + hostile
    robust = aggregate(everyone, method, trim_fraction=0.3, clip_multiple=2.0)
    naive = aggregate([p for p in everyone if not math.isnan(global_norm(p))], "mean", 0.0, None)
    print(
        method,
        "relative error, robust:",
        _rel(robust, honest_mean),
        "naive:",
        _rel(naive, honest_mean),
    )
    assert _rel(robust, honest_mean) < 0.2
    assert _rel(naive, honest_mean) > 50


def test_trimmed_mean_stays_within_the_honest_range() -> None:
    peers, _ = _honest(6)
    hostile = [
        {k: v * 1e6 for k, v in peers[0].items()},
        {k: -v * 1e6 for k, v in peers[1].items()},
    ]
    result = aggregate(peers + hostile, "trimmed_mean", trim_fraction=0.25, clip_multiple=None)
    for k in SHAPES:
        stacked = torch.stack([p[k] for p in peers])
        lo, hi = stacked.min(0).values, stacked.max(0).values
        assert bool(((result[k] >= lo - 1e-9) & (result[k] <= hi + 1e-9)).all())


def test_clipping_to_the_median_and_to_our_own_norm() -> None:
    peers, _ = _honest(5)
    norms = sorted(global_norm(p) for p in peers)
    inflated = [{k: v * 1000 for k, v in p.items()} for p in peers]
    # every peer hostile: the median is theirs, but our own norm caps the bound
    result, stats = aggregate_with_stats(inflated, "mean", 0.0, 2.0, own_norm=norms[2])
    assert stats.clipped == 5 and stats.clip_bound == pytest.approx(2.0 * norms[2])
    assert global_norm(result) <= 2.0 * norms[2] * (1 + 1e-6)
    # honest peers: the bound is twice the median norm, nobody is clipped
    _, stats = aggregate_with_stats(peers, "mean", 0.0, 2.0)
    assert stats.clipped == 0 and stats.median_norm == pytest.approx(norms[2])


def test_inputs_are_not_modified_and_shapes_must_agree() -> None:
    peers, _ = _honest(3)
    copies = [{k: v.clone() for k, v in p.items()} for p in peers]
    aggregate(peers, "trimmed_mean", 0.2, 0.5)
    assert all(torch.equal(p[k], c[k]) for p, c in zip(peers, copies, strict=True) for k in SHAPES)
    with pytest.raises(ValueError, match="shapes"):
        aggregate([peers[0], {"w": peers[1]["w"]}])
    with pytest.raises(ValueError):
        aggregate(peers, "max")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        aggregate(peers, trim_fraction=0.5)


def test_huge_finite_values_do_not_overflow() -> None:
    big = {"x": torch.full((4,), 3e38)}
    for method in ("mean", "trimmed_mean", "median"):
        result = aggregate([big, big, big], method, 0.2, None)  # type: ignore[arg-type]
        assert bool(torch.isfinite(result["x"]).all())
