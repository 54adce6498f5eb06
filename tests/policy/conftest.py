"""Fixtures for the policy tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Pin torch to one thread: tiny-model ops are faster than with two contended threads,
    and results do not depend on the machine's core count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
