"""What a config may name as its model, checked at config load (no torch, no network).

Invariants:
- `builtin:<variant>` must be one of `BUILTIN_MODELS` (built by `policy.tiny`, which
  asserts it builds exactly these).
- A reference that looks like a local path (absolute, `~`, `./`, `../`, more than one
  `/`, or an existing file) must be a directory holding `config.json`, or the config is
  refused with the path and the fix. Anything else is a Hugging Face hub id, which is
  accepted here (it may still be downloaded, or already be in the local cache); loading
  it later fails in one line if it cannot be found.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("tiny", "tiny-2x")
"""Variants of the built-in character model (`policy.tiny.TINY_VARIANTS`)."""

DEFAULT_SYSTEM_PROMPT = "Answer with only the final answer inside <answer></answer> tags."
"""The chat-mode system prompt: asks for the answer block the rewards read (with the
examples of `prompt.few_shot`, measured on SmolLM2-135M-Instruct: see `policy.prompts`)."""


def looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", "~", "./", "../", "."))
        or name.count("/") > 1
        or name.endswith("/")
        or Path(name).expanduser().exists()
    )


def check_model_reference(name: str) -> None:
    """Raise `ValueError` (naming the fix) for a model reference that cannot load."""
    if not name.strip():
        raise ValueError("model.name_or_path is empty: use 'builtin:tiny', a hub id or a path")
    if name.startswith(BUILTIN_PREFIX):
        variant = name[len(BUILTIN_PREFIX) :]
        if variant not in BUILTIN_MODELS:
            known = ", ".join(BUILTIN_PREFIX + v for v in BUILTIN_MODELS)
            raise ValueError(f"unknown built-in model {name!r}; known: {known}")
        return
    if not looks_like_path(name):
        return
    path = Path(name).expanduser()
    if not path.exists():
        raise ValueError(
            f"model path {name!r} does not exist on this machine: give the folder that "
            "holds config.json (e.g. one written by `swarm export`), or a hub id like "
            "'HuggingFaceTB/SmolLM2-135M-Instruct'"
        )
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model path {name!r} has no config.json: it must be a Hugging Face model "
            "folder (save_pretrained / `swarm export` output)"
        )
