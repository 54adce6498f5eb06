"""Catching up the swarm round: fresh keys (sybils) and penalized peers cannot move a
node's clock; peers it has known for `catch_up_min_rounds` rounds can."""

from __future__ import annotations

from pathlib import Path

from gossip.layer import Received
from gossip.memory import MemoryNetwork
from node.runner import Node
from swarm.envelope import seal
from swarm.identity import Identity
from swarm.messages import Hello, encode_payload
from swarm.transport import peers_topic
from tests.node.helpers import stub_config, stub_node

HELLO = Hello("stub", "stub", 0, ())


def hello_from(node: Node, peer: Identity, round: int, seq: int) -> Received:
    envelope = seal(
        peer,
        kind="hello",
        swarm_id=node.config.node.swarm_id,
        seq=seq,
        round=round,
        payload=encode_payload(HELLO),
    )
    return Received(peers_topic(node.config.node.swarm_id), envelope, HELLO, 100)


def make_node(tmp_path: Path) -> Node:
    config = stub_config(tmp_path, "victim", catch_up_quorum=2, catch_up_min_rounds=2)
    return stub_node(config, MemoryNetwork("sybil-clock"))


def test_a_crowd_of_fresh_keys_cannot_push_the_clock(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    sybils = [Identity.from_seed(bytes([50 + i]) * 32) for i in range(40)]
    for seq, sybil in enumerate(sybils, 1):
        node.handle(hello_from(node, sybil, 10_000, seq))
    assert node.swarm_round.value == 0
    assert node.drops["from_future"] == 40
    assert not node.peer_faults  # claiming the future is not a fault in itself


def test_known_peers_in_good_standing_do_move_it(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    peers = [Identity.from_seed(bytes([90 + i]) * 32) for i in range(2)]
    penalized = Identity.from_seed(b"\x77" * 32)
    for seq, peer in enumerate([*peers, penalized], 1):
        node.handle(hello_from(node, peer, 0, seq))  # first heard at round 0
    node.gossip.penalize(penalized.peer_id, "prompt_mismatch")
    node.rounds_done = 2  # two of our rounds later they are known
    node.handle(hello_from(node, peers[0], 500, 10))
    node.handle(hello_from(node, penalized, 600, 11))
    assert node.swarm_round.value == 0  # one vouching peer, one in debt: no quorum
    node.handle(hello_from(node, peers[1], 400, 12))
    assert node.swarm_round.value == 400  # the 2nd highest of the two vouching claims
