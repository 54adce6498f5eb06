"""Group-relative advantages: pure functions of one group's rewards.

For rewards r[0..G-1] of one prompt's G completions:
- baseline `mean`: b = mean(r)               (GRPO, Dr. GRPO)
- baseline `median`: b = r_sorted[(G-1)//2], the lower median, which is always one of the
  samples (MC-GRPO). Exactly one sample holding that value (the first in index order) is
  the *pivot*: its advantage is exactly 0 and `keep_mask` drops it from the batch, so it
  also leaves every loss normalizer. With odd G (MC-GRPO samples G+1) it is the median.
- scale `group`: A = (r - b) / (std(r) + eps), std the unbiased sample std over all G
  samples (as TRL; used for both baselines: the median absolute deviation is 0 for most
  binary-reward groups); scale `batch`: A = (r - b) / (s + eps), s the unbiased std of
  every reward of the step's groups (`batch_std`; TRL's `scale_rewards = "batch"`);
  scale `none`: A = r - b (Dr. GRPO).
Degenerate groups (a single sample, or all rewards equal) get all-zero advantages and
never NaN. Non-finite rewards are refused with ValueError.
"""

from __future__ import annotations

from typing import Literal

import torch

Baseline = Literal["mean", "median"]
Scale = Literal["group", "batch", "none"]


def _check(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() == 0:
        raise ValueError("rewards must be a non-empty 1-D tensor")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite")
    return rewards.to(torch.float32)


def is_degenerate(rewards: torch.Tensor) -> bool:
    """A group that carries no GRPO signal: one sample or all rewards equal."""
    r = _check(rewards)
    return r.numel() < 2 or bool((r == r[0]).all())


def pivot_index(rewards: torch.Tensor) -> int:
    """Index of MC-GRPO's pivot: the first sample equal to the lower median."""
    r = _check(rewards)
    median = r.sort().values[(r.numel() - 1) // 2]
    return int((r == median).nonzero()[0, 0])


def batch_std(groups: list[torch.Tensor]) -> float:
    """The unbiased std of every reward of `groups` together (0.0 below 2 rewards): what
    scale `batch` divides by."""
    rewards = [_check(g) for g in groups]
    if sum(g.numel() for g in rewards) < 2:
        return 0.0
    return float(torch.cat(rewards).std())


def group_advantages(
    rewards: torch.Tensor,
    baseline: Baseline = "mean",
    scale: Scale = "group",
    eps: float = 1e-4,
    batch: float | None = None,
) -> torch.Tensor:
    """Advantages [G] of one group (see the module docstring); `batch` is `batch_std` of
    the step's groups, needed by scale `batch`."""
    r = _check(rewards)
    if is_degenerate(r):
        return torch.zeros_like(r)
    if baseline == "mean":
        centered = r - r.mean()
    elif baseline == "median":
        centered = r - r[pivot_index(r)]
    else:
        raise ValueError(f"unknown baseline {baseline!r}")
    if scale == "group":
        return centered / (r.std() + eps)
    if scale == "batch":
        if batch is None:
            raise ValueError("scale 'batch' needs the step's batch_std")
        return centered / (batch + eps)
    if scale == "none":
        return centered
    raise ValueError(f"unknown scale {scale!r}")


def keep_mask(rewards: torch.Tensor, baseline: Baseline = "mean") -> torch.Tensor:
    """Which samples enter the loss: all, except MC-GRPO's pivot for `median`."""
    r = _check(rewards)
    keep = torch.ones(r.numel(), dtype=torch.bool)
    if baseline == "median" and r.numel() > 1:
        keep[pivot_index(r)] = False
    return keep
