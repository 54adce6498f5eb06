"""The `Transport` protocol: moving opaque bytes per topic, and the topic names.

Invariants:
- A transport never interprets payloads; it delivers whole messages or nothing.
- `TransportMessage.via` is the peer id the transport itself authenticated (libp2p's
  signed `from`), or None where the transport authenticates nobody (MQTT, memory).
- Topic names are `swarm/<swarm_id>/<kind>`, with kinds `peers`, `rollouts`,
  `deltas/<family>`.
- A transport that relays peers' messages to other peers (GossipSub) may take a
  `ForwardGate` (`set_forward_gate`): it then forwards and delivers only what the gate
  passes, and reports what it refused with the peer that handed it over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class TransportMessage:
    """One message as a transport delivers it. `via`: the peer the transport
    authenticated as its origin, if any. `signature_checked`: the transport's
    `ForwardGate` already verified the envelope signature of exactly these bytes (with
    the same checks as `gossip.layer`), so the layer does not verify it again."""

    topic: str
    data: bytes
    via: str | None = None
    signature_checked: bool = field(default=False, kw_only=True)


@dataclass(frozen=True)
class ForwardGate:
    """What a relaying transport asks before it forwards a peer's message.

    `check(topic, data, origin)` returns None to forward (and deliver) the message, or
    the reason to refuse it; it runs in the transport's own thread, so it may read only
    state that never changes. `refused(forwarder, reason)` is called, also in that
    thread, for each refusal: `forwarder` is the connected peer that handed the message
    over (which may not be its origin); `ignored(peer)` says whether the messages a
    connected peer forwards are refused unread for now (`ignored_peer`). `blame(peer,
    reason)` reports what the transport itself refused from a connected peer (and
    counted in its own stats), so that it weighs on that peer's score too."""

    check: Callable[[str, bytes, str], str | None]
    refused: Callable[[str, str], None]
    ignored: Callable[[str], bool]
    blame: Callable[[str, str], None]


class Transport(Protocol):
    """Publish/subscribe of bytes per topic between peers."""

    @property
    def max_message_bytes(self) -> int:
        """Largest message this transport carries whole; gossip chunks anything larger."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def subscribe(self, topic: str) -> None: ...

    async def publish(self, topic: str, data: bytes) -> None: ...

    async def receive(self) -> TransportMessage:
        """Wait for the next message on any subscribed topic."""
        ...

    def connected_peers(self) -> list[str]: ...

    def peer_network(self, peer: str) -> str | None:
        """The network (an address block, e.g. an IPv4 /24) at which this transport is
        directly connected to `peer`, or None when it cannot say (no direct connection,
        a relay or a broker in between). Read from the connection, never from the peer's
        word; `node.trust` counts the keys seen at one network as one operator."""
        ...


def topic(swarm_id: str, kind: str) -> str:
    return f"swarm/{swarm_id}/{kind}"


def peers_topic(swarm_id: str) -> str:
    return topic(swarm_id, "peers")


def rollouts_topic(swarm_id: str) -> str:
    return topic(swarm_id, "rollouts")


def deltas_topic(swarm_id: str, family: str) -> str:
    return topic(swarm_id, f"deltas/{family}")
