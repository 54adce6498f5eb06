"""The KL reference policy of a trainer with `train.beta > 0`.

Invariants: with beta = 0 there is no reference (no copy, no forward). LoRA in one
process: the reference is the base, the policy model itself with its adapters off (what
zero-initialized adapters start from; the same after a restart from trained adapters),
run in whatever mode the step set (dropout is off in both), with no second copy. Anything
else (full fine-tuning, or several ranks, whose sharded model cannot run the reference
out of step with the policy's passes): a frozen copy of the model as the trainer got it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


class KLReference:
    """Computes reference logprobs through the trainer's own logprob function."""

    def __init__(self, model: Any, beta: float, one_process: bool) -> None:
        self.model = model
        self.is_base = beta > 0 and one_process and hasattr(model, "disable_adapter")
        self.copy: Any = None
        if beta > 0 and not self.is_base:
            self.copy = copy.deepcopy(model).eval().requires_grad_(False)

    def logprobs(self, logprobs_of: Callable[[Any], torch.Tensor]) -> torch.Tensor | None:
        """`logprobs_of(model)` under the reference, without gradients (None: beta = 0)."""
        with torch.no_grad():
            if self.copy is not None:
                return logprobs_of(self.copy)
            if not self.is_base:
                return None
            with self.model.disable_adapter():
                return logprobs_of(self.model)
