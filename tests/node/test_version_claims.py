"""Nobody can move a node's sense of time: claims of later policy versions (the old
clock-ratchet attack), from one key or from many, change nothing for honest peers;
a claimant can only make its own groups look stale."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gossip.layer import Received
from gossip.memory import MemoryNetwork
from node.runner import Node
from rewards.tasks import make_task
from swarm.envelope import seal
from swarm.identity import Identity
from swarm.messages import Hello, Payload, RolloutBatch, RolloutGroup, TaskRef, encode_payload
from swarm.transport import peers_topic, rollouts_topic
from tests.node.helpers import stub_config, stub_node

HUGE = 2**62


def envelope_of(node: Node, peer: Identity, message: Payload, version: int, seq: int) -> Received:
    swarm = node.config.node.swarm_id
    kind = message.KIND
    envelope = seal(
        peer, kind=kind, swarm_id=swarm, seq=seq, policy_version=version,
        payload=encode_payload(message),
    )
    topic = peers_topic(swarm) if kind == "hello" else rollouts_topic(swarm)
    return Received(topic, envelope, message, 100)


def batch(version: int, index: int) -> RolloutBatch:
    task = make_task(TaskRef("add", 3, index))
    group = RolloutGroup(
        task.ref, task.prompt, (task.answer, task.answer + "9"), (1.0, 0.0), "m", version,
        finished=(True, True),
    )  # fmt: skip
    return RolloutBatch((group,))


def make_node(tmp_path: Path) -> Node:
    return stub_node(stub_config(tmp_path, "victim"), MemoryNetwork("claims"))


def test_one_key_claiming_huge_versions_changes_nothing_for_honest_peers(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    attacker = Identity.from_seed(b"\x66" * 32)
    honest = Identity.from_seed(b"\x11" * 32)

    async def scenario() -> None:
        for seq in range(1, 101):  # 100 hellos, each claiming a later version
            hello = Hello("a", "a", HUGE, ())
            await node.take(envelope_of(node, attacker, hello, HUGE + seq, seq))
        await node.take(envelope_of(node, honest, batch(5, 0), 5, 1))
        # The attacker's own group, behind what it claims to run: stale, and only its own.
        await node.take(envelope_of(node, attacker, batch(0, 1), HUGE, 200))

    asyncio.run(scenario())
    assert node.rounds_done == 0
    assert node.drops["stale_version"] == 1  # the attacker's group
    assert not node.peer_faults  # claiming is not a fault; the attacker only hurt itself
    chosen = node.pool.select(4, node.rounds_done, node.intake.sender_version, node.clock.now())
    assert [e.sender for e in chosen] == [honest.peer_id]


def test_many_keys_claiming_later_versions_change_nothing(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    sybils = [Identity.from_seed(bytes([50 + i]) * 32) for i in range(40)]
    honest = Identity.from_seed(b"\x12" * 32)

    async def scenario() -> None:
        for seq, sybil in enumerate(sybils, 1):
            await node.take(envelope_of(node, sybil, Hello("s", "s", HUGE, ()), HUGE, seq))
        await node.take(envelope_of(node, honest, batch(0, 0), 0, 1))

    asyncio.run(scenario())
    node.rounds_done = 2  # two of our own rounds later: still within max_staleness (2)
    chosen = node.pool.select(4, node.rounds_done, node.intake.sender_version, node.clock.now())
    assert [e.sender for e in chosen] == [honest.peer_id]


def test_a_group_expires_after_max_staleness_of_our_rounds(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    honest = Identity.from_seed(b"\x13" * 32)
    asyncio.run(node.take(envelope_of(node, honest, batch(0, 0), 0, 1)))
    node.rounds_done = node.config.sapo.max_staleness + 1
    assert node.pool.select(4, node.rounds_done, node.intake.sender_version, node.clock.now()) == []
    assert node.pool.evicted["stale"] == 1


def test_a_sender_that_moved_on_makes_its_old_groups_stale(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    peer = Identity.from_seed(b"\x14" * 32)

    async def scenario() -> None:
        await node.take(envelope_of(node, peer, batch(1, 0), 1, 1))
        lag = node.config.sapo.max_version_lag
        await node.take(envelope_of(node, peer, Hello("m", "m", 2 + lag, ()), 2 + lag, 2))

    asyncio.run(scenario())
    assert node.pool.select(4, node.rounds_done, node.intake.sender_version, node.clock.now()) == []
