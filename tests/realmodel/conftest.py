"""Real-model tests share two threads; the model itself (`smollm2_dir`) comes from
the suite-wide `tests/conftest.py`."""

from __future__ import annotations

from collections.abc import Iterator

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
