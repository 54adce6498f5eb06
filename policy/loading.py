"""Loading a policy model and tokenizer, and its model family.

Invariants:
- `builtin:<variant>` is built locally (see `policy.tiny`), deterministic from
  `ModelConfig.seed`. Anything else is a Hugging Face model id or local path loaded with
  `AutoModelForCausalLM` / `AutoTokenizer`, except that a directory whose
  `tokenizer_config.json` names the generic fast tokenizer (as a saved built-in model
  does) gets that class explicitly: `AutoTokenizer` would pick the model type's tokenizer
  and change the text.
- `model_family(model)` hashes the architecture config (without bookkeeping keys such as
  the transformers version, name or dtype, nor any private `_` key:
  `policy.hf_selfcheck.config_text`) and every tensor of the state dict, upcast to
  float32, in sorted-name order. Call it once at load time, before any training: it
  names the initial weights. Equal on every machine for the same weights: each call first
  checks that the config part does not change with the dtype, attention implementation
  or name (`check_family_config`; a transformers version that serializes a new runtime
  key raises, naming it, the version and the pin).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from policy.hf_selfcheck import check_family_config, config_text
from policy.precision import parameter_dtype
from policy.tiny import BUILTIN_PREFIX, build_tiny, load_char_tokenizer
from swarm.config.learning import ModelConfig
from swarm.errors import ModelLoadError

_GENERIC_TOKENIZERS = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def resolve_device(device: str) -> torch.device:
    """`auto` -> CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a model id or path (generic fast tokenizers loaded explicitly)."""
    config_file = Path(name_or_path) / "tokenizer_config.json"
    if config_file.is_file():
        tok_class = json.loads(config_file.read_text()).get("tokenizer_class")
        if tok_class in _GENERIC_TOKENIZERS:
            return load_char_tokenizer(name_or_path)
    tok = AutoTokenizer.from_pretrained(name_or_path)
    tok.padding_side = "left"
    return tok


def load_policy_model(config: ModelConfig) -> tuple[PreTrainedModel, Any]:
    """(model on its device in its parameter dtype, in eval mode; tokenizer).

    Parameters are float32 when `config.master_weights` (see `policy.precision`). A model
    or tokenizer that cannot be loaded raises `ModelLoadError` with one line: the
    reference and the cause (the library's own message, first line).
    """
    device = resolve_device(config.device)
    dtype = parameter_dtype(config)
    if config.name_or_path.startswith(BUILTIN_PREFIX):
        model, tokenizer = build_tiny(config.name_or_path, config.chosen_seed())
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(config.name_or_path, dtype=dtype)
            tokenizer = load_tokenizer(config.name_or_path)
        except (OSError, ValueError, KeyError, ImportError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelLoadError(
                f"cannot load model {config.name_or_path!r}: {first} (model.name_or_path "
                "takes 'builtin:tiny', a local Hugging Face folder, or a hub id this machine "
                "can download or has cached)"
            ) from exc
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # active in the trainer's update forwards only
    model = model.to(device=device, dtype=dtype).eval()
    return model, tokenizer


@torch.no_grad()
def model_family(model: PreTrainedModel) -> str:
    """Hex digest naming architecture + initial weights (see the module docstring)."""
    check_family_config(model.config)
    h = hashlib.sha256()
    h.update(config_text(model.config).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous()
        h.update(f"\0{name}\0{tuple(t.shape)}\0".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:32]
