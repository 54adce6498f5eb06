"""Re-scoring a peer's group: a dataset's own bug is a refusal, not a crash, and a node
only runs the generators of its own task mixture on peers' references."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gossip.layer import Received
from gossip.memory import MemoryNetwork
from node.rescore import Refused, rescore_group
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
