"""What `swarm init` and `swarm demo` add to the config models' defaults.

Invariants:
- No learning settings live here: the config models' defaults are the one set that
  learns (`swarm.config.learning`, issue 34); `swarm init` and `swarm demo` write only
  what is a node's own (name, data dir, transport, seeds where asked for).
- `fresh_seeds(rng)` draws a model and a task seed from `rng` (`swarm init --seed`);
  without it, seeds are left unset and each node derives its own from its key.
- Seeds stay below 2**53 so every JSON/JS peer reads them exactly (`docs/wire.md`).
"""

from __future__ import annotations

import random
from typing import Any

MAX_FRESH_SEED = 2**53 - 1


def fresh_seeds(rng: random.Random) -> dict[str, Any]:
    """Distinct model and task seeds for a new node, drawn from `rng`."""
    return {
        "model": {"seed": rng.randint(0, MAX_FRESH_SEED)},
        "tasks": {"seed": rng.randint(0, MAX_FRESH_SEED)},
    }


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
