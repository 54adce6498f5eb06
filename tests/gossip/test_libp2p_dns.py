"""Host names in peer addresses resolved by the system resolver (/etc/hosts too)."""

from __future__ import annotations

from typing import Any

import multiaddr
import pytest
import trio

from gossip.libp2p_dns import resolve_host_names, with_ip
from swarm.identity import Identity

PEER = Identity.from_seed(b"\x07" * 32).peer_id


def test_with_ip_keeps_the_transport_and_peer_parts() -> None:
    addr = f"/dns4/box.lan/tcp/4001/p2p/{PEER}"
    assert with_ip(addr, "10.0.0.5") == f"/ip4/10.0.0.5/tcp/4001/p2p/{PEER}"
    assert with_ip("/dns/box.lan/tcp/4001", "fe80::1") == "/ip6/fe80::1/tcp/4001"
    with pytest.raises(ValueError):
        with_ip("/ip4/1.2.3.4/tcp/1", "10.0.0.5")


def test_localhost_from_etc_hosts_resolves_and_others_pass_unchanged() -> None:
    addrs = [
        multiaddr.Multiaddr(f"/ip4/192.0.2.1/tcp/4001/p2p/{PEER}"),
        multiaddr.Multiaddr(f"/dns4/localhost/tcp/4001/p2p/{PEER}"),
        multiaddr.Multiaddr(f"/dns4/no-such-host.invalid/tcp/4001/p2p/{PEER}"),
    ]
    out = [str(a) for a in trio.run(resolve_host_names, addrs)]
    assert out == [
        f"/ip4/192.0.2.1/tcp/4001/p2p/{PEER}",
        f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}",  # /etc/hosts, which dnspython never reads
        f"/dns4/no-such-host.invalid/tcp/4001/p2p/{PEER}",  # left to the library
    ]


def test_a_bootstrap_peer_named_localhost_is_reached(spawn_peer: Any) -> None:
    """A real libp2p peer dialed as /dns4/localhost/... (before: never connected)."""
    listener = spawn_peer("listener", "--transport", "libp2p", "--heartbeat", "0.5",
                          "--listen", "/ip4/127.0.0.1/tcp/0").ready()  # fmt: skip
    port = listener.addrs[0].split("/tcp/")[1].split("/")[0]
    named = f"/dns4/localhost/tcp/{port}/p2p/{listener.peer_id}"
    dialer = spawn_peer("dialer", "--transport", "libp2p", "--heartbeat", "0.5",
                        "--bootstrap", named).ready()  # fmt: skip
    dialer.wait_until(
        lambda _: listener.peer_id in dialer.mesh(), 30.0, "the listener in the dialer's mesh"
    )
