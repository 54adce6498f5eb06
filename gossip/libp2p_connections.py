"""What a libp2p host's open connections say about its peers, read from the asyncio side.

- `is_relayed`: a connection through a relay (`/p2p-circuit`), not a direct one.
- `connected_peer_ids`: every peer with an open connection (base58).
- `connections_open`: how many connections are open, both directions.
- `peer_links`: per connected peer, `direct` if one connection to it is direct, else
  `relayed` (every connection is a `/p2p-circuit`).
- `peer_network`: the address block (`gossip.libp2p_inbound.network_key`) of the first
  direct connection to a peer that has an IP address; None when it has none (a relay's
  address says nothing about the peers behind it). `node.trust` counts keys by it.

Invariants: read-only snapshots, safe from any thread (`tuple()` and `len()` over the
library's dict and lists run in C under the GIL); a connection that is closing and
fails an accessor counts as relayed or address-less, never raises here.
"""

from __future__ import annotations

from collections.abc import Iterator

from libp2p.abc import IHost, INetConn
from libp2p.connection_types import ConnectionType

from gossip.libp2p_inbound import network_key


def is_relayed(conn: INetConn) -> bool:
    """True when `conn` runs through a relay (a `/p2p-circuit` connection)."""
    try:
        if conn.get_connection_type() == ConnectionType.RELAYED:
            return True
        return any("/p2p-circuit" in str(a) for a in conn.get_transport_addresses())
    except Exception:  # noqa: BLE001 - a closing connection may fail any accessor
        return False


def _connections(host: IHost) -> Iterator[tuple[str, tuple[INetConn, ...]]]:
    for pid, conns in tuple(host.get_network().connections.items()):
        yield pid.to_base58(), tuple(conns if isinstance(conns, list) else [conns])


def connected_peer_ids(host: IHost) -> list[str]:
    return [pid.to_base58() for pid in tuple(host.get_network().connections)]


def connections_open(host: IHost) -> int:
    return sum(len(conns) for conns in tuple(host.get_network().connections.values()))


def peer_links(host: IHost) -> dict[str, str]:
    """Per connected peer (base58): `direct` if one connection is direct, else `relayed`."""
    return {
        peer: "direct" if any(not is_relayed(c) for c in conns) else "relayed"
        for peer, conns in _connections(host)
    }


def _address_network(conn: INetConn) -> str | None:
    try:
        addrs = conn.get_transport_addresses()
    except Exception:  # noqa: BLE001 - a closing connection may fail any accessor
        return None
    for addr in addrs:
        for proto in ("ip4", "ip6"):
            try:
                return network_key(addr.value_for_protocol(proto))
            except Exception:  # noqa: BLE001 - the address lacks that protocol
                continue
    return None


def peer_network(host: IHost, peer: str) -> str | None:
    """The network of the first direct connection to `peer` (base58) with an IP address."""
    for pid, conns in _connections(host):
        if pid == peer:
            for conn in conns:
                network = None if is_relayed(conn) else _address_network(conn)
                if network is not None:
                    return network
    return None
