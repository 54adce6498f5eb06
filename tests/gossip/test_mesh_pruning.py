"""Which mesh peers a node keeps when identities crowd into a topic (issue 31 item 3:
churn of 20 identities broke the mesh between two honest nodes for 59-118 s, because
the library prunes random mesh peers above `degree_high`, each for a 60 s backoff)."""

from __future__ import annotations

import time

import pytest
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11

from gossip.libp2p_mesh import DecayingCounts
from gossip.libp2p_patches import SwarmGossipSub
from swarm.identity import Identity


def _peer(i: int) -> ID:
    return ID.from_base58(Identity.from_seed(bytes([i]) * 32).peer_id)


def test_decaying_counts_halve_and_stay_bounded() -> None:
    counts = DecayingCounts(half_life_s=10.0, max_keys=2)
    counts.note("a", 0.0, 8.0)
    assert counts.value("a", 10.0) == pytest.approx(4.0)
    counts.note("a", 10.0)
    assert counts.value("a", 20.0) == pytest.approx(2.5)
    counts.note("b", 20.0)
    counts.note("c", 20.0)  # "a" was counted least recently: it leaves
    assert counts.value("a", 20.0) == 0.0 and counts.value("c", 20.0) == 1.0


def test_pruning_keeps_the_peers_that_deliver_and_drops_the_newcomers() -> None:
    router = SwarmGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12)
    honest = [_peer(i) for i in range(1, 4)]
    crowd = [_peer(i) for i in range(10, 30)]
    router.mesh["t"] = set()
    for peer in honest + crowd:  # the honest peers were there first
        router.mesh["t"].add(peer)
        router._notify_mesh_peer_added(peer, "t")
    now = time.monotonic()
    router._deliveries.note(honest[0].to_base58(), now, 5.0)  # one delivers a lot, the
    router._deliveries.note(crowd[-1].to_base58(), now, 1.0)  # newest newcomer a little
    pruned = router._select_peers_for_pruning("t", len(router.mesh["t"]) - router.degree)
    kept = router.mesh["t"] - set(pruned)
    assert len(kept) == 6
    assert set(honest) <= kept and crowd[-1] in kept  # deliverers, then the longest there
    assert kept - set(honest) - {crowd[-1]} == {crowd[0], crowd[1]}
    router.remove_peer(honest[0])
    assert router._deliveries.value(honest[0].to_base58(), now) == 0.0
    assert all(key[0] != honest[0] for key in router._mesh_since)
