"""The settings a new node starts from: `swarm init` and `swarm demo` share them.

Invariants:
- `learning_settings()` is what makes the built-in model learn alone from scratch on a
  CPU (the `digit` task: echo a digit, then stop; it must learn to read its prompt), as
  `tests/cli/test_init_learns.py` checks by training an init config as a silo.
- `fresh_seeds(rng)` draws the model and task seeds from the OS's randomness (or the
  given RNG): two configs written by `swarm init` never sample identical rollouts.
- Seeds stay below 2**53 so every JSON/JS peer reads them exactly (`docs/wire.md`).
"""

from __future__ import annotations

import random
import secrets
from typing import Any

MAX_FRESH_SEED = 2**53 - 1


def learning_settings() -> dict[str, Any]:
    """Config sections (partial) that learn on `builtin:tiny` from scratch."""
    return {
        "model": {"name_or_path": "builtin:tiny"},
        "tasks": {"mixture": [{"source": "digit", "weight": 1.0}]},
        "sampler": {"group_size": 8, "max_new_tokens": 2},
        # Without the entropy bonus, 3 of 4 seeds settled within 300 rounds on one answer
        # for every prompt (reward ~0.6 of 1.5), after which no group differs in reward
        # and GRPO stops learning; with 0.1, all 4 went on (0.94-1.35 by round 600).
        "train": {"learning_rate": 3e-4, "entropy_coef": 0.1},
        "rewards": {"format_weight": 0.5},
    }


def fresh_seeds(rng: random.Random | None = None) -> dict[str, Any]:
    """Distinct model and task seeds for a new node."""
    draw = (
        (lambda: rng.randint(0, MAX_FRESH_SEED))
        if rng
        else (lambda: secrets.randbelow(MAX_FRESH_SEED + 1))
    )
    return {"model": {"seed": draw()}, "tasks": {"seed": draw()}}


def merge(*parts: dict[str, Any]) -> dict[str, Any]:
    """Merge partial configs section by section (later parts win per key)."""
    out: dict[str, Any] = {}
    for part in parts:
        for section, values in part.items():
            if isinstance(values, dict):
                out.setdefault(section, {}).update(values)
            else:
                out[section] = values
    return out
