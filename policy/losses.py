"""GRPO loss variants as pure functions of tensors, chosen by TRL's `loss_type`.

Shapes: `logprobs`, `old_logprobs`, `mask`, optional `ref_logprobs` and
`importance_weights` are [B, T] (B sequences, T completion positions); `advantages` is
[B]. `mask` is 1 on real completion tokens, 0 on padding.

Per token (PPO clipped surrogate with DAPO's asymmetric clip):
    ratio = exp(logprobs - old_logprobs)
    pg    = -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)
    pg   -= entropy_coef * H_t            (before the weights: a token weighted 0 trains nothing)
    pg   *= importance_weights            (truncated sampler/trainer correction; detached)
    loss_t = pg + beta * kl_t
    kl_t = exp(ref - logp) - (ref - logp) - 1   (k3, >= 0)
    H_t  = the policy's entropy at that position (optional `entropy` [B, T], with grad):
           a bonus that keeps a group's completions apart, so that they keep differing
           in reward (a policy that answers every prompt alike leaves GRPO no signal)
  Two options of TRL's `GRPOConfig`, with its meanings (off by default):
    delta:  two-sided clipping (INTELLECT-2): the unclipped term uses min(ratio, delta),
            so a token with a negative advantage cannot push its ratio's loss up without
            bound; the clipped term is unchanged
    use_bias_correction_kl: kl_t *= ratio (with grad), the importance-sampling
            correction of the KL estimate for tokens sampled by the old policy
Aggregation over the batch (the variants differ only here):
    grpo:    (1/N) sum_i (sum_t loss_it m_it / sum_t m_it)      per-sequence mean
    dr_grpo: sum_it loss_it m_it / (N * L)                      constant normalizer
    dapo:    sum_it loss_it m_it / M                            token mean
N (`num_sequences`), M (`num_tokens`) and L (`max_completion_length`) default to this
batch's B, mask sum and T; a trainer splitting one step into micro-batches passes the
whole step's values so the micro-batch losses add up to the step's loss.
A sequence with an empty mask contributes 0 (never NaN).
`clip_frac` counts masked tokens where clipping binds (ratio < 1-eps with A < 0, or
ratio > 1+eps_high with A > 0); it is 0 at ratio 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossOutputs:
    """The loss (with grad) and detached diagnostics (means over masked tokens)."""

    loss: torch.Tensor
    clip_frac: float
    low_clip_frac: float
    high_clip_frac: float
    kl: float
    entropy: float
    """Mean policy entropy over masked tokens (0.0 when not given)."""
    ratio_mean: float
    n_tokens: int


def truncated_importance_weights(
    trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """min(pi_trainer / pi_sampler, cap) per token, detached (truncated IS, as in TIS)."""
    return torch.exp(trainer_logprobs.detach() - sampler_logprobs.detach()).clamp(max=cap)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


def _per_token(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float | None,
    ref_logprobs: torch.Tensor | None,
    beta: float,
    importance_weights: torch.Tensor | None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    eps_high = epsilon if epsilon_high is None else epsilon_high
    m = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)[:, None]
    ratio = torch.exp(logprobs - old_logprobs.detach())
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    loss = -torch.min(unclipped * adv, clipped * adv)
    n = m.sum().clamp(min=1)
    entropy_value = 0.0
    if entropy is not None:
        if entropy_coef != 0:
            loss = loss - entropy_coef * entropy
        entropy_value = float((entropy.detach() * m).sum() / n)
    if importance_weights is not None:
        loss = loss * importance_weights.detach()
    kl_value = 0.0
    if ref_logprobs is not None and beta != 0:
        kl = k3_kl(logprobs, ref_logprobs.detach())
        if use_bias_correction_kl:
            kl = kl * ratio
        loss = loss + beta * kl
        kl_value = float((kl.detach() * m).sum() / n)
    with torch.no_grad():
        low = ((ratio < 1 - epsilon) & (adv < 0)).to(m.dtype) * m
        high = ((ratio > 1 + eps_high) & (adv > 0)).to(m.dtype) * m
        stats = {
            "low_clip_frac": float(low.sum() / n),
            "high_clip_frac": float(high.sum() / n),
            "kl": kl_value,
            "entropy": entropy_value,
            "ratio_mean": float((ratio * m).sum() / n),
        }
    return loss * m, stats, m


def _outputs(loss: torch.Tensor, stats: dict[str, float], m: torch.Tensor) -> LossOutputs:
    return LossOutputs(
        loss=loss,
        clip_frac=stats["low_clip_frac"] + stats["high_clip_frac"],
        low_clip_frac=stats["low_clip_frac"],
        high_clip_frac=stats["high_clip_frac"],
        kl=stats["kl"],
        entropy=stats["entropy"],
        ratio_mean=stats["ratio_mean"],
        n_tokens=int(m.sum()),
    )


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    importance_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    max_completion_length: int | None = None,
) -> LossOutputs:
    """Per-sequence token mean, then mean over sequences (original GRPO)."""
    per_tok, stats, m = _per_token(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        epsilon,
        epsilon_high,
        ref_logprobs,
        beta,
        importance_weights,
        entropy,
        entropy_coef,
        delta,
        use_bias_correction_kl,
    )
    per_seq = per_tok.sum(-1) / m.sum(-1).clamp(min=1)
    n = num_sequences if num_sequences is not None else logprobs.shape[0]
    return _outputs(per_seq.sum() / max(n, 1), stats, m)


def dr_grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    importance_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    max_completion_length: int | None = None,
) -> LossOutputs:
    """Token sum over a constant normalizer N * L (Dr. GRPO: no length bias)."""
    per_tok, stats, m = _per_token(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        epsilon,
        epsilon_high,
        ref_logprobs,
        beta,
        importance_weights,
        entropy,
        entropy_coef,
        delta,
        use_bias_correction_kl,
    )
    n = num_sequences if num_sequences is not None else logprobs.shape[0]
    length = max_completion_length if max_completion_length is not None else logprobs.shape[1]
    return _outputs(per_tok.sum() / max(n * length, 1), stats, m)


def dapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    importance_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    max_completion_length: int | None = None,
) -> LossOutputs:
    """Token mean over every token of the batch (DAPO; use with `epsilon_high`)."""
    per_tok, stats, m = _per_token(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        epsilon,
        epsilon_high,
        ref_logprobs,
        beta,
        importance_weights,
        entropy,
        entropy_coef,
        delta,
        use_bias_correction_kl,
    )
    total = num_tokens if num_tokens is not None else int(m.sum())
    return _outputs(per_tok.sum() / max(total, 1), stats, m)


def loss_normalizer(
    loss_type: str, num_sequences: int, num_tokens: int, max_completion_length: int
) -> int:
    """What `LOSSES[loss_type]` divides its sum by, for a step's counts: the loss with
    unit normalizers divided by this equals the loss with these (so a trainer may sum
    micro-batch losses first and learn the counts at the end)."""
    if loss_type == "grpo":
        return max(num_sequences, 1)
    if loss_type == "dr_grpo":
        return max(num_sequences * max_completion_length, 1)
    if loss_type == "dapo":
        return max(num_tokens, 1)
    raise ValueError(f"unknown loss_type {loss_type!r}")


LossFn = Callable[..., LossOutputs]

LOSSES: dict[str, LossFn] = {"grpo": grpo_loss, "dr_grpo": dr_grpo_loss, "dapo": dapo_loss}
"""Loss variants keyed by TRL's `loss_type`."""
