"""The `Transport` protocol: moving opaque bytes per topic, and the topic names.

Invariants:
- A transport never interprets payloads; it delivers whole messages or nothing.
- `TransportMessage.via` is the peer id the transport itself authenticated (libp2p's
  signed `from`), or None where the transport authenticates nobody (MQTT, memory).
- Topic names are `swarm/<swarm_id>/<kind>`, with kinds `peers`, `rollouts`,
  `deltas/<family>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TransportMessage:
    topic: str
    data: bytes
    via: str | None = None


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


def topic(swarm_id: str, kind: str) -> str:
    return f"swarm/{swarm_id}/{kind}"


def peers_topic(swarm_id: str) -> str:
    return topic(swarm_id, "peers")


def rollouts_topic(swarm_id: str) -> str:
    return topic(swarm_id, "rollouts")


def deltas_topic(swarm_id: str, family: str) -> str:
    return topic(swarm_id, f"deltas/{family}")
