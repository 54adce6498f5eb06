"""Real-model tests share two threads; the model itself (`smollm2_dir`) comes from
the suite-wide `tests/conftest.py`; `smollm2_short_dir` is it cut to its first layers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.workers import cores_per_worker


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two torch threads for the real model, or fewer where test workers share the
    cores (more threads than cores spin against each other: 4x slower steps measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, cores_per_worker()))
    yield
    torch.set_num_threads(before)


SHORT_LAYERS = 4
"""Layers kept by `smollm2_short`: SmolLM2's first 4 of 30 decoder layers."""


def keep_first_layers(model: torch.nn.Module, layers: int = SHORT_LAYERS) -> torch.nn.Module:
    """`model` (a Llama-style HF causal LM) cut to its first `layers` decoder layers: the
    same attention (grouped queries, rotary), RMSNorm, tied vocabulary and tokenizer, for
    properties that hold layer by layer (an exact equality of two paths, what an optimizer
    step does to each weight) at a fraction of the cost."""
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return model


@pytest.fixture(scope="session")
def smollm2_short_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder of SmolLM2-135M-Instruct cut to its first `SHORT_LAYERS` layers
    (weights as built, tokenizer and chat template kept), loadable by path as a node
    loads any model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2-short")
    model = keep_first_layers(AutoModelForCausalLM.from_pretrained(smollm2_dir))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    return out
