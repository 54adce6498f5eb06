"""Loss variants against hand-computed values; clipping, KL and importance weights."""

from __future__ import annotations

import math

import pytest
import torch

from policy.losses import (
    LOSSES,
    dapo_loss,
    dr_grpo_loss,
    grpo_loss,
    k3_kl,
    loss_normalizer,
    truncated_importance_weights,
)


def ratios(*r: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs with grad, old logprobs = 0) so that exp(logprobs - old) = r."""
    lp = torch.tensor([[math.log(x) for x in r]], requires_grad=True)
    return lp, torch.zeros_like(lp)


def test_registry_keys_are_trl_loss_types() -> None:
    assert set(LOSSES) == {"grpo", "dr_grpo", "dapo"}


def test_positive_advantage_clips_above_1_plus_eps() -> None:
    lp, old = ratios(1.5, 0.5)
    out = grpo_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 2), epsilon=0.2)
    # token 1: -min(1.5, 1.2) = -1.2 (clipped); token 2: -min(0.5, 0.8) = -0.5 (not clipped)
    assert out.loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert out.clip_frac == pytest.approx(0.5)
    assert out.high_clip_frac == pytest.approx(0.5) and out.low_clip_frac == 0
    out.loss.backward()
    # clipped token has no gradient; d/dlogp(-r * A) / 2 tokens = -0.5 / 2
    assert lp.grad is not None
    assert lp.grad[0, 0].item() == 0.0
    assert lp.grad[0, 1].item() == pytest.approx(-0.25)


def test_negative_advantage_clips_below_1_minus_eps() -> None:
    lp, old = ratios(1.5, 0.5)
    out = grpo_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 2), epsilon=0.2)
    # token 1: -min(-1.5, -1.2) = 1.5; token 2: -min(-0.5, -0.8) = 0.8 (clipped)
    assert out.loss.item() == pytest.approx((1.5 + 0.8) / 2)
    assert out.low_clip_frac == pytest.approx(0.5) and out.high_clip_frac == 0


def test_clip_higher_epsilon_high() -> None:
    lp, old = ratios(1.25)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 1)
    assert dapo_loss(lp, old, adv, mask, epsilon=0.2).loss.item() == pytest.approx(-1.2)
    out = dapo_loss(lp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    assert out.loss.item() == pytest.approx(-1.25) and out.clip_frac == 0


def test_ratio_one_never_clips() -> None:
    lp, old = ratios(1.0, 1.0)
    out = dapo_loss(lp, old, torch.tensor([2.0]), torch.ones(1, 2), epsilon=0.0)
    assert out.loss.item() == pytest.approx(-2.0) and out.clip_frac == 0
    assert out.ratio_mean == pytest.approx(1.0)


def _two_sequences() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # seq 0: two tokens at ratio 1, A = 1  -> token losses -1, -1
    # seq 1: one real token at ratio 1, A = -2 (second position is padding) -> +2
    lp = torch.zeros(2, 2, requires_grad=True)
    return lp, torch.zeros(2, 2), torch.tensor([1.0, -2.0]), torch.tensor([[1, 1], [1, 0]])


def test_aggregations_differ_as_documented() -> None:
    lp, old, adv, mask = _two_sequences()
    # grpo: mean over sequences of per-sequence token means: (-1 + 2) / 2
    assert grpo_loss(lp, old, adv, mask).loss.item() == pytest.approx(0.5)
    # dapo: token mean over the batch: (-1 - 1 + 2) / 3
    assert dapo_loss(lp, old, adv, mask).loss.item() == pytest.approx(0.0)
    # dr_grpo: token sum / (N * L) with L = max_completion_length: 0 / (2 * 4)
    assert dr_grpo_loss(lp, old, adv, mask, max_completion_length=4).loss.item() == pytest.approx(0)
    lp2, old2, adv2, mask2 = lp, old, torch.tensor([1.0, -1.0]), mask
    # (-2 + 1) / (2 * 4)
    assert dr_grpo_loss(
        lp2, old2, adv2, mask2, max_completion_length=4
    ).loss.item() == pytest.approx(-1 / 8)
    # defaults: L = T = 2
    assert dr_grpo_loss(lp2, old2, adv2, mask2).loss.item() == pytest.approx(-1 / 4)


def test_global_normalizers_make_micro_batches_add_up() -> None:
    lp, old, adv, mask = _two_sequences()
    for fn in LOSSES.values():
        whole = fn(lp, old, adv, mask, max_completion_length=4).loss
        parts = sum(
            fn(
                lp[i : i + 1],
                old[i : i + 1],
                adv[i : i + 1],
                mask[i : i + 1],
                num_sequences=2,
                num_tokens=3,
                max_completion_length=4,
            ).loss
            for i in range(2)
        )
        assert parts.item() == pytest.approx(whole.item())


def test_empty_mask_is_zero_not_nan() -> None:
    lp = torch.zeros(1, 3, requires_grad=True)
    for fn in LOSSES.values():
        out = fn(lp, torch.zeros(1, 3), torch.tensor([1.0]), torch.zeros(1, 3))
        assert out.loss.item() == 0.0 and not math.isnan(out.clip_frac)


def test_k3_kl_and_beta() -> None:
    lp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    expected = 0.5 + math.log(2) - 1  # exp(d) - d - 1 with d = log(0.5)
    assert k3_kl(lp, ref).item() == pytest.approx(expected)
    assert k3_kl(ref, ref).item() == 0.0
    out = grpo_loss(
        lp, lp.detach(), torch.tensor([0.0]), torch.ones(1, 1), ref_logprobs=ref, beta=0.1
    )
    assert out.loss.item() == pytest.approx(0.1 * expected)
    assert out.kl == pytest.approx(expected)


def test_truncated_importance_weights() -> None:
    trainer = torch.log(torch.tensor([[0.5, 0.5]]))
    sampler = torch.log(torch.tensor([[0.25, 1.0]]))
    w = truncated_importance_weights(trainer, sampler, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5]]))  # 2 capped at 1.5; 0.5 kept
    lp, old = ratios(1.0, 1.0)
    out = dapo_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 2), importance_weights=w)
    assert out.loss.item() == pytest.approx(-(1.5 + 0.5) / 2)


def test_entropy_bonus_lowers_the_loss_by_coef_times_entropy() -> None:
    lp, old = ratios(1.0, 1.0)
    entropy = torch.tensor([[2.0, 1.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    plain = dapo_loss(lp, old, torch.tensor([0.0]), mask, entropy=entropy)
    assert plain.loss.item() == 0.0  # given without a coefficient: reported only
    assert plain.entropy == pytest.approx(1.5)
    out = dapo_loss(lp, old, torch.tensor([0.0]), mask, entropy=entropy, entropy_coef=0.1)
    assert out.loss.item() == pytest.approx(-0.1 * 1.5)
    out.loss.backward()
    assert entropy.grad is not None and torch.all(entropy.grad < 0)  # descent raises entropy
    assert dapo_loss(lp, old, torch.tensor([0.0]), mask).entropy == 0.0
    left_out = torch.tensor([[0.0, 1.0]])  # a token weighted 0 (left out) trains nothing
    out = dapo_loss(
        lp, old, torch.tensor([0.0]), mask, entropy=entropy, entropy_coef=0.1,
        importance_weights=left_out,
    )  # fmt: skip
    assert out.loss.item() == pytest.approx(-0.1 * 1.0 / 2)


@pytest.mark.parametrize("loss_type", sorted(LOSSES))
def test_a_sum_divided_by_the_normalizer_is_the_normalized_loss(loss_type: str) -> None:
    g = torch.Generator().manual_seed(5)
    logprobs = torch.randn(3, 5, generator=g, requires_grad=True)
    old = logprobs.detach() + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.tensor([1.0, -0.5, 0.25])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    counts = {"num_sequences": 7, "num_tokens": 23, "max_completion_length": 6}
    loss_fn = LOSSES[loss_type]
    normalized = loss_fn(logprobs, old, adv, mask, **counts).loss
    unit = loss_fn(logprobs, old, adv, mask, num_sequences=1, num_tokens=1, max_completion_length=1)
    divisor = loss_normalizer(loss_type, **counts)
    assert unit.loss.item() / divisor == pytest.approx(normalized.item(), rel=1e-6)
    with pytest.raises(ValueError):
        loss_normalizer("ppo", **counts)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_delta_caps_the_unclipped_ratio_of_a_negative_advantage(loss_type: str) -> None:
    # TRL's two-sided clipping: ratio 5 with A = -1 costs -min(-5, -1.2) = 5 without delta;
    # with delta = 3 the unclipped term is capped at 3 (and passes no gradient). Token 2
    # (ratio 0.5, A = -1): -min(-0.5, -0.8) = 0.8, clipped, unchanged by delta.
    lp, old = ratios(5.0, 0.5)
    adv, mask = torch.tensor([-1.0]), torch.ones(1, 2)
    plain = LOSSES[loss_type](lp, old, adv, mask, num_sequences=1, num_tokens=1)
    lp2, _ = ratios(5.0, 0.5)
    capped = LOSSES[loss_type](lp2, old, adv, mask, delta=3.0, num_sequences=1, num_tokens=1)
    scale = {"grpo": 2.0, "dr_grpo": 2.0, "dapo": 1.0}[loss_type]  # per-seq mean / N*L / M=1
    assert plain.loss.item() == pytest.approx((5.0 + 0.8) / scale)
    assert capped.loss.item() == pytest.approx((3.0 + 0.8) / scale)
    capped.loss.backward()
    assert lp2.grad is not None and lp2.grad[0, 0].item() == 0.0
    # A positive advantage is untouched below delta: -min(min(1.1, 3), 1.2) = -1.1.
    lp3, old3 = ratios(1.1)
    pos = dapo_loss(lp3, old3, torch.tensor([1.0]), torch.ones(1, 1), delta=3.0)
    assert pos.loss.item() == pytest.approx(-1.1)


def test_bias_corrected_kl_is_weighted_by_the_ratio() -> None:
    # k3 at ref - logp = d: exp(d) - d - 1; corrected, times the ratio exp(logp - old).
    lp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    old = torch.zeros(1, 1)
    ref = torch.tensor([[math.log(2.0) - 0.5]])  # d = -0.5
    k3 = math.exp(-0.5) + 0.5 - 1
    common = dict(ref_logprobs=ref, beta=0.1, epsilon=0.2)
    plain = dapo_loss(lp, old, torch.tensor([0.0]), torch.ones(1, 1), **common)
    corrected = dapo_loss(
        lp, old, torch.tensor([0.0]), torch.ones(1, 1), use_bias_correction_kl=True, **common
    )
    assert plain.loss.item() == pytest.approx(0.1 * k3)
    assert corrected.loss.item() == pytest.approx(0.1 * k3 * 2.0)
