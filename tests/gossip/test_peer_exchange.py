"""Discovery beyond a bootstrap list, with real libp2p hosts in separate OS processes.

- Chain A <- B <- C (C knows only B, B only A): C finds A through B's peer-exchange
  reply, connects to it and receives A's messages.
- Rejoin: C learns B, remembers it in its peer book, stops; its only bootstrap peer
  dies; restarted with the same key and book, C reconnects to B and hears it again.
- Hostile peers answering the exchange with an oversize or malformed reply are counted
  by reason and survived (the connections and their messages stay).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gossip.conftest import wait_all

LOCAL = "/ip4/127.0.0.1/tcp/0"
TIMEOUT_S = 30.0
FAST = ("--listen", LOCAL, "--heartbeat", "0.5", "--exchange-interval", "1")

PeerProcess = Any  # conftest.PeerProcess


def px_peer(spawn: Any, name: str, *extra: str) -> PeerProcess:
    return spawn(name, "--transport", "libp2p", *FAST, *extra)


def connected(peer: PeerProcess) -> list[str]:
    return peer.request("peers", "peers")["connected"]


def wait_connected(peer: PeerProcess, *others: str) -> None:
    wait_all(
        lambda: set(others) <= set(connected(peer)),
        TIMEOUT_S,
        f"{peer.name} to connect to {len(others)} peers",
        interval_s=0.3,
    )


def discovery(peer: PeerProcess) -> dict[str, Any]:
    return peer.request("stats", "stats")["transport"]["discovery"]


def wait_heard(receiver: PeerProcess, sender: PeerProcess, count: int, start: int) -> None:
    sender.command(f"send {count} 500 {start}")
    receiver.wait_until(
        lambda _: sum(1 for e in receiver.received(sender.peer_id) if e["index"] >= start)
        >= count,
        TIMEOUT_S,
        f"{count} messages from {sender.name}",
    )


@pytest.mark.slow
def test_chain_node_finds_the_far_end_and_hears_it(spawn_peer: Any) -> None:
    a = px_peer(spawn_peer, "A").ready()
    b = px_peer(spawn_peer, "B", "--bootstrap", a.addrs[0]).ready()
    c = px_peer(spawn_peer, "C", "--bootstrap", b.addrs[0]).ready()
    wait_connected(c, a.peer_id, b.peer_id)
    wait_connected(a, c.peer_id)
    # An end learns of the other from B; whichever dials first makes the link, and the
    # other end may never need to ask B (its periodic query comes later on a loaded
    # machine), so only one end is sure to have discovered.
    stats, stats_a = discovery(c), discovery(a)
    assert stats["discovered"] + stats_a["discovered"] >= 1, (stats, stats_a)
    assert stats["dials_started"] + stats_a["dials_started"] >= 1, (stats, stats_a)
    assert stats["connected_by_source"]["exchange"] == 1, stats
    assert stats["connected_by_source"]["bootstrap"] == 1, stats
    assert discovery(b)["served"] >= 1
    # A's messages reach C (over the direct link or through B).
    c.wait_until(lambda _: a.peer_id in c.mesh() or b.peer_id in c.mesh(), TIMEOUT_S, "mesh")
    wait_heard(c, a, 5, 0)


@pytest.mark.slow
def test_restarted_node_rejoins_through_its_peer_book_when_bootstrap_is_dead(
    spawn_peer: Any, tmp_path: Path
) -> None:
    book = tmp_path / "c" / "peer_book.json"
    seed = "11" * 32
    a = px_peer(spawn_peer, "A").ready()
    b = px_peer(spawn_peer, "B", "--bootstrap", a.addrs[0]).ready()
    c_args = ("--bootstrap", a.addrs[0], "--seed", seed, "--peer-book", str(book))
    c = px_peer(spawn_peer, "C", *c_args).ready()
    wait_connected(c, a.peer_id, b.peer_id)
    # A peer enters the book once identified (its protocols known), which can lag the
    # connection by a moment on a loaded machine: a stop before that forgets it.
    wait_all(lambda: discovery(c)["book_peers"] == 2, TIMEOUT_S, "C to book both peers")
    c.stop()
    rows = json.loads(book.read_text())["peers"]
    assert {r["id"] for r in rows} == {a.peer_id, b.peer_id}
    assert next(r for r in rows if r["id"] == b.peer_id)["source"] == "exchange"
    a.stop()  # the only bootstrap peer C knows is gone

    c2 = px_peer(spawn_peer, "C2", *c_args).ready()
    assert c2.peer_id == c.peer_id
    wait_connected(c2, b.peer_id)
    stats = discovery(c2)
    assert stats["book"]["loaded"] == 2 and stats["connected_by_source"]["book"] == 1, stats
    c2.wait_until(lambda _: b.peer_id in c2.mesh(), TIMEOUT_S, "B in C2's mesh")
    wait_heard(c2, b, 5, 0)


@pytest.mark.slow
def test_oversize_and_malformed_exchange_replies_are_counted_and_survived(
    spawn_peer: Any,
) -> None:
    big = px_peer(spawn_peer, "oversize", "--hostile-exchange", "oversize").ready()
    junk = px_peer(spawn_peer, "garbage", "--hostile-exchange", "garbage").ready()
    node = px_peer(
        spawn_peer, "node", "--bootstrap", big.addrs[0], "--bootstrap", junk.addrs[0]
    ).ready()
    wait_connected(node, big.peer_id, junk.peer_id)

    def dropped() -> dict[str, int]:
        return discovery(node)["replies_dropped_by_reason"]

    wait_all(
        lambda: dropped()["oversize"] >= 1 and dropped()["malformed"] >= 1,
        TIMEOUT_S,
        "both bad replies counted",
        interval_s=0.3,
    )
    assert set(connected(node)) == {big.peer_id, junk.peer_id}
    node.wait_until(lambda _: big.peer_id in node.mesh(), TIMEOUT_S, "mesh")
    wait_heard(node, big, 3, 0)
    wait_heard(node, junk, 3, 100)
