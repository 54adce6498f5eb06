"""A relay serves its own swarm only (issue 31 item 6: a stranger reserved a slot on a
public node's relay and pushed 64 MiB through it; 40 of 40 reservations were granted).

Two real libp2p transports over loopback TCP, each in its own trio thread: the relay
(`relay = true`) and a peer asking it for a slot with a plain circuit relay v2 RESERVE,
first as a stranger (connected, subscribed to nothing of the relay's), then as a member
(subscribed to one of the relay's topics)."""

from __future__ import annotations

import asyncio
from typing import Any

from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, Status
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

from gossip.libp2p import Libp2pTransport
from tests.gossip.test_libp2p_liveness import start, until

TOPIC = "swarm/relay-test/peers"


async def _reserve(transport: Libp2pTransport, relay: str) -> int:
    """Send RESERVE to `relay` and return the status code of its answer."""

    async def ask() -> int:
        host = transport._host
        assert host is not None
        stream = await host.new_stream(ID.from_base58(relay), [HOP_PROTOCOL_ID])
        try:
            await write_delimited_msg(stream, HopMessage(type=HopMessage.RESERVE))
            answer = await read_delimited_msg(stream, HopMessage)
        finally:
            await stream.close()
        return int(answer.status)

    return await transport._call(ask)


def test_the_relay_grants_slots_to_peers_of_its_swarm_only() -> None:
    async def main() -> tuple[int, int, dict[str, Any]]:
        relay = await start(nat_traversal=True, relay=True)
        peer = await start(bootstrap=relay.listen_addrs())
        try:
            await relay.subscribe(TOPIC)
            await until(
                lambda: relay.peer_id in peer.connected_peers(), 10.0, lambda: "no connection"
            )
            as_stranger = await _reserve(peer, relay.peer_id)
            await peer.subscribe(TOPIC)
            await until(
                lambda: relay._is_swarm_peer(ID.from_base58(peer.peer_id)),
                10.0,
                lambda: "the relay never saw the peer's subscription",
            )
            as_member = await _reserve(peer, relay.peer_id)
            assert relay._nat is not None
            return as_stranger, as_member, dict(relay._nat.counts)
        finally:
            await peer.stop()
            await relay.stop()

    as_stranger, as_member, counts = asyncio.run(main())
    assert as_stranger != Status.OK and as_member == Status.OK, (as_stranger, as_member)
    assert counts["relay_refused_stranger"] == 1
