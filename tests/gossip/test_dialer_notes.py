"""The re-dialer learns of a connection the moment it opens, not at its next check.

A peer that connects and leaves between two of the re-dialer's checks used to go
unseen (never re-dialed). The network notifee now notes it; this drives `Redialer.run`
under trio with a stand-in host (the real py-libp2p path runs in
tests/gossip/test_libp2p_liveness.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import multiaddr
import pytest
import trio
from libp2p.exceptions import MultiError
from libp2p.peer.id import ID

import gossip.libp2p_dialer as dialer_mod
from gossip.libp2p_dialer import Redialer, dial_failure_cause
from swarm.identity import Identity

ADDR = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/9")


class _Host:
    """Just what `Redialer.run` uses: connections, notifees, unblock_peer, a peerstore,
    connect()."""

    def __init__(self) -> None:
        self.connections: dict[ID, Any] = {}
        self.notifees: list[Any] = []
        self.dialed: list[ID] = []
        self.me = ID.from_base58(Identity.generate().peer_id)
        self.network = SimpleNamespace(
            connections=self.connections,
            register_notifee=self.notifees.append,
            unblock_peer=lambda peer_id: None,
        )
        self.peerstore = SimpleNamespace(addrs=lambda pid: [ADDR], peers_with_addrs=lambda: [])

    def get_id(self) -> ID:
        return self.me

    def get_network(self) -> Any:
        return self.network

    def get_peerstore(self) -> Any:
        return self.peerstore

    async def connect(self, info: Any) -> None:
        self.dialed.append(info.peer_id)
        raise ConnectionRefusedError("gone")


@pytest.mark.parametrize("noted", [True, False])
def test_a_peer_that_came_and_went_between_two_checks_is_redialed(
    monkeypatch: pytest.MonkeyPatch, noted: bool
) -> None:
    monkeypatch.setattr(dialer_mod, "MAINTENANCE_PERIOD_S", 0.05)
    host, redialer = _Host(), Redialer([], mdns=False)
    visitor = ID.from_base58(Identity.generate().peer_id)

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(redialer.run, host)
            await trio.sleep(0.2)  # a few checks with nobody connected
            (notes,) = host.notifees
            if noted:  # the library opens the connection and closes it before a check
                conn = SimpleNamespace(muxed_conn=SimpleNamespace(peer_id=visitor))  # as SwarmConn
                await notes.connected(host.network, conn)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert (visitor in host.dialed) == noted
    assert redialer.dials_failed == host.dialed.count(visitor)


def test_a_dial_failure_is_told_by_its_root_cause() -> None:
    # The shape py-libp2p 0.8.1 raises for a closed port (seen by hand).
    refused = ConnectionRefusedError(111, "Connection refused")
    group = ExceptionGroup("all attempts failed", [refused])
    os_error = OSError("all attempts to connect to 127.0.0.1:9 failed")
    os_error.__cause__ = group
    swarm_error = RuntimeError("fail to open connection to peer")
    swarm_error.__cause__ = os_error
    top = MultiError([swarm_error])
    assert dial_failure_cause(top) == "ConnectionRefusedError: [Errno 111] Connection refused"
    assert dial_failure_cause(ValueError("plain")) == "ValueError: plain"
