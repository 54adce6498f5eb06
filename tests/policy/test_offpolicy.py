"""policy.offpolicy: truncated importance weights with ones where unknown, and the
plausibility test, on hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from policy.offpolicy import mean_logprob, plausible, tis_or_one

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, 0.0], [-0.2, 0.0, 0.0]])
VALID = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])


def test_weights_are_truncated_ratios_and_one_where_unknown() -> None:
    sampler = [[-1.5, -1.0, -0.5], None, [-0.1]]
    w = tis_or_one(OLD, sampler, VALID, cap=2.0)
    expected = torch.tensor(
        [
            [math.exp(0.5), math.exp(-1.0), 1.0],  # exp(old - sampler)
            [1.0, 1.0, 1.0],  # no sampler logprobs: weight 1
            [math.exp(-0.1), 1.0, 1.0],  # padding: weight 1
        ]
    )
    assert torch.allclose(w, expected, atol=1e-6)


def test_no_claim_makes_a_token_weigh_more_than_the_cap() -> None:
    claims = [[-3.0e38] * 3, [-1e4, -50.0], [-(2**100)]]
    w = tis_or_one(OLD, claims, VALID, cap=1.5)
    assert float(w.max()) == 1.5
    assert torch.equal(w[VALID], torch.full((6,), 1.5))


def test_weights_are_detached() -> None:
    old = OLD.clone().requires_grad_(True)
    assert not tis_or_one(old, [[-1.0] * 3, None, None], VALID, 2.0).requires_grad


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="one sampler_logprobs entry"):
        tis_or_one(OLD, [None, None], VALID, 2.0)
    with pytest.raises(ValueError, match="longer"):
        tis_or_one(OLD, [[-1.0] * 4, None, None], VALID, 2.0)


def test_mean_logprob_counts_only_real_tokens() -> None:
    means = mean_logprob(OLD, VALID)
    assert torch.allclose(means, torch.tensor([-3.5 / 3, -2.0, -0.2]))
    assert float(mean_logprob(OLD, torch.zeros_like(VALID))[0]) == 0.0


def test_plausible_is_a_threshold_on_the_mean() -> None:
    assert plausible(OLD, VALID, -1.0).tolist() == [False, False, True]
    assert plausible(OLD, VALID, -2.0).tolist() == [True, True, True]  # -2.0 >= -2.0
    assert plausible(OLD, VALID, -1.9).tolist() == [True, False, True]
    # A sequence with no real token is never left out.
    empty = torch.tensor([[False] * 3, [True, True, False], [False] * 3])
    assert plausible(OLD - 100, empty, -1.0).tolist() == [True, False, True]
