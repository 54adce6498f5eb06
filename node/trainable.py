"""A node's policy made ready to train, the same on every training rank: the model (with
its LoRA adapter), tokenizer, prompt renderer and trainer (`load_trainable`).

Invariants: torch is seeded with the node's model seed before the model loads; under FSDP
the ranks that sample keep a whole copy made before the trainer shards the model (in
host memory when vLLM samples); the trainer is built last, joining the ranks' engine.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from policy.loading import load_policy_model, model_family, resolve_device
from policy.lora import apply_lora, lora_family, lora_settings
from policy.parallel import RankInfo
from policy.precision import compute_dtype
from policy.prompts import PromptRenderer
from policy.trainer import Trainer
from rewards.tasks import solved_examples
from swarm.config import NodeConfig
from swarm.errors import ConfigError


@dataclass
class Trainable:
    """A node's policy made ready to train: what every training rank builds alike."""

    model: Any
    tokenizer: Any
    model_family: str
    lora: dict[str, Any] | None
    """The adapter settings of a LoRA node (None: full fine-tuning)."""
    device: torch.device
    renderer: PromptRenderer
    trainer: Trainer
    whole: Any = None
    """FSDP's rank 0 (and every rank that samples): a whole, unsharded copy of the model
    (made before sharding) that samples, shares deltas and is checkpointed; the trainer's
    own holds shards."""


def load_trainable(
    config: NodeConfig, ranks: RankInfo | None = None, device: torch.device | None = None
) -> Trainable:
    """Loads the model (with its LoRA adapter) and builds its trainer on `device` (default:
    `model.device`); with `ranks`, this process is one of the node's training ranks (the
    trainer joins their engine)."""
    torch.manual_seed(config.model.chosen_seed())  # a node derives an unset one from its key
    model, tokenizer = load_policy_model(config.model)
    family = model_family(model)
    lora = config.model.lora
    if lora.enabled:
        model = apply_lora(model, lora)
        family = lora_family(family, lora)
        if config.model.gradient_checkpointing:
            model.enable_input_require_grads()
    device = device if device is not None else resolve_device(config.model.device)
    try:
        renderer = PromptRenderer(tokenizer, config.prompt, solved_examples)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    whole = None
    sampling_rank = ranks is not None and (ranks.rank == 0 or config.samples_on_every_rank())
    if ranks is not None and ranks.kind == "fsdp" and sampling_rank:
        # requires_grad as the trainer's (deltas and checkpoints go by it). With the vLLM
        # sampler (its own copy on the GPU) it lives in host memory: a 7B model's float32
        # copy would take 28 GB of rank 0's GPU (benchmarks/parallel_memory.py).
        whole = copy.deepcopy(model)
        if config.sampler.backend == "vllm":
            whole = whole.to("cpu")
    trainer = Trainer(
        model,
        tokenizer,
        config.train,
        device,
        config.sampler,
        renderer=renderer,
        compute_dtype=compute_dtype(config.model),
        ranks=ranks,
    )
    return Trainable(
        model,
        tokenizer,
        family,
        lora_settings(lora) if lora.enabled else None,
        device,
        renderer,
        trainer,
        whole,
    )
