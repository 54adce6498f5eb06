"""A scenario's warm-started base: nodes built from different random inits become one
model family once the base is loaded (so they may use each other's sampler logprobs)."""

from __future__ import annotations

from pathlib import Path

from node.policy_learner import PolicyLearner
from policy.loading import model_family
from simnet.base_model import apply_base, base_state
from simnet.scenario import WarmStartSpec
from swarm.config import parse_config


def _learner(tmp_path: Path, seed: int) -> PolicyLearner:
    return PolicyLearner(
        parse_config(
            {
                "node": {"name": f"n{seed}", "data_dir": str(tmp_path / str(seed))},
                "transport": {"type": "memory"},
                "model": {"name_or_path": "builtin:tiny", "seed": seed},
            }
        )
    )


def test_nodes_of_one_base_are_of_one_family(tmp_path: Path) -> None:
    a, b = _learner(tmp_path, 1), _learner(tmp_path, 2)
    assert a.model_family != b.model_family  # different random inits
    state = base_state("builtin:tiny", 7, WarmStartSpec(steps=1, batch=4))
    for learner in (a, b):
        apply_base(learner, state)
    assert a.model_family == b.model_family == model_family(a.model)
    other = base_state("builtin:tiny", 8, WarmStartSpec(steps=1, batch=4))
    apply_base(b, other)
    assert a.model_family != b.model_family  # another base, another family
