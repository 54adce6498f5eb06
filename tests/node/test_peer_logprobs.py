"""Sampler logprobs from our samples to the wire, and from a peer's group to the trainer:
only within our model family, lined up with the tokens the trainer trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.learner import ExternalGroup, LocalGroup
from node.policy_learner import PolicyLearner
from policy.trainer import TrainGroup
from swarm.config import parse_config
from swarm.messages import RolloutGroup, TaskRef
from swarm.token_arrays import MAX_LOGPROB_TOKENS


def _local(logprobs: tuple[tuple[float, ...], ...]) -> LocalGroup:
    return LocalGroup(
        TaskRef("add", 1, 2), "1+1=", ("2", "3"), (1.0, 0.0), sampler_logprobs=logprobs,
        finished=(True, False),
    )  # fmt: skip


def test_own_groups_carry_their_logprobs_and_family() -> None:
    wire = _local(((-0.5, -0.25), (-1.0,))).to_wire("tiny", 3, "fam")
    assert wire.model_family == "fam" and wire.logprobs == ((-0.5, -0.25), (-1.0,))
    back = ExternalGroup.of("peer", RolloutGroup.from_wire(wire.to_wire()), (0.0, 1.0))
    assert (back.model_family, back.sampler_logprobs) == ("fam", wire.logprobs)
    assert back.rewards == (0.0, 1.0) and back.finished == (True, False)


def test_logprobs_are_left_out_without_a_family_or_past_the_wire_limit() -> None:
    assert _local(((-0.5,), (-1.0,))).to_wire("tiny", 3).logprobs == ()
    too_long = _local(((-0.5,) * (MAX_LOGPROB_TOKENS + 1), (-1.0,))).to_wire("tiny", 3, "fam")
    assert too_long.logprobs == () and too_long.model_family == "fam"


def _learner(tmp_path: Path, train: dict[str, Any]) -> tuple[PolicyLearner, list[TrainGroup]]:
    config = parse_config(
        {
            "node": {"name": "n", "data_dir": str(tmp_path)},
            "transport": {"type": "memory"},
            "model": {"name_or_path": "builtin:tiny", "seed": 0},
            "train": {**train, "peer_offpolicy": "tis"},
        }
    )
    learner = PolicyLearner(config)
    seen: list[TrainGroup] = []
    real_step = learner.trainer.step

    def spy(groups: list[TrainGroup]) -> Any:
        seen.extend(groups)
        return real_step(groups)

    learner.trainer.step = spy  # type: ignore[method-assign]
    return learner, seen


@pytest.mark.parametrize(
    ("train", "given", "trained"),
    [
        # The default (`ended`): the full logprobs; the unfinished "45" is not trained.
        ({}, [[-0.5, -0.25], [-1.0, -2.0]], 1),
        # `text`: without our EOS appended, the stop token's logprob is dropped.
        ({"foreign_trajectory": "text"}, [[-0.5], [-1.0, -2.0]], 2),
        ({"foreign_trajectory": "text", "foreign_eos": True}, [[-0.5, -0.25], [-1.0, -2.0]], 2),
    ],
)
def test_a_same_family_peers_logprobs_reach_the_trainer(
    tmp_path: Path, train: dict[str, Any], given: list[list[float]], trained: int
) -> None:
    learner, seen = _learner(tmp_path, train)
    lps = ((-0.5, -0.25), (-1.0, -2.0))  # "3" + its stop token; "45" cut by the budget
    ours = ExternalGroup("a", "3=", ("3", "45"), (1.0, 0.0), (True, False), "digit",
                         learner.model_family, lps)  # fmt: skip
    theirs = ExternalGroup("b", "3=", ("3", "45"), (1.0, 0.0), (True, False), "digit",
                           "another-family", lps)  # fmt: skip
    stats = learner.train([], [ours, theirs]).stats
    same, other = seen
    assert same.sampler_logprobs == given
    assert other.sampler_logprobs is None  # not comparable with ours
    assert not same.local and not other.local
    # Every trained completion of ours lines up with its logprobs; the other family's get
    # ratio 1.
    counts = (stats["n_peer_tis"], stats["n_peer_mismatch"], stats["n_peer_ratio_one"])
    assert counts == (trained, 0, trained)
    assert stats["n_peer_partial"] == 2 * (2 - trained)


def test_own_groups_carry_their_token_ids_within_the_family() -> None:
    local = LocalGroup(
        TaskRef("add", 1, 2), "1+1=", ("2", "3"), (1.0, 0.0), token_ids=((7, 2), (8,)),
        sampler_logprobs=((-0.5, -0.25), (-1.0,)), finished=(True, False),
    )  # fmt: skip
    wire = local.to_wire("tiny", 3, "fam")
    assert wire.token_ids == ((7, 2), (8,))
    back = ExternalGroup.of("peer", RolloutGroup.from_wire(wire.to_wire()), (0.0, 1.0))
    assert back.token_ids == ((7, 2), (8,))
    assert local.to_wire("tiny", 3).token_ids == ()  # no family: no ids
    # Ids that do not line up with the logprobs stay home (the wire would refuse them).
    odd = LocalGroup(
        TaskRef("add", 1, 2), "1+1=", ("2", "3"), (1.0, 0.0), token_ids=((7,), (8,)),
        sampler_logprobs=((-0.5, -0.25), (-1.0,)), finished=(True, False),
    )  # fmt: skip
    assert odd.to_wire("tiny", 3, "fam").token_ids == ()
    assert odd.to_wire("tiny", 3, "fam").logprobs == ((-0.5, -0.25), (-1.0,))


def test_a_same_family_peers_ids_reach_the_trainer_without_their_stop_token(
    tmp_path: Path,
) -> None:
    learner, seen = _learner(tmp_path, {"peer_tokens": "as_sampled"})
    tok = learner.tokenizer
    stop = next(iter(learner.stop_ids))
    three, forty_five = tok("3")["input_ids"], tok("45")["input_ids"]
    ids = ((*three, stop), tuple(forty_five))  # "3" ended; "45" did not
    lps = ((-0.5,) * len(ids[0]), (-1.0,) * len(ids[1]))
    ours = ExternalGroup("a", "3=", ("3", "45"), (1.0, 0.0), (True, False), "digit",
                         learner.model_family, lps, ids)  # fmt: skip
    theirs = ExternalGroup("b", "3=", ("3", "45"), (1.0, 0.0), (True, False), "digit",
                           "another-family", lps, ids)  # fmt: skip
    # A text our canonical form changes ("3 " -> "3") takes no ids: they wrote "3 ".
    spaced = ExternalGroup("c", "3=", ("3 ", "45"), (1.0, 0.0), (True, False), "digit",
                           learner.model_family, (), ids)  # fmt: skip
    stats = learner.train([], [ours, theirs, spaced]).stats
    same, other, changed = seen
    assert same.peer_token_ids == [list(three), list(forty_five)]
    assert other.peer_token_ids is None
    assert changed.peer_token_ids == [None, list(forty_five)]
    # "3" trained as sampled (and weighted by its logprobs); "45" never ended: left out.
    assert stats["n_peer_as_sampled"] == 1 and stats["n_peer_tis"] == 1
