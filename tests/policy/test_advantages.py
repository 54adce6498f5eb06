"""Group advantages against hand-computed values, including degenerate groups."""

from __future__ import annotations

import math

import pytest
import torch

from policy.advantages import (
    batch_std,
    group_advantages,
    is_degenerate,
    keep_mask,
    pivot_index,
)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_mean_std() -> None:
    # mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    adv = group_advantages(t(1, 0, 0, 0), "mean", "group", eps=0.0)
    assert torch.allclose(adv, t(1.5, -0.5, -0.5, -0.5))
    adv_eps = group_advantages(t(1, 0, 0, 0), "mean", "group", eps=1e-4)
    assert adv_eps[0].item() == pytest.approx(0.75 / 0.5001)


def test_mean_only_dr_grpo() -> None:
    assert torch.allclose(
        group_advantages(t(1, 0, 0, 0), "mean", "none"), t(0.75, -0.25, -0.25, -0.25)
    )
    assert torch.allclose(group_advantages(t(2, 4), "mean", "none"), t(-1, 1))


def test_median_mc_grpo_odd_group() -> None:
    r = t(0, 1, 1, 0, 1)  # sorted 0 0 1 1 1: median 1; pivot = first 1 = index 1
    assert pivot_index(r) == 1
    assert torch.allclose(group_advantages(r, "median", "none"), t(-1, 0, 0, -1, 0))
    std = math.sqrt(1.2 / 4)  # mean 0.6; squared deviations .36 .16 .16 .36 .16
    adv = group_advantages(r, "median", "group", eps=0.0)
    assert torch.allclose(adv, t(-1 / std, 0, 0, -1 / std, 0))
    assert keep_mask(r, "median").tolist() == [True, False, True, True, True]
    assert keep_mask(r, "mean").tolist() == [True] * 5


def test_median_even_group_uses_lower_median() -> None:
    r = t(3, 0, 2, 1)  # sorted 0 1 2 3: lower median 1 at index 3
    assert pivot_index(r) == 3
    assert torch.allclose(group_advantages(r, "median", "none"), t(2, -1, 1, 0))
    assert keep_mask(r, "median").tolist() == [True, True, True, False]


def test_median_resists_an_outlier_where_mean_flips_sign() -> None:
    r = t(0.5, 0.6, 0.6, 0.6, 10.0)
    assert group_advantages(r, "mean", "none")[1] < 0  # mean 2.46 flips 0.6 to negative
    assert group_advantages(r, "median", "none")[1] == 0
    assert group_advantages(r, "median", "none")[0] < 0


@pytest.mark.parametrize("baseline", ["mean", "median"])
@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("rewards", [(1.0, 1.0, 1.0), (0.0,), (0.0, 0.0), (0.7,) * 8])
def test_degenerate_groups_are_zero_never_nan(
    baseline: str, scale: str, rewards: tuple[float, ...]
) -> None:
    r = t(*rewards)
    adv = group_advantages(r, baseline, scale)  # type: ignore[arg-type]
    assert torch.equal(adv, torch.zeros(len(rewards)))
    assert is_degenerate(r)


def test_single_sample_keeps_its_only_sample() -> None:
    assert keep_mask(t(1.0), "median").tolist() == [True]


def test_refuses_non_finite_and_empty() -> None:
    with pytest.raises(ValueError):
        group_advantages(t(0, float("nan")))
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([]))
    with pytest.raises(ValueError):
        group_advantages(t(0, 1), baseline="mode")  # type: ignore[arg-type]


def test_batch_scale_divides_by_the_std_of_every_reward_of_the_step() -> None:
    a, b = t(1, 0, 0, 0), t(1, 1, 0, 0)
    spread = batch_std([a, b, t(0, 0, 0, 0)])  # a degenerate group still counts, as in TRL
    expected = torch.tensor([1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.float32).std()
    assert spread == pytest.approx(float(expected))
    adv = group_advantages(b, "mean", "batch", eps=0.0, batch=spread)
    assert torch.allclose(adv, t(0.5, 0.5, -0.5, -0.5) / spread)
    # The baseline stays the group's; only the scale is shared.
    adv_a = group_advantages(a, "mean", "batch", eps=0.0, batch=spread)
    assert adv_a.sum().item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="batch_std"):
        group_advantages(a, "mean", "batch")
    assert batch_std([t(1)]) == 0.0
