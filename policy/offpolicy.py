"""Per-token weights for samples another policy drew: pure functions of tensors.

Shapes: `old_logprobs` and `valid` are [B, T] (B sequences, T completion positions;
`valid` is True on a sequence's real tokens); `sampler_logprobs` is one list per
sequence, or None where the behaviour policy's logprobs are unknown.

Invariants:
- Truncated importance weights are min(exp(old - sampler), cap) on a sequence's real
  tokens and exactly 1 elsewhere (no logprobs, padding): a weight never exceeds `cap`,
  whatever logprobs a peer claims (a claim of -inf-like values gives `cap`, not more).
- The plausibility test of a sequence is the mean of `old_logprobs` over its real
  tokens against a threshold; a sequence with no real token is plausible (there is
  nothing to leave out).
- Every output is detached: weights scale the loss, they are not trained.
"""

from __future__ import annotations

import torch

from policy.losses import truncated_importance_weights


def tis_or_one(
    old_logprobs: torch.Tensor,
    sampler_logprobs: list[list[float] | None],
    valid: torch.Tensor,
    cap: float,
) -> torch.Tensor:
    """[B, T] weights: TIS against `sampler_logprobs` where given, 1 elsewhere."""
    t = old_logprobs.shape[1]
    if len(sampler_logprobs) != old_logprobs.shape[0]:
        raise ValueError("one sampler_logprobs entry per sequence")
    rows = []
    for lp in sampler_logprobs:
        if lp is not None and len(lp) > t:
            raise ValueError("sampler logprobs longer than the completion")
        rows.append((lp or []) + [0.0] * (t - len(lp or [])))
    sampler = torch.tensor(rows, dtype=torch.float32, device=old_logprobs.device)
    w = truncated_importance_weights(old_logprobs.float(), sampler, cap)
    has = torch.tensor([lp is not None for lp in sampler_logprobs], device=old_logprobs.device)
    use = has[:, None] & valid
    return torch.where(use, w, torch.ones_like(w))


def mean_logprob(old_logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B] mean per-token logprob over each sequence's real tokens (0 for none)."""
    m = valid.to(torch.float32)
    total = (old_logprobs.detach().float() * m).sum(-1)
    return total / m.sum(-1).clamp(min=1)


def plausible(old_logprobs: torch.Tensor, valid: torch.Tensor, min_mean: float) -> torch.Tensor:
    """[B] bool: the local policy finds the sequence plausible (mean logprob >= min_mean)."""
    has_tokens = valid.any(-1)
    return ~has_tokens | (mean_logprob(old_logprobs, valid) >= min_mean)
