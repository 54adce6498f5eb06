"""LoRA adapters through PEFT: wrapping, merging, and what a LoRA checkpoint holds.

Invariants:
- `apply_lora` wraps a base model in a PEFT `LoraConfig` (dropout 0, no bias) with the
  adapters initialized from a fixed seed (`LORA_INIT_SEED`) inside a forked RNG: every
  node of the same base and adapter shape starts from identical adapters (so adapter
  deltas mean the same thing on each), and the caller's RNG stream is untouched. Only the
  adapters require grad.
- `lora_family(base_family, config)` names base weights + adapter shape + scaling: weight
  deltas cross only between equal families.
- `merge_lora_tensors` is pure: from a PEFT state dict (`base_model.model.` prefix,
  `.base_layer.` weights, `lora_A/B.default` pairs) to the base model's own names with
  W' = W + scaling * B @ A, computed in float32 and cast back to W's dtype. That naming
  is PEFT's internal layout, not its API: `apply_lora` checks it on every model it wraps
  (`policy.hf_selfcheck.check_lora_layout`, raising with PEFT's version and pin).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from policy.hf_selfcheck import ADAPTER, PEFT_PREFIX, check_lora_layout, merged_name
from swarm.config.learning import LoraConfig

LORA_INIT_SEED = 0x5A12


def lora_settings(config: LoraConfig) -> dict[str, Any]:
    """What a LoRA checkpoint's `lora.json` says (and the family hashes)."""
    return {
        "rank": config.rank,
        "alpha": config.alpha,
        "scaling": config.alpha / config.rank,
        "target_modules": sorted(config.target_modules),
    }


def apply_lora(model: Any, config: LoraConfig) -> Any:
    """`model` wrapped with fresh, deterministic LoRA adapters (a `PeftModel`)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets: Any = config.target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    peft_config = PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    base_names = list(model.state_dict())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(LORA_INIT_SEED)
        wrapped = get_peft_model(model, peft_config)
    check_lora_layout(wrapped.state_dict(), base_names)
    return wrapped


def lora_family(base_family: str, config: LoraConfig) -> str:
    text = json.dumps({"base": base_family, **lora_settings(config)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def merge_lora_tensors(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter merged in (see the docstring)."""
    out: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        merged = merged_name(key)
        if merged is not None:
            out[merged] = tensor
            continue
        name = key.removeprefix(PEFT_PREFIX)
        for part in ("lora_A", "lora_B"):
            marker = f".{part}.{ADAPTER}.weight"
            if name.endswith(marker):
                pairs.setdefault(name[: -len(marker)], {})[part] = tensor
    for module, pair in pairs.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise ValueError(f"{module}: a LoRA pair is incomplete ({sorted(pair)})")
        weight_name = f"{module}.weight"
        if weight_name not in out:
            raise ValueError(f"{module}: adapter without a base weight")
        base = out[weight_name]
        delta = (pair["lora_B"].float() @ pair["lora_A"].float()) * scaling
        out[weight_name] = (base.float() + delta).to(base.dtype)
    return out


def merged_state_dict(model: Any, scaling: float) -> dict[str, torch.Tensor]:
    """A `PeftModel`'s weights merged into its base model's names (for export)."""
    return merge_lora_tensors({k: v.detach() for k, v in model.state_dict().items()}, scaling)
