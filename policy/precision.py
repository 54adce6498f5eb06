"""Numerics of training: parameter dtype vs compute dtype, threads, learning-rate schedule.

Invariants:
- `parameter_dtype(config)` is float32 whenever `config.master_weights` is set, whatever
  the compute dtype: AdamW's updates at a real-model learning rate (1e-6 .. 1e-5) are far
  below bf16's resolution (8 bits of mantissa), so bf16 parameters round most of them
  to nothing.
- `compute_context(device, compute, params)` is autocast to the compute dtype when it
  differs from the parameter dtype, else a no-op; every forward of the trainer and of the
  transformers sampler runs inside it, so both see the same numerics.
- `lr_factor` is a pure function of the optimizer step: linear warm-up from 0, then
  constant or a linear / cosine decay to `min_lr_ratio` at `schedule_steps`, held after.
- `share_changed(before, model)` is the fraction of elements of `before`'s tensors that
  differ in the model now (how much one update moved; the bf16 tests and benchmarks).
- `configure_threads(n, small_model)` sets torch's intra-op threads for the process
  (0: one for the built-in models, else torch's default, which `OMP_NUM_THREADS` sets).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

from swarm.config.learning import ModelConfig, TrainConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype(config: ModelConfig) -> torch.dtype:
    return DTYPES[config.dtype]


def parameter_dtype(config: ModelConfig) -> torch.dtype:
    return torch.float32 if config.master_weights else DTYPES[config.dtype]


@contextlib.contextmanager
def compute_context(
    device: torch.device, compute: torch.dtype, params: torch.dtype
) -> Iterator[None]:
    """Autocast to `compute` when it differs from the parameters' dtype."""
    if compute == params:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=compute):
        yield


def configure_threads(threads: int, small_model: bool = False) -> int:
    """Set torch's CPU threads: `threads` when > 0; for 0 (auto), one thread for a small
    model (its ops are too small to split: more threads only contend), else torch's own
    default (`OMP_NUM_THREADS`, or one per core). Returns the number in effect."""
    n = threads if threads > 0 else (1 if small_model else torch.get_num_threads())
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def lr_factor(step: int, config: TrainConfig) -> float:
    """Multiplier of `learning_rate` for optimizer step `step` (0-based)."""
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return 1.0
    span = max(config.schedule_steps - config.warmup_steps, 1)
    progress = min(max(step - config.warmup_steps, 0) / span, 1.0)
    floor = config.min_lr_ratio
    if config.lr_schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def share_changed(before: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    """Fraction of the elements of the tensors in `before` that differ in `model` now."""
    changed = total = 0
    for name, tensor in model.state_dict().items():
        if name in before:
            changed += int((tensor != before[name]).sum())
            total += tensor.numel()
    return changed / max(total, 1)
