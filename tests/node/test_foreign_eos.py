"""What of a peer's group reaches the trainer: its EOS bits (per `train.foreign_trajectory`
and `foreign_eos`) and its texts (per `train.foreign_text`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.learner import ExternalGroup
from node.policy_learner import PolicyLearner
from policy.trainer import TrainGroup
from swarm.config import parse_config


def _seen_by_trainer(tmp_path: Path, train: dict[str, Any], external: ExternalGroup) -> TrainGroup:
    config = parse_config(
        {
            "node": {"name": "n", "data_dir": str(tmp_path)},
            "transport": {"type": "memory"},
            "model": {"name_or_path": "builtin:tiny", "seed": 0},
            "train": train,
        }
    )
    learner = PolicyLearner(config)
    seen: list[list[TrainGroup]] = []
    real_step = learner.trainer.step

    def spy(groups: list[TrainGroup]) -> Any:
        seen.append(groups)
        return real_step(groups)

    learner.trainer.step = spy  # type: ignore[method-assign]
    learner.train([], [external])
    (group,) = seen[0]
    assert not group.local
    return group


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({}, [True, False]),  # the default `ended` rule needs them
        ({"foreign_trajectory": "whole"}, [True, False]),
        ({"foreign_trajectory": "text"}, None),
        ({"foreign_trajectory": "text", "foreign_eos": True}, [True, False]),
    ],
)
def test_foreign_finished_bits_follow_the_config(
    tmp_path: Path, train: dict[str, Any], expected: list[bool] | None
) -> None:
    external = ExternalGroup("peer", "3=", ("3", "4"), (1.0, 0.0), (True, False))
    assert _seen_by_trainer(tmp_path, train, external).finished == expected


@pytest.mark.parametrize("foreign_text", ["canonical", "as_sent"])
def test_peer_texts_reach_the_trainer_in_the_form_the_reward_reads(
    tmp_path: Path, foreign_text: str
) -> None:
    sent = ("3 ", "4\nxyz", " <answer>3</answer> tail")
    external = ExternalGroup("peer", "3=", sent, (1.0, 0.0, 1.0), (True, True, True))
    group = _seen_by_trainer(tmp_path, {"foreign_text": foreign_text}, external)
    canonical = ["3", "4", "<answer>3</answer>"]
    assert group.completions == (canonical if foreign_text == "canonical" else list(sent))


def test_a_canonicalized_text_does_not_take_the_peers_logprobs(tmp_path: Path) -> None:
    """Issue 33: with foreign_text = "canonical" and peer_offpolicy = "tis", the peer's
    logprobs for the text it sent were applied to the canonicalized text (only the token
    count was checked): a leading-space answer got another token's logprob."""
    config = {"foreign_text": "canonical", "peer_offpolicy": "tis"}
    ours = PolicyLearner(  # the family a peer of our base and tokenizer claims
        parse_config(
            {
                "node": {"name": "n", "data_dir": str(tmp_path / "f")},
                "transport": {"type": "memory"},
                "model": {"name_or_path": "builtin:tiny", "seed": 0},
            }
        )
    ).model_family
    external = ExternalGroup(
        "peer", "3=", (" 3", "4"), (1.0, 0.0), (True, True),
        model_family=ours, sampler_logprobs=((-0.5, -0.1), (-0.7, -0.2)),
    )  # fmt: skip
    group = _seen_by_trainer(tmp_path, config, external)
    assert group.completions == ["3", "4"]
    assert group.sampler_logprobs == [[], [-0.7, -0.2]]  # " 3" became "3": none for it
