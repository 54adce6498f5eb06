"""Inbound connection slots (`gossip.libp2p_inbound`): the accounting alone, and a real
node that many identities join and leave.

The process test reproduces issue 31 item 1: with py-libp2p 0.8.1's own inbound path a
node refused every inbound connection after the 64th of its lifetime (each slot was
kept until the swarm stopped), while holding none.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import gossip.libp2p_inbound as inbound
import gossip.libp2p_selfcheck as selfcheck
from gossip.libp2p_inbound import InboundSlots, address_keys, network_key
from swarm.internals import LibraryInternalsChanged

CHURN_SCRIPT = Path(__file__).with_name("churn_peer.py")

# ---- the accounting -------------------------------------------------------------------


def test_slots_come_back_after_any_number_of_connections() -> None:
    slots = InboundSlots(64, per_ip=8, per_subnet=16)
    for i in range(1000):
        slot = slots.acquire(f"198.51.100.{i % 200}")
        assert slot is not None, f"connection {i} refused with no connection open"
        slots.release(slot)
    held = [slots.acquire(f"203.0.{i}.1") for i in range(64)]
    assert all(s is not None for s in held) and slots.used == 64
    for slot in held:
        assert slot is not None
        slots.release(slot)
    assert (slots.used, slots.by_ip, slots.by_subnet) == (0, {}, {})
    assert slots.accepted == 1064 and sum(slots.refused.values()) == 0


def test_total_cap_counts_what_is_open_now() -> None:
    slots = InboundSlots(4, per_ip=8, per_subnet=16)
    held = [slots.acquire("::1") for _ in range(4)]
    assert slots.acquire("::1") is None
    assert slots.refused["max_peers"] == 1
    first = held[0]
    assert first is not None
    slots.release(first)
    assert slots.acquire("198.51.100.7") is not None  # one left: one more fits
    assert slots.acquire("198.51.100.8") is None
    assert slots.refused["max_peers"] == 2


def test_per_address_and_per_subnet_bounds() -> None:
    slots = InboundSlots(64, per_ip=2, per_subnet=3)
    a1, a2 = slots.acquire("203.0.113.5"), slots.acquire("203.0.113.5")
    assert a1 is not None and a2 is not None
    assert slots.acquire("203.0.113.5") is None  # third from one address
    assert slots.acquire("203.0.113.6") is not None  # same /24, other address
    assert slots.acquire("203.0.113.7") is None  # the /24 is full
    assert slots.acquire("203.0.114.5") is not None  # another /24
    assert slots.refused == {"max_peers": 0, "per_ip": 1, "per_subnet": 1}
    slots.release(a1)
    assert slots.acquire("203.0.113.9") is not None  # a place in the /24 came back
    assert slots.by_ip == {"203.0.113.5": 1, "203.0.113.6": 1, "203.0.113.9": 1, "203.0.114.5": 1}
    assert slots.by_subnet == {"203.0.113.0/24": 3, "203.0.114.0/24": 1}


def test_loopback_is_exempt_from_the_address_bounds_only() -> None:
    slots = InboundSlots(10, per_ip=1, per_subnet=1)
    for ip in ["127.0.0.1"] * 4 + ["::1"] * 3 + ["127.8.9.10", "::ffff:127.0.0.1", None]:
        assert slots.acquire(ip) is not None, ip
    assert slots.acquire("127.0.0.1") is None  # the total cap still holds
    assert slots.refused["max_peers"] == 1 and slots.by_ip == {}


def test_address_keys() -> None:
    assert address_keys("198.51.100.7") == ("198.51.100.7", "198.51.100.0/24")
    assert address_keys("::ffff:198.51.100.7") == ("198.51.100.7", "198.51.100.0/24")
    # IPv6: one host usually holds a whole /64.
    assert address_keys("2001:db8:1:2::5") == ("2001:db8:1:2::/64", "2001:db8:1::/48")
    assert address_keys("2001:db8:1:2::6")[0] == address_keys("2001:db8:1:2::5")[0]
    assert address_keys("127.0.0.1") == (None, None)
    assert address_keys(None) == (None, None)


def test_network_keys_name_the_block_an_operator_holds() -> None:
    assert network_key("198.51.100.7") == network_key("198.51.100.250") == "198.51.100.0/24"
    assert network_key("::ffff:198.51.100.7") == "198.51.100.0/24"
    assert network_key("2001:db8:1:2::5") == network_key("2001:db8:1:ff::9") == "2001:db8:1::/48"
    assert network_key("10.1.2.3") == "10.1.2.0/24"  # a LAN is one network too
    assert network_key("127.0.0.1") == network_key("127.0.0.2") == "127.0.0.0/8"
    assert network_key("::1") == "::1/128"
    assert network_key("fe80::1%eth0") == "fe80::/48"
    assert network_key(None) is None
    assert network_key("peer.example") == "peer.example"


def test_release_twice_raises() -> None:
    slots = InboundSlots(2, per_ip=1, per_subnet=1)
    slot = slots.acquire("198.51.100.7")
    assert slot is not None
    slots.release(slot)
    with pytest.raises(RuntimeError, match="twice"):
        slots.release(slot)
    assert slots.used == 0


def test_the_replaced_library_path_is_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    inbound.check_pinned()  # the installed libp2p is the one replaced
    monkeypatch.setitem(selfcheck.PINNED_SOURCES, "_handle_inbound_connection", "0" * 16)
    with pytest.raises(LibraryInternalsChanged, match="_handle_inbound_connection changed"):
        inbound.check_pinned()


def test_install_replaces_the_swarms_inbound_handler() -> None:
    from libp2p import new_host
    from libp2p.network.swarm import Swarm

    network = new_host().get_network()
    assert type(network) is Swarm
    handler = inbound.install_inbound_slots(network, InboundSlots(4, per_ip=1, per_subnet=2))
    assert network._handle_inbound_connection == handler.handle
    with pytest.raises(RuntimeError, match="Swarm changed"):
        inbound.install_inbound_slots(object(), InboundSlots(4, per_ip=1, per_subnet=2))


class FakeSocket:
    """An accepted socket as the listener hands it over: a remote address and close()."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.closed = False

    def get_remote_address(self) -> tuple[str, int]:
        return self.ip, 40000

    async def close(self) -> None:
        self.closed = True


class FailingSwarm:
    """The parts of a swarm the handler uses, with every upgrade failing."""

    class _Gate:
        async def is_allowed(self, maddr: Any) -> bool:
            return True

    connection_gate = _Gate()

    def _build_remote_multiaddr(self, conn: Any) -> None:
        return None

    async def upgrade_inbound_raw_conn(self, raw_conn: Any, maddr: Any) -> Any:
        raise ConnectionError("handshake failed")


def test_handler_refuses_at_accept_and_gives_slots_back_on_failure() -> None:
    import trio

    slots = InboundSlots(8, per_ip=1, per_subnet=4)
    handler = inbound.InboundHandler(FailingSwarm(), slots)  # type: ignore[arg-type]
    held = slots.acquire("198.51.100.7")  # one connection from this address is open

    async def main() -> None:
        refused = FakeSocket("198.51.100.7")
        await handler.handle(refused, None)  # type: ignore[arg-type]
        assert refused.closed and slots.refused["per_ip"] == 1
        failing = FakeSocket("198.51.100.8")
        await handler.handle(failing, None)  # type: ignore[arg-type]
        assert failing.closed and handler.failed == 1

    trio.run(main)
    assert held is not None and slots.used == 1 and slots.by_ip == {"198.51.100.7": 1}


# ---- a real node, 250 identities joining and leaving -----------------------------------


def inbound_now(node: Any) -> tuple[int, int]:
    """(connections open, inbound slots used) of a peer_process node, from its stats."""
    stats = node.request("stats", "stats")["transport"]
    return stats["connections_open"], stats["inbound"]["slots_used"]


def until_inbound(node: Any, want: tuple[int, int], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while (now := inbound_now(node)) != want:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: (open, slots used) = {now}, expected {want} after {timeout_s} s"
            )
        time.sleep(0.1)


@pytest.mark.slow(seconds=15)
def test_a_node_accepts_peers_after_hundreds_came_and_left(spawn_peer: Any) -> None:
    """A node (its own process) is joined and left by 200 identities one after another,
    then by 50 at once; a new honest peer then connects and exchanges messages both
    ways, and the node's open connections and used slots go back to 0 each time.
    (Before the fix, the 65th identity was refused and so was everyone after it.)"""
    t0 = time.monotonic()
    node = spawn_peer("node", "--transport", "libp2p", "--raw", "--heartbeat", "0.5").ready()
    target = node.addrs[0]
    churn = spawn_peer("churn", "--target", target, script=CHURN_SCRIPT)
    churn.wait_for(lambda e: e["event"] == "ready", 30.0, "churn ready")
    assert node.request("peers", "peers")["connected"] == []  # the baseline: nobody

    one_by_one = churn.request("churn 200", "churned", timeout_s=120.0)
    assert one_by_one["ok"] == 200, f"identities refused one after another: {one_by_one}"
    until_inbound(node, (0, 0), 10.0, "after 200 identities came and left")

    at_once = churn.request("open 50", "opened", timeout_s=60.0)
    assert at_once["ok"] == 50, f"identities refused while 50 joined at once: {at_once}"
    until_inbound(node, (50, 50), 10.0, "with 50 identities connected")
    churn.request("close", "closed", timeout_s=30.0)
    until_inbound(node, (0, 0), 10.0, "after the 50 left")

    honest = spawn_peer(
        "honest", "--transport", "libp2p", "--raw", "--heartbeat", "0.5", "--bootstrap", target
    ).ready()
    honest.wait_for(
        lambda e: e["event"] == "mesh" and node.peer_id in e["peers"], 30.0, "mesh with the node"
    )
    honest.command("send 1 1000 0")
    node.wait_for(
        lambda e: e["event"] == "recv" and e["sender"] == honest.peer_id,
        30.0,
        "the honest peer's message at the node",
    )
    node.command("send 1 1000 7")
    honest.wait_for(
        lambda e: e["event"] == "recv" and e["index"] == 7 and e["sender"] == node.peer_id,
        30.0,
        "the node's message at the honest peer",
    )
    until_inbound(node, (1, 1), 10.0, "with the honest peer connected")
    honest.stop()
    until_inbound(node, (0, 0), 10.0, "after the honest peer left")

    stats = node.request("stats", "stats")["transport"]["inbound"]
    # At least 251: AutoNAT dial-backs between the node and the honest peer add some.
    assert stats["accepted"] >= 251 and sum(stats["refused_by_reason"].values()) == 0, stats
    print(
        f"\n200 one by one in {one_by_one['seconds']} s, 50 at once in {at_once['seconds']} s; "
        f"node inbound {stats}; test {time.monotonic() - t0:.1f} s"
    )
