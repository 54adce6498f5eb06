"""Pure parts of `gossip.nat`: reachability verdicts, who dials a circuit, the AutoNAT
server's dial-back targets and request bookkeeping, relayed-link detection, the
relay's byte budgets per peer, and the config rule."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import multiaddr
import pytest
from libp2p import new_host
from libp2p.connection_types import ConnectionType
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from pydantic import ValidationError

from gossip.libp2p_connections import is_relayed, peer_links, peer_network
from gossip.nat import (
    PRIVATE,
    PUBLIC,
    UNKNOWN,
    _DialBackAutoNAT,
    dials_circuit,
    observed_ip,
    reachability_of,
    stream_is_relayed,
)
from gossip.relay import (
    RELAY_PEER_BURST_BYTES,
    ByteBudgets,
    SwarmCircuitRelay,
    SwarmRelayResources,
)
from swarm.config.network import Libp2pTransportConfig


def _id() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


def test_reachability_needs_one_verdict_and_any_success_wins() -> None:
    a, b = _id(), _id()
    assert reachability_of({}) == UNKNOWN
    assert reachability_of({a: False}) == PRIVATE
    assert reachability_of({a: False, b: True}) == PUBLIC


def test_only_the_smaller_private_peer_dials_the_circuit() -> None:
    assert dials_circuit("A", "B", PRIVATE)
    assert not dials_circuit("B", "A", PRIVATE)
    assert dials_circuit("B", "A", PUBLIC) and dials_circuit("B", "A", UNKNOWN)


def test_dial_back_targets_the_observed_ip_at_advertised_ports() -> None:
    advertised = [
        multiaddr.Multiaddr(a).to_bytes()
        for a in ("/ip4/192.168.1.2/tcp/4001", "/ip4/0.0.0.0/tcp/4001", "/ip4/10.0.0.5/tcp/5000")
    ]
    out = [str(multiaddr.Multiaddr(raw)) for raw in _DialBackAutoNAT._filter_by_observed_ip(
        [*advertised, b"\xff garbage"], "10.77.1.1")]  # fmt: skip
    assert out == ["/ip4/10.77.1.1/tcp/4001", "/ip4/10.77.1.1/tcp/5000"]
    assert _DialBackAutoNAT._filter_by_observed_ip(advertised, None) == []


@dataclass
class _Conn:
    addrs: list[str]
    kind: ConnectionType = ConnectionType.UNKNOWN

    def get_connection_type(self) -> ConnectionType:
        return self.kind

    def get_transport_addresses(self) -> list[multiaddr.Multiaddr]:
        return [multiaddr.Multiaddr(a) for a in self.addrs]


@dataclass
class _Host:
    connections: dict[ID, list[_Conn]] = field(default_factory=dict)

    def get_network(self) -> _Host:
        return self


def test_a_peer_is_relayed_only_while_every_connection_is_a_circuit() -> None:
    relay, peer, other = _id(), _id(), _id()
    circuit = _Conn([f"/p2p/{relay}/p2p-circuit/p2p/{peer}"])
    tagged = _Conn([], ConnectionType.RELAYED)
    tcp = _Conn(["/ip4/10.77.2.1/tcp/4001"])
    assert is_relayed(circuit) and is_relayed(tagged) and not is_relayed(tcp)
    host = _Host({peer: [circuit], other: [tagged, tcp]})
    assert peer_links(host) == {peer.to_base58(): "relayed", other.to_base58(): "direct"}  # type: ignore[arg-type]


def test_a_peer_is_placed_by_its_first_direct_connection_with_an_ip() -> None:
    relay, peer, other, v6 = _id(), _id(), _id(), _id()
    circuit = _Conn([f"/ip4/198.51.100.9/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{peer}"])
    host = _Host(
        {
            peer: [circuit],  # the relay's address is not the peer's
            other: [
                circuit,
                _Conn(["/dns4/peer.example/tcp/4001"]),
                _Conn(["/ip4/203.0.113.5/tcp/4001"]),
            ],
            v6: [_Conn(["/ip6/2001:db8:1:2::5/tcp/4001"])],
        }
    )
    assert peer_network(host, peer.to_base58()) is None  # type: ignore[arg-type]
    assert peer_network(host, other.to_base58()) == "203.0.113.0/24"  # type: ignore[arg-type]
    assert peer_network(host, v6.to_base58()) == "2001:db8:1::/48"  # type: ignore[arg-type]
    assert peer_network(host, _id().to_base58()) is None  # type: ignore[arg-type]


def test_relay_without_nat_traversal_is_refused_naming_the_fix() -> None:
    assert Libp2pTransportConfig(relay=True).relay
    with pytest.raises(ValidationError, match="nat_traversal = true"):
        Libp2pTransportConfig(relay=True, nat_traversal=False)


def _stream(remote: Any = None, addrs: list[str] | None = None) -> Any:
    def get_remote_address() -> Any:
        if isinstance(remote, Exception):
            raise remote
        return remote

    def get_transport_addresses() -> list[multiaddr.Multiaddr]:
        if addrs is None:
            raise OSError("closed")
        return [multiaddr.Multiaddr(a) for a in addrs]

    return SimpleNamespace(
        get_remote_address=get_remote_address,
        muxed_conn=SimpleNamespace(get_transport_addresses=get_transport_addresses),
    )


def test_the_observed_ip_is_the_remote_address_with_mapped_ipv6_as_ipv4() -> None:
    assert observed_ip(_stream(("10.77.1.1", 4001))) == "10.77.1.1"
    assert observed_ip(_stream(("::FFFF:10.77.1.1", 4001))) == "10.77.1.1"
    assert observed_ip(_stream(("2001:DB8::1", 4001))) == "2001:db8::1"
    assert observed_ip(_stream(None)) is None
    assert observed_ip(_stream(OSError("gone"))) is None


def test_a_stream_counts_as_relayed_when_its_addresses_cannot_be_read() -> None:
    assert stream_is_relayed(_stream(addrs=["/p2p/QmRelay/p2p-circuit"]))
    assert not stream_is_relayed(_stream(addrs=["/ip4/10.77.2.1/tcp/4001"]))
    assert stream_is_relayed(_stream(addrs=None))  # fails closed, as the spec wants


def test_a_failed_autonat_request_is_counted_and_ours_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counts = {"autonat_requests_failed": 0}
    autonat = _DialBackAutoNAT(new_host(), counts)
    with caplog.at_level(logging.DEBUG, logger="gossip.libp2p"):
        autonat._request_failed(ConnectionResetError("peer reset"))
        assert [r.levelno for r in caplog.records] == [logging.DEBUG]
        caplog.clear()
        for _ in range(2):  # the library lost a hook: not the peer's doing
            autonat._request_failed(AttributeError("no attribute '_handle_request'"))
        assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG]
    assert counts["autonat_requests_failed"] == 3


def test_a_byte_budget_starts_full_refuses_what_it_lacks_and_refills_at_its_rate() -> None:
    budgets = ByteBudgets(per_s=100.0, burst=1000.0, max_peers=2)
    assert budgets.take("p", 600, now=0.0)
    assert not budgets.take("p", 600, now=0.0)  # 400 left: refused, nothing charged
    assert budgets.take("p", 400, now=0.0)
    assert not budgets.take("p", 1, now=0.0)
    assert budgets.take("q", 1000, now=0.0)  # each peer its own
    assert budgets.take("p", 500, now=5.0)  # refilled at 100/s
    assert not budgets.take("p", 1, now=5.0)
    assert budgets.take("p", 1000, now=1000.0)  # never past the burst
    assert not budgets.take("p", 1, now=1000.0)


def test_a_circuit_whose_source_is_over_its_budget_is_reset_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The relay's data loop reads through `_read_stream_with_retry`; what a peer pushes
    is charged to it across circuits, and past its budget its circuit ends."""
    import trio
    from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

    chunk = 1 << 20

    async def library_read(self: Any, stream: Any, *args: Any) -> bytes:
        return b"x" * chunk

    monkeypatch.setattr(CircuitV2Protocol, "_read_stream_with_retry", library_read)
    counts = {"relay_refused_stranger": 0, "relay_budget_exceeded": 0}
    relay = SwarmCircuitRelay(new_host(), allow_hop=True, member=lambda _: True, counts=counts)
    source = _id()

    @dataclass
    class Stream:
        muxed_conn: Any = field(default_factory=lambda: SimpleNamespace(peer_id=source))
        resets: int = 0

        async def reset(self) -> None:
            self.resets += 1

    async def read_until_refused() -> tuple[int, list[Stream]]:
        streams = [Stream(), Stream()]  # two circuits of the same source share its budget
        pushed = 0
        for i in range(10_000):
            if await relay._read_stream_with_retry(streams[i % 2]) is None:
                return pushed, streams
            pushed += chunk
        raise AssertionError("never refused")

    pushed, streams = trio.run(read_until_refused)
    assert pushed == RELAY_PEER_BURST_BYTES  # the refill over the test's time is < 1 chunk
    assert counts["relay_budget_exceeded"] == 1
    assert sum(s.resets for s in streams) == 1


def test_a_relay_slot_is_freed_when_its_peer_is_gone() -> None:
    """The library kept a slot until it expired (an hour): identities that connected once
    each filled the relay. A departed peer's slot now goes to the next member."""
    from libp2p.relay.circuit_v2.resources import RelayLimits

    a, b, c = _id(), _id(), _id()
    connections: dict[ID, list[object]] = {a: [object()], b: [object()], c: [object()]}
    host = SimpleNamespace(
        get_network=lambda: SimpleNamespace(connections=connections),
        get_peerstore=lambda: None,
        get_private_key=lambda: create_new_key_pair().private_key,
    )
    counts = {"relay_refused_stranger": 0, "relay_reservations_released": 0}
    limits = RelayLimits(duration=3600, data=1 << 20, max_circuit_conns=1, max_reservations=2)
    book = SwarmRelayResources(limits, host, lambda _: True, counts)  # type: ignore[arg-type]
    for peer in (a, b):
        assert book.can_accept_reservation(peer)
        book.create_reservation(peer)
    assert not book.can_accept_reservation(c)  # full
    del connections[a]
    assert book.can_accept_reservation(c)
    assert not book.has_reservation(a) and book.has_reservation(b)
    assert counts["relay_reservations_released"] == 1
