"""The KL reference policy of a trainer with `train.beta > 0`.

Invariants:
- With beta = 0 there is no reference (no copy, no forward).
- LoRA: the reference is the base, the policy model itself with its adapters off (what
  zero-initialized adapters start from; the same after a restart from trained adapters),
  with no second copy, on any number of ranks: under FSDP its forwards go through the
  policy's own engine (which gathers the base's shards), under DDP through the bare
  replica (no collective).
- Full fine-tuning: a frozen copy of the model as the trainer got it, taken before the
  policy's engine shards it. Across ranks every rank's copy is rank 0's (broadcast: a rank
  may have loaded other initial weights, which rank 0's replace); under FSDP the copy is
  sharded like the policy (its own engine), so a rank holds 1/ranks of it.
- Every rank runs the same reference forwards in the same order (one per gradient pass,
  empty passes included: `policy.parallel`), so an engine's all-gathers stay in step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from policy.parallel import ParallelModel


class KLReference:
    """Computes reference logprobs through the trainer's own logprob function.

    Build it before the policy's engine (the copy must be of the whole model), then give
    it the engine with `join` when there is one."""

    def __init__(self, model: Any, beta: float) -> None:
        self.model = model
        self.is_base = beta > 0 and hasattr(model, "disable_adapter")
        self.copy: Any = None
        if beta > 0 and not self.is_base:
            self.copy = copy.deepcopy(model).eval().requires_grad_(False)
        self._policy_engine: ParallelModel | None = None
        self._copy_engine: ParallelModel | None = None

    def join(self, engine: ParallelModel) -> None:
        """Runs across the policy's ranks: the copy made equal to rank 0's and, under FSDP,
        sharded (all ranks call, in the same order)."""
        self._policy_engine = engine
        if self.copy is None:
            return
        if engine.info.kind == "fsdp":
            self._copy_engine = ParallelModel(self.copy, engine.info)  # broadcasts, shards
        else:
            with torch.no_grad():
                for tensor in list(self.copy.parameters()) + list(self.copy.buffers()):
                    dist.broadcast(tensor.data, src=0)

    @property
    def enabled(self) -> bool:
        return self.is_base or self.copy is not None

    def logprobs(self, logprobs_of: Callable[[Any], torch.Tensor]) -> torch.Tensor | None:
        """`logprobs_of(model)` under the reference, without gradients (None: beta = 0)."""
        if not self.enabled:
            return None
        with torch.no_grad():
            if self.copy is not None:
                return _through(self._copy_engine, self.copy, logprobs_of)
            with self.model.disable_adapter():
                return _through(self._policy_engine, self.model, logprobs_of)


def _through(
    engine: ParallelModel | None, model: Any, fn: Callable[[Any], torch.Tensor]
) -> torch.Tensor:
    return fn(model) if engine is None else engine.plain_compute(fn)
