"""Reasoning-gym adapter: sources named `rg:<dataset>` with the dataset's own scorer.

Invariants:
- A reference (seed, index) maps to dataset seed `blake2b("swarm-rg:<name>:<seed>")`
  (31 bits) and item `index`. reasoning-gym seeds item i with `dataset_seed + i`, so raw
  seeds 0 and 1 would give overlapping streams; hashing the seed keeps node streams apart.
- Indices are bounded by `RG_SIZE` (items are generated lazily, so the size costs nothing).
- Correctness is `dataset.score_answer(answer, entry)` on the regenerated entry, clamped
  to [0, 1] (NaN -> 0); it may be slow, so the registry runs it under a time limit.
- Only built-in (default) dataset configurations are used: a reference carries no options,
  so every receiver must regenerate with the same defaults.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import Any

from rewards.tasks import RG_PREFIX, Task, _check_range
from swarm.messages import TaskRef

RG_SIZE = 2**31 - 1
"""Exclusive upper bound of a reasoning-gym task index."""

ANSWER_INSTRUCTION = "\nGive only the final answer, between <answer> and </answer>.\n"
"""Appended to every reasoning-gym question so answers can be extracted."""


def dataset_names() -> list[str]:
    """Every dataset name the installed reasoning-gym registers."""
    import reasoning_gym.factory as factory

    return sorted(factory.DATASETS)


def _dataset_seed(name: str, seed: int) -> int:
    digest = hashlib.blake2b(f"swarm-rg:{name}:{seed}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


@lru_cache(maxsize=64)
def _dataset(name: str, seed: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=_dataset_seed(name, seed), size=RG_SIZE)


@lru_cache(maxsize=4096)
def _entry(name: str, seed: int, index: int) -> dict[str, Any]:
    return _dataset(name, seed)[index]


class RgSource:
    """One reasoning-gym dataset as a `TaskSource`."""

    answer_pattern = r"(?s).*\S.*"
    slow_scoring = True

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self.name = RG_PREFIX + dataset

    def make(self, seed: int, index: int) -> Task:
        _check_range(seed, index, RG_SIZE - 1)
        entry = _entry(self.dataset, seed, index)
        return Task(
            TaskRef(self.name, seed, index),
            str(entry["question"]) + ANSWER_INSTRUCTION,
            str(entry["answer"]),
        )

    def score_answer(self, task: Task, answer: str) -> float:
        entry = _entry(self.dataset, task.ref.seed, task.ref.index)
        value = float(_dataset(self.dataset, task.ref.seed).score_answer(answer, entry))
        return 0.0 if math.isnan(value) else min(1.0, max(0.0, value))

    def __repr__(self) -> str:
        return f"RgSource({self.dataset!r})"


@lru_cache(maxsize=256)
def get_rg_source(dataset: str) -> RgSource:
    """The adapter for one dataset; `KeyError` if reasoning-gym has no such dataset."""
    names = dataset_names()
    if dataset not in names:
        raise KeyError(f"unknown reasoning-gym dataset {dataset!r}; known: {', '.join(names)}")
    return RgSource(dataset)
