"""The wire's EOS bit reaches the trainer only when `train.foreign_eos` asks for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.learner import ExternalGroup
from node.policy_learner import PolicyLearner
from policy.trainer import TrainGroup
from swarm.config import parse_config


@pytest.mark.parametrize("foreign_eos", [False, True])
def test_foreign_finished_bits_follow_the_config(tmp_path: Path, foreign_eos: bool) -> None:
    config = parse_config(
        {
            "node": {"name": "n", "data_dir": str(tmp_path)},
            "transport": {"type": "memory"},
            "model": {"name_or_path": "builtin:tiny"},
            "train": {"foreign_eos": foreign_eos},
        }
    )
    learner = PolicyLearner(config)
    seen: list[list[TrainGroup]] = []
    real_step = learner.trainer.step

    def spy(groups: list[TrainGroup]) -> Any:
        seen.append(groups)
        return real_step(groups)

    learner.trainer.step = spy  # type: ignore[method-assign]
    external = ExternalGroup("peer", "3=", ("3", "4"), (1.0, 0.0), (True, False))
    learner.train([], [external])
    (group,) = seen[0]
    assert not group.local
    assert group.finished == ([True, False] if foreign_eos else None)
