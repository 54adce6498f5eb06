"""The stub learner's `competence` rule: its pure parts, and that it can say sharing does
not help (so simnet results with it do not hold by construction)."""

from __future__ import annotations

import pytest

from node.learner import ExternalGroup, LocalGroup
from rewards.tasks import make_task
from simnet.scenario import StubSpec
from simnet.stub import (
    Competence,
    StubLearner,
    competence_of,
    group_signal,
    learning_gain,
    p_correct,
    step_update,
    task_difficulty,
)
from swarm.config import RewardsConfig
from swarm.messages import TaskRef

HALF = (1.0,) * 4 + (0.0,) * 4


def test_pure_parts() -> None:
    assert task_difficulty("3+4=", 0.0, 2.0) == task_difficulty("3+4=", 0.0, 2.0)
    ds = [task_difficulty(f"{i}+{i}=", 1.0, 2.0) for i in range(200)]
    assert all(-1.0 <= d <= 3.0 for d in ds) and max(ds) - min(ds) > 3.0
    assert p_correct(1.0, 0.0, 1.0) == pytest.approx(0.5)
    assert group_signal((1.0,) * 8) == 0.0 == group_signal((0.0,) * 8)
    assert group_signal(HALF) == pytest.approx(1.0)
    assert group_signal((1.0,) + (0.0,) * 7) == pytest.approx(2 * (7 / 64) ** 0.5)
    assert learning_gain(0.5, 1.0) == pytest.approx(1.0)
    assert learning_gain(0.999, 1.0) < 0.01 and learning_gain(0.001, 1.0) < 0.01
    assert step_update([1.0, 1.0, 0.0, 1.0, 1.0], 0.0) == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert step_update([1.0, 1.0, 0.0, 1.0, 1.0], 1.0) == [0.25, 0.25, 0.0, 0.25, 0.25]
    assert step_update([0.0, 0.0], 0.5) == [0.0, 0.0]


def _learner(**params: float) -> StubLearner:
    return StubLearner(8, RewardsConfig(), 0.3, competence=Competence(**params))


def _prompts(n: int, start: int = 0) -> list[str]:
    return [make_task(TaskRef("add", 7, i)).prompt for i in range(start, start + n)]


def _local(prompt: str) -> LocalGroup:
    return LocalGroup(TaskRef("add", 7, 0), prompt, ("a",) * 8, HALF)


def _flat(prompt: str) -> LocalGroup:
    """A group without reward variance (all wrong): no signal."""
    return LocalGroup(TaskRef("add", 7, 0), prompt, ("a",) * 8, (0.0,) * 8)


def _external(prompt: str) -> ExternalGroup:
    return ExternalGroup("peer", prompt, ("a",) * 8, HALF)


def test_sharing_does_not_help_when_peers_groups_are_on_mastered_tasks() -> None:
    mastered = _prompts(4, start=50)
    own = _prompts(8)
    silo, swarm = _learner(), _learner()
    for prompt in mastered:  # the swarm node already knows its peers' tasks cold
        swarm.knowledge[prompt] = 12.0
        silo.knowledge[prompt] = 12.0
    for _ in range(30):
        batch = [_local(p) for p in own]
        silo.train(batch, [])  # 8/0: eight informative groups of its own
        swarm.train(batch[:4], [_external(p) for p in mastered])  # 4/4
    assert swarm.skill < silo.skill
    assert sum(swarm.p_task(p) for p in own) < sum(silo.p_task(p) for p in own)


def test_sharing_helps_when_peers_bring_signal_the_node_lacks() -> None:
    own = _prompts(8)
    fresh = _prompts(4, start=50)
    silo, swarm = _learner(), _learner()
    for _ in range(30):
        # The silo's own groups carry no variance half of the time (a weak node).
        silo.train([_local(p) for p in own[:2]] + [_flat(p) for p in own[2:]], [])
        swarm.train([_local(p) for p in own[:2]], [_external(p) for p in fresh])
    assert swarm.skill > silo.skill


def test_batch_exponent_decides_whether_more_groups_mean_more_learning() -> None:
    prompts = _prompts(8)
    for exponent, more_helps in ((0.0, True), (1.0, False)):
        few, many = _learner(batch_exponent=exponent), _learner(batch_exponent=exponent)
        few.train([_local(p) for p in prompts[:2]], [])
        many.train([_local(p) for p in prompts], [])
        assert (many.skill > few.skill + 1e-9) is more_helps


def test_count_rule_is_unchanged_and_spec_selects_the_rule() -> None:
    old = StubLearner(8, RewardsConfig(), 0.1, 0.02)
    old.train([_local("1+1=")], [_external("2+2=")])
    assert old.skill == pytest.approx(1 - 0.9 * 0.98**2)
    assert competence_of(StubSpec()) is None
    c = competence_of(StubSpec(rule="competence", task_rate=0.3))
    assert c is not None and c.task_rate == 0.3


def test_competence_state_survives_a_checkpoint(tmp_path) -> None:
    learner = _learner()
    learner.train([_local(p) for p in _prompts(3)], [])
    learner.save(tmp_path / "ck", {"round": 1})
    again = _learner()
    again.load(tmp_path / "ck")
    assert again.skill == learner.skill and again.knowledge == learner.knowledge


def test_competence_fields_need_the_competence_rule() -> None:
    with pytest.raises(ValueError, match=r"task_rate: only used by rule = 'competence'"):
        StubSpec(task_rate=0.3)
    assert StubSpec(rule="competence", task_rate=0.3).task_rate == 0.3
    dumped = StubSpec(skill=0.2).model_dump()  # every field, defaults included
    assert StubSpec.model_validate(dumped).skill == 0.2
