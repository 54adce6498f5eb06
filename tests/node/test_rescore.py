"""Re-scoring a peer's group: a dataset's own bug is a refusal, not a crash, and a node
only runs the generators of its own task mixture on peers' references."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gossip.layer import Received
from gossip.memory import MemoryNetwork
from node.rescore import (
    FORGED_REWARD_GAP,
    Refused,
    mean_gap,
    quick_correctness,
    rescore_group,
    settings_gap,
)
from rewards.registry import score_group
from rewards.tasks import make_task
from swarm.config import RewardsConfig
from swarm.envelope import seal
from swarm.identity import Identity
from swarm.messages import RolloutBatch, RolloutGroup, TaskRef, encode_payload
from swarm.transport import rollouts_topic
from tests.node.helpers import stub_config, stub_node


def test_a_generator_that_raises_is_a_task_error() -> None:
    # reasoning-gym's `composite` raises AssertionError when built for a bare reference.
    group = RolloutGroup(TaskRef("rg:composite", 0, 0), "x", ("1", "2"), (0.0, 1.0), "m", 1)
    with pytest.raises(Refused) as refused:
        rescore_group(group, RewardsConfig())
    assert refused.value.reason == "task_error"


def test_groups_of_tasks_outside_the_mixture_are_refused_unscored(tmp_path: Path) -> None:
    node = stub_node(stub_config(tmp_path, "n"), MemoryNetwork("foreign"))
    assert [s.source for s in node.config.tasks.mixture] == ["add"]
    peer = Identity.from_seed(b"\x33" * 32)
    groups = []
    for source in ("add", "copy"):
        task = make_task(TaskRef(source, 1, 2))
        groups.append(
            RolloutGroup(
                task.ref, task.prompt, (task.answer, "zz"), (1.0, 0.0), "m", 0, (True, True)
            )
        )
    batch = RolloutBatch(tuple(groups))
    envelope = seal(
        peer, kind="rollouts", swarm_id=node.config.node.swarm_id, seq=1, policy_version=0,
        payload=encode_payload(batch),
    )
    received = Received(rollouts_topic(node.config.node.swarm_id), envelope, batch, 10)
    asyncio.run(node.take(received))
    assert node.drops["foreign_task"] == 1
    assert len(node.pool) == 1 and node.pool.entries[0].group.task.source == "add"
    assert not node.peer_faults and node.gossip.scores.score(peer.peer_id) > 0  # credit


def test_a_node_that_takes_no_external_groups_rescores_none(tmp_path: Path) -> None:
    node = stub_node(stub_config(tmp_path, "j0", external_groups=0), MemoryNetwork("j0"))
    peer = Identity.from_seed(b"\x34" * 32)
    task = make_task(TaskRef("add", 1, 2))
    batch = RolloutBatch(
        (RolloutGroup(task.ref, task.prompt, (task.answer, "zz"), (1.0, 0.0), "m", 0),)
    )
    envelope = seal(
        peer, kind="rollouts", swarm_id=node.config.node.swarm_id, seq=1, policy_version=0,
        payload=encode_payload(batch),
    )
    asyncio.run(node.take(Received(rollouts_topic(node.config.node.swarm_id), envelope, batch, 10)))
    assert node.rescorer.stats()["jobs"] == 0 and len(node.pool) == 0 and not node.drops
    assert node.sender_versions.version(peer.peer_id) == 0 and peer.peer_id in node.sender_versions


def test_settings_gap_finds_the_format_weight_that_explains_claims() -> None:
    correct, well_formed = [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]
    claims = tuple(c + 0.3 * f for c, f in zip(correct, well_formed, strict=True))
    assert settings_gap(claims, correct, well_formed) == pytest.approx(0.0, abs=1e-12)
    # weights are bounded to [0, 1]: claims of 3.0 are 1.0 above the best (w = 1) each
    assert settings_gap((3.0, 3.0, 3.0, 3.0), [1.0] * 4, [1.0] * 4) == pytest.approx(1.0)


def _group_claiming(claims: tuple[float, ...], completions: tuple[str, ...]) -> RolloutGroup:
    task = make_task(TaskRef("add", 5, 3))
    return RolloutGroup(task.ref, task.prompt, completions, claims, "m", 0, (True,) * 4)


@pytest.mark.parametrize(
    ("theirs", "offsets"),
    [
        (RewardsConfig(format_weight=1.0), ("+1", "+2", "+3", "")),
        (RewardsConfig(correctness="closeness"), ("+0.1", "-0.1", "+0.2", "")),
        (
            RewardsConfig(correctness="closeness", format_weight=0.7, answer_format="answer_block"),
            ("+0.1", "-0.2", "+1", ""),
        ),
    ],
)
def test_claims_from_other_valid_settings_are_not_forged(
    theirs: RewardsConfig, offsets: tuple[str, ...]
) -> None:
    """Issue 31: an honest peer with another valid [rewards] config was refused as
    forged_rewards and ignored. Its claims, scored with its settings, differ from ours by
    more than the threshold; the group is re-scored with ours and not blamed."""
    task = make_task(TaskRef("add", 5, 3))
    answers = [f"{float(task.answer) + float(o):g}" if o else task.answer for o in offsets]
    block = theirs.answer_format == "answer_block"
    completions = tuple(f"<answer>{a}</answer>" if block else a for a in answers)
    claims = tuple(score_group(task, list(completions), theirs))
    ours = RewardsConfig(format_weight=0.0)  # correctness alone, unlike every `theirs`
    assert mean_gap(claims, score_group(task, list(completions), ours)) > FORGED_REWARD_GAP
    rescored = rescore_group(_group_claiming(claims, completions), ours)
    assert not rescored.forged and rescored.rewards == tuple(
        score_group(task, list(completions), ours)
    )


def test_claims_no_settings_produce_are_forged() -> None:
    task = make_task(TaskRef("add", 5, 3))
    completions = ("no idea", "I cannot say", "hard to tell", task.answer)
    rescored = rescore_group(_group_claiming((1.0, 1.0, 1.0, 1.0), completions), RewardsConfig())
    assert rescored.forged and rescored.advisory_gap == pytest.approx(0.75)


def test_explaining_claims_never_runs_a_slow_scorer_again() -> None:
    """The suite caught it: a forger's every group made each receiver run reasoning-gym's
    sandboxed scorer once more per completion. Ours comes from the rewards already
    computed; other slow scorers are not tried."""
    assert quick_correctness("rg:gcd", "source") == ["exact", "numeric", "closeness"]
    assert quick_correctness("rg:gcd", "exact") == ["numeric", "closeness"]
    assert quick_correctness("add", "exact") == ["numeric", "closeness", "source"]
