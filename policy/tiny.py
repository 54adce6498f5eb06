"""The built-in tiny model: a character-level tokenizer and a small Qwen2 model, made
locally from a config (no hub, no download).

Invariants:
- `char_tokenizer(chars)` maps each character of `chars` to one id (after the special
  tokens `<pad>`, `<eos>`, `<unk>`); any other character encodes to `<unk>`. Encoding then
  decoding (skipping special tokens) returns the text unchanged when every character is
  in the vocabulary. The tokenizer is a `PreTrainedTokenizerFast` built from a
  `tokenizers.Tokenizer` object; `load_char_tokenizer` reloads a saved one explicitly,
  because `AutoTokenizer` on a saved Qwen2 directory picks `Qwen2Tokenizer`, whose
  normalizer changes the text.
- `build_tiny_model(variant, seed)` is deterministic on every machine: the model is
  created on the CPU in float32 and every parameter is re-drawn in sorted-name order from
  one `torch.Generator` seeded with `seed` (normal(0, 0.02) for matrices, 1 for norm
  weights, 0 for biases), independent of transformers' own init code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
"""Special tokens, ids 0, 1, 2 in that order."""

TINY_CHARS = " \n0123456789+-*=<>?:.,abcdefghijklmnopqrstuvwxyz"
"""Characters of the built-in vocabulary: enough for every built-in task."""

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class TinyVariant:
    """Architecture of one built-in model."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


TINY_VARIANTS: dict[str, TinyVariant] = {
    "tiny": TinyVariant(128, 512, 4, 4, 2),
    "tiny-2x": TinyVariant(192, 576, 5, 6, 2),
}
"""`builtin:tiny` (~0.99M parameters) and `builtin:tiny-2x` (~2.3M), a bigger sibling for
heterogeneous swarms (a different model family)."""


def char_tokenizer(chars: str = TINY_CHARS) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over `chars` (unique characters, in this order)."""
    if len(set(chars)) != len(chars):
        raise ValueError("tokenizer characters must be unique")
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *chars))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.padding_side = "left"
    return tok


def load_char_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Reload a tokenizer saved by `save_pretrained` from `char_tokenizer`."""
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.padding_side = "left"
    return tok


def tiny_config(variant: str, vocab_size: int) -> Qwen2Config:
    """The `Qwen2Config` of a built-in variant."""
    try:
        v = TINY_VARIANTS[variant]
    except KeyError:
        raise KeyError(
            f"unknown built-in model {BUILTIN_PREFIX}{variant}; known: "
            + ", ".join(BUILTIN_PREFIX + k for k in TINY_VARIANTS)
        ) from None
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_hidden_layers=v.num_hidden_layers,
        num_attention_heads=v.num_attention_heads,
        num_key_value_heads=v.num_key_value_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        rope_theta=10000.0,
    )


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter deterministically (see the module docstring)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if name.endswith("bias"):
            values = torch.zeros(param.shape)
        elif param.dim() == 1:
            values = torch.ones(param.shape)
        else:
            values = torch.randn(param.shape, generator=gen) * 0.02
        param.copy_(values.to(param.dtype))


def build_tiny_model(variant: str = "tiny", seed: int = 0) -> Qwen2ForCausalLM:
    """A freshly initialized built-in model on the CPU, float32, in eval mode."""
    config = tiny_config(variant, len(SPECIAL_TOKENS) + len(TINY_CHARS))
    torch_state = torch.random.get_rng_state()
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(torch_state)  # building must not disturb the global RNG
    init_weights(model, seed)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    return model.eval()


def build_tiny(name: str, seed: int = 0) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """`builtin:<variant>` -> (model, tokenizer)."""
    if not name.startswith(BUILTIN_PREFIX):
        raise ValueError(f"not a built-in model id: {name!r}")
    return build_tiny_model(name[len(BUILTIN_PREFIX) :], seed), char_tokenizer()
