"""A running node fed invalid, forged and stale messages drops each with its reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import node.intake
from gossip.memory import MemoryNetwork, MemoryTransport
from node.metrics import read_metrics
from rewards.tasks import make_task
from swarm.config import MemoryTransportConfig
from swarm.envelope import seal
from swarm.identity import Identity
from swarm.messages import Hello, RolloutBatch, RolloutGroup, TaskRef, encode_payload
from swarm.transport import rollouts_topic
from tests.node.helpers import stub_config, stub_node


def _group(
    prompt: str | None = None, *, index: int = 3, finished: tuple[bool, ...] = (True,) * 4
) -> RolloutGroup:
    task = make_task(TaskRef("add", 42, index))
    completions = (task.answer, task.answer + "9", task.answer, "x")
    return RolloutGroup(
        task=task.ref,
        prompt=task.prompt if prompt is None else prompt,
        completions=completions,
        rewards=(1.0, 0.0, 1.0, 0.0),
        model_id="attacker",
        policy_version=0,
        finished=finished,
    )


def _rollouts(
    sender: Identity, group: RolloutGroup, swarm_id: str, seq: int, version: int
) -> bytes:
    """One group as a signed rollouts envelope's wire bytes."""
    payload = encode_payload(RolloutBatch((group,)))
    return seal(
        sender, kind="rollouts", swarm_id=swarm_id, seq=seq, policy_version=version,
        payload=payload,
    ).encode()  # fmt: skip


def test_running_node_drops_bad_messages_and_keeps_training(tmp_path: Path) -> None:
    network = MemoryNetwork("hostile")
    config = stub_config(tmp_path, "victim")
    node = stub_node(config, network)
    attacker = Identity.from_seed(b"\x66" * 32)
    raw = MemoryTransport(MemoryTransportConfig(), attacker, network=network)
    topic = rollouts_topic(config.node.swarm_id)

    def envelope(group: RolloutGroup, version: int, seq: int, swarm_id: str | None = None) -> bytes:
        return _rollouts(attacker, group, swarm_id or config.node.swarm_id, seq, version)

    async def attack() -> None:
        await raw.start()
        await raw.subscribe(topic)
        while node.rounds_done < 4:
            await asyncio.sleep(0)
        good = envelope(_group(), 0, 1)
        tampered = bytearray(envelope(_group(index=5), 0, 2))
        tampered[-5] ^= 0xFF
        sends = [
            b"\x00garbage\xff" * 10,
            bytes(tampered),
            envelope(_group(prompt="9+9="), 0, 3),
            envelope(_group(index=9), 0, 6, swarm_id="other"),
            good,
            good,  # replay
            # A group of version 0 from a sender that now claims version 1000: stale.
            envelope(_group(index=7), 1000, 7),
        ]
        for data in sends:
            await raw.publish(topic, data)
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(node.run(10), attack())

    asyncio.run(main())
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    assert len(records) == 10
    drops = records[-1]["drops"]
    for reason in (
        "malformed",
        "bad_signature",
        "prompt_mismatch",
        "stale_version",
        "wrong_swarm",
        "duplicate",
    ):
        assert drops.get(reason, 0) >= 1, (reason, drops)
    assert node.sender_versions.version(attacker.peer_id) == 1000  # its own claim only
    assert node.peer_faults[attacker.peer_id] == 1  # the prompt mismatch
    # The signed refusals are blamed on the attacker and scored: -5 (mismatch) -5 (swarm).
    blamed = node.gossip.counters.per_peer_drops[attacker.peer_id]
    assert blamed["prompt_mismatch"] == 1 and blamed["wrong_swarm"] == 1
    assert node.gossip.scores.score(attacker.peer_id) < -9
    assert records[-1]["peer_scores"]["peers"][attacker.peer_id]["reasons"] == dict(blamed)


def test_groups_whose_signal_is_all_in_unfinished_completions_never_take_a_slot(
    tmp_path: Path,
) -> None:
    """Under `train.foreign_trajectory = "ended"` (the default) the trainer leaves out
    peers' unfinished completions, so a group whose reward spread is all in them would
    fill an external slot and teach nothing (the `signal_bait` attack): it is dropped on
    arrival, counted and not blamed; the same group with ended completions is used."""
    network = MemoryNetwork("bait")
    config = stub_config(tmp_path, "victim")
    node = stub_node(config, network)
    peer = Identity.from_seed(b"\x67" * 32)
    raw = MemoryTransport(MemoryTransportConfig(), peer, network=network)
    topic = rollouts_topic(config.node.swarm_id)
    unfinished = (False,) * 4
    half = (True, True, False, False)  # one right and one wrong completion ended

    async def send() -> None:
        await raw.start()
        await raw.subscribe(topic)
        while node.rounds_done < 2:
            await asyncio.sleep(0)
        for seq, (index, finished) in enumerate([(3, unfinished), (4, unfinished), (5, half)]):
            group = _group(index=index, finished=finished)
            await raw.publish(topic, _rollouts(peer, group, config.node.swarm_id, seq + 1, 0))
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(node.run(8), send())

    asyncio.run(main())
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    assert records[-1]["drops"].get("no_trainable_signal") == 2
    assert node.peer_faults[peer.peer_id] == 0
    used = sum(r["external_by_sender"].get(peer.peer_id, 0) for r in records)
    assert used == 1  # the group with ended completions on both sides of the mean


def test_a_flood_of_fresh_keys_cannot_push_a_contributing_peer_out_of_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: 8,538 valid hellos from fresh keys filled the peer table to its cap,
    forgetting the peers that gave us groups (least recently seen first)."""
    monkeypatch.setattr(node.intake, "MAX_PEERS_TRACKED", 64)
    running = stub_node(stub_config(tmp_path, "table"), MemoryNetwork("table"))
    intake = running.intake
    hello = Hello("m", "f", 1, ())
    intake._note_hello("honest", hello)
    intake.peers["honest"].verified_groups = 3
    intake._note_hello("quiet", hello)  # an honest peer that never sent a group
    for i in range(1000):
        intake._note_hello(f"fresh-{i}", hello)
    assert len(intake.peers) == 64
    assert "honest" in intake.peers and "quiet" not in intake.peers
    assert "fresh-999" in intake.peers


def test_a_group_re_sent_under_another_key_is_dropped_as_a_copy(tmp_path: Path) -> None:
    """Issue 35's trust farmer re-signs honest peers' groups as its own: a copy would be
    trained twice and earn the copier the honest peer's arrival cohort. The copy is
    counted (`copied_group`), not blamed (it may have won the race), and the honest
    sender's group is used; a different group from the second key still is."""
    network = MemoryNetwork("copies")
    config = stub_config(tmp_path, "victim", drop_copies=True)
    node = stub_node(config, network)
    honest, copier = Identity.from_seed(b"\x41" * 32), Identity.from_seed(b"\x42" * 32)
    topic = rollouts_topic(config.node.swarm_id)

    async def send() -> None:
        transports = []
        for identity in (honest, copier):
            raw = MemoryTransport(MemoryTransportConfig(), identity, network=network)
            await raw.start()
            await raw.subscribe(topic)
            transports.append(raw)
        while node.rounds_done < 2:
            await asyncio.sleep(0)
        original = _group(index=3)
        await transports[0].publish(topic, _rollouts(honest, original, config.node.swarm_id, 1, 0))
        while not node.intake.group_owners and node.rounds_done < 8:  # the original first
            await asyncio.sleep(0)
        for seq, group in enumerate([original, _group(index=4)]):
            data = _rollouts(copier, group, config.node.swarm_id, seq + 1, 0)
            await transports[1].publish(topic, data)
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(node.run(8), send())

    asyncio.run(main())
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    assert records[-1]["drops"].get("copied_group") == 1
    assert node.peer_faults[copier.peer_id] == 0
    used = {
        key: sum(r["external_by_sender"].get(key.peer_id, 0) for r in records)
        for key in (honest, copier)
    }
    assert used == {honest: 1, copier: 1}
