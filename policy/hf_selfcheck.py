"""What `policy` relies on inside transformers and PEFT beyond their public API, each
checked where it is used, failing loudly (issue 34).

Invariants:
- The model family's config part (`policy.loading.config_text`) does not depend on what
  differs between machines that load the same weights: the dtype, the attention
  implementation, the name or path. `check_family_config` proves it on the loaded model's
  own config (rebuilt with other values through the public `from_dict`) whenever a family
  is computed; a transformers version that serializes a new runtime key raises
  `LibraryInternalsChanged` naming the key, instead of splitting the swarm's families
  (nodes would silently stop exchanging weight deltas).
- A PEFT model's state-dict names map onto its base model's names exactly as
  `policy.lora.merge_lora_tensors` assumes (`base_model.model.` prefix, `.base_layer.`,
  `lora_A/B.default`): `check_lora_layout` runs in `apply_lora` and raises otherwise (an
  export would drop or misname adapters).
- Speed-ups with an exact fallback only degrade (`swarm.internals.degraded`: one WARNING
  naming version and pin, then counted): `attention_implementation` (the config's private
  `_attn_implementation`, which no public getter exposes; without it the packed logprobs
  path is off) and `no_split_module_names` (the private `_no_split_modules` that names a
  model's transformer blocks; without it FSDP shards the model as one unit), and
  `cpu_attention_without_kv_copies` (below).
- `cpu_attention_without_kv_copies` lets transformers' SDPA attention hand grouped-query
  keys/values to torch as they are (`enable_gqa`) on CPU tensors with a mask too, instead
  of copying each key/value head once per query head first (`repeat_kv`): transformers
  allows it only without a mask, a rule for CUDA kernels, and then decoding a long prompt
  on CPU spends most of its time copying keys and values (SmolLM2's 3 key/value heads
  for 9 query heads). The same numbers: torch's own GQA is the repeat done inside the
  kernel. It replaces the module's `use_gqa_in_sdpa` (a function transformers looks up
  at each call) with one that says yes for CPU tensors and asks the original otherwise;
  without that function it is a degraded no-op.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from swarm.internals import Reaches, degraded

TRANSFORMERS = ("transformers", ("transformers",), "transformers>=5.0,<5.20")
PEFT = ("PEFT", ("peft",), "peft>=0.17,<0.22")
"""(library, distributions, pin as in pyproject.toml)."""

CONFIG_BOOKKEEPING = frozenset(
    {
        "transformers_version",
        "name_or_path",
        "dtype",
        "torch_dtype",
        "architectures",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
)
"""Public config keys that say how a model was saved or is run, not what it computes.
Every key starting with `_` is transformers' private bookkeeping and left out too."""

PEFT_PREFIX = "base_model.model."
ADAPTER = "default"


def config_text(config: Any) -> str:
    """The architecture part of a model family: the config without bookkeeping keys."""
    kept = {
        k: v
        for k, v in config.to_dict().items()
        if k not in CONFIG_BOOKKEEPING and not k.startswith("_")
    }
    return json.dumps(kept, sort_keys=True, default=str)


def check_family_config(config: Any) -> None:
    """Raise `LibraryInternalsChanged` if `config_text(config)` changes with the dtype,
    the attention implementation or the name or path (see the module docstring)."""
    reference = json.loads(config_text(config))
    source = config.to_dict()
    variants = {
        "attention implementation eager": {"attn_implementation": "eager"},
        "attention implementation sdpa": {"attn_implementation": "sdpa"},
        "dtype bfloat16": {"dtype": "bfloat16"},
        "dtype float16": {"dtype": "float16"},
        "another name_or_path": {"name_or_path": "elsewhere/model"},
    }
    r = Reaches(*TRANSFORMERS)
    for what, kwargs in variants.items():
        try:
            other = json.loads(config_text(type(config).from_dict(dict(source), **kwargs)))
        except Exception as exc:  # noqa: BLE001 - any failure is the change reported
            r.problem(f"{type(config).__name__}.from_dict(..., {kwargs}) fails: {exc!r}",
                      "policy/loading.py model_family")  # fmt: skip
            continue
        keys = sorted(
            k for k in reference.keys() | other.keys() if reference.get(k) != other.get(k)
        )
        if keys:
            r.problem(
                f"{type(config).__name__}.to_dict() changes with the {what} in "
                f"{', '.join(keys)} (add bookkeeping keys to "
                "policy.hf_selfcheck.CONFIG_BOOKKEEPING, or families differ per machine)",
                "policy/loading.py model_family",
            )
    r.raise_if_missing()


def attention_implementation(config: Any) -> str | None:
    """The attention implementation a model runs (`config._attn_implementation`, which
    transformers sets and reads itself); None, degraded, if the config has none."""
    try:
        return config._attn_implementation
    except AttributeError:
        degraded(
            *TRANSFORMERS,
            f"{type(config).__name__} has no _attn_implementation (used by "
            "policy/token_logprobs.py): the packed logprobs path is off, each completion "
            "is computed with its whole prompt",
        )
        return None


def no_split_module_names(modules: Iterable[Any]) -> set[str]:
    """The class names a Hugging Face model names as its blocks (`_no_split_modules`,
    through any PEFT wrapper); empty, degraded, if transformers dropped the attribute."""
    from transformers import PreTrainedModel

    if not hasattr(PreTrainedModel, "_no_split_modules"):
        degraded(
            *TRANSFORMERS,
            "PreTrainedModel has no _no_split_modules (used by policy/parallel.py): FSDP "
            "shards each model as one unit, so every rank gathers it whole at once",
        )
        return set()
    names: set[str] = set()
    for module in modules:
        names.update(getattr(module, "_no_split_modules", None) or [])
    return names


def merged_name(peft_name: str) -> str | None:
    """The base model's name for a PEFT state-dict entry, None for an adapter tensor."""
    name = peft_name.removeprefix(PEFT_PREFIX)
    if any(name.endswith(f".{part}.{ADAPTER}.weight") for part in ("lora_A", "lora_B")):
        return None
    return name.replace(".base_layer.", ".")


def check_lora_layout(peft_names: Iterable[str], base_names: Iterable[str]) -> None:
    """Raise `LibraryInternalsChanged` unless a PEFT model's state-dict names (after
    `get_peft_model`) map onto its base model's names (before) as `merged_name` says, with
    an `A` and a `B` adapter for at least one module (see the module docstring)."""
    peft_names, base = list(peft_names), set(base_names)
    merged = {m for m in (merged_name(n) for n in peft_names) if m is not None}
    adapters = [n for n in peft_names if merged_name(n) is None]
    r = Reaches(*PEFT)
    where = "policy/lora.py merge_lora_tensors"
    if merged != base:
        extra, lost = sorted(merged - base)[:3], sorted(base - merged)[:3]
        r.problem(f"a LoRA model's tensor names no longer map onto the base model's "
                  f"(unknown: {extra}, missing: {lost})", where)  # fmt: skip
    if not any(n.endswith(f".lora_A.{ADAPTER}.weight") for n in adapters) or not any(
        n.endswith(f".lora_B.{ADAPTER}.weight") for n in adapters
    ):
        r.problem(f"no adapter tensors named *.lora_A.{ADAPTER}.weight / "
                  f"*.lora_B.{ADAPTER}.weight", where)  # fmt: skip
    r.raise_if_missing()


def cpu_attention_without_kv_copies() -> bool:
    """Let SDPA attention use torch's grouped-query path on CPU with a mask (see the
    module docstring); idempotent. False, degraded, where transformers has no such rule."""
    from transformers.integrations import sdpa_attention

    original = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if original is None:
        degraded(
            *TRANSFORMERS,
            "transformers.integrations.sdpa_attention has no use_gqa_in_sdpa (replaced by "
            "policy/hf_selfcheck.py): CPU attention copies grouped key/value heads",
        )
        return False
    if getattr(original, "_swarm_cpu_gqa", False):
        return True

    def use_gqa_in_sdpa(attention_mask: Any, key: Any, value: Any) -> bool:
        if key.device.type == "cpu" and key.shape[-1] == value.shape[-1]:
            return True
        return bool(original(attention_mask, key, value))

    use_gqa_in_sdpa._swarm_cpu_gqa = True  # type: ignore[attr-defined]
    use_gqa_in_sdpa._swarm_original = original  # type: ignore[attr-defined]
    sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa
    return True
