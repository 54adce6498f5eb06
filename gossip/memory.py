"""An in-process transport: `MemoryNetwork` hubs (by name) and `MemoryTransport` ends.

Used by unit tests and simnet. Nothing here authenticates anyone (`via` is None), just
as with MQTT: gossip's envelope signatures are what make a sender authentic.

Invariants:
- A published message goes to every *other* running transport on the same network that
  is subscribed to its topic at publish time (never back to the publisher), in the order
  the transports were started, so a run is deterministic.
- How a message reaches one receiver is the network's *delivery policy*:
  `policy(src, dst, topic, data)`, injected at construction (or by overriding
  `MemoryNetwork.deliver`). The default delivers at once. A link model (latency, loss,
  partitions) replaces it and later calls `dst.enqueue(...)` itself, or never.
- `enqueue` accepts a message only if the receiver is running and still subscribed to
  the topic; it never blocks: each receiver's queue is bounded by `queue_size` messages
  and `config.max_queued_bytes` bytes (payload + `MESSAGE_OVERHEAD_BYTES` each; a
  message arriving at an empty queue always fits), and a message that does not fit is
  dropped and counted (`drops["queue_full"]`, either bound). Memory bound per receiver:
  max(max_queued_bytes, one message) + 512 B per queued message (payload bytes are
  shared with the publisher and the other receivers, so this over-counts).
  There is no fairness between sources here (unlike libp2p): simnet's runs stay
  exactly as they were, and `source` is bookkeeping, not authentication.
- Each delivered message is a `MemoryMessage`, a `TransportMessage` that also records
  the source transport's peer id in `source` (for tests and simnet bookkeeping only; it
  is not authentication and gossip ignores it).
- `peer_network(peer)` is where the network was told the peer is seen (`locate`, set
  by simnet: a stand-in for the address of a direct connection), None for a peer never
  located (unit tests: every sender unlocated).
- A transport refuses to publish anything over its own `max_message_bytes`
  (`ValueError`): a sender bug, not a peer's fault.
- `deliver_now(topic, data, source=...)` is `enqueue` followed at once by `receive`, for
  a caller that is the transport's only reader (simnet): the same checks and drop
  counts, the same `delivered` count and the same message; on an empty queue (simnet's
  case: it receives each message as it enqueues it) the message skips the queue, which
  `enqueue` + `receive` would have left empty again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gossip.inbox import MESSAGE_OVERHEAD_BYTES
from swarm.config.network import MemoryTransportConfig
from swarm.identity import Identity
from swarm.transport import TransportMessage

DEFAULT_QUEUE_SIZE = 1024


@dataclass(frozen=True)
class MemoryMessage(TransportMessage):
    source: str = ""
    """Peer id of the transport that published it (bookkeeping, not authentication)."""


DeliverPolicy = Callable[["MemoryTransport", "MemoryTransport", str, bytes], None]


class MemoryNetwork:
    """A named in-process hub routing published bytes to subscribed transports."""

    def __init__(self, name: str = "default", deliver: DeliverPolicy | None = None) -> None:
        self.name = name
        self._policy = deliver
        self._transports: dict[str, MemoryTransport] = {}
        self.published = 0
        """Messages published on this network."""
        self.routed = 0
        """(message, receiver) pairs handed to the delivery policy."""
        self._locations: dict[str, str] = {}

    def set_policy(self, deliver: DeliverPolicy | None) -> None:
        """Replace the delivery policy (None: deliver at once)."""
        self._policy = deliver

    def deliver(self, src: MemoryTransport, dst: MemoryTransport, topic: str, data: bytes) -> None:
        """Hand one message from `src` to `dst`; the link model's hook."""
        if self._policy is not None:
            self._policy(src, dst, topic, data)
        else:
            dst.enqueue(topic, data, source=src.peer_id)

    def attach(self, transport: MemoryTransport) -> None:
        current = self._transports.get(transport.peer_id)
        if current is not None and current is not transport:
            raise ValueError(f"peer {transport.peer_id} is already on network {self.name!r}")
        self._transports[transport.peer_id] = transport

    def detach(self, transport: MemoryTransport) -> None:
        if self._transports.get(transport.peer_id) is transport:
            del self._transports[transport.peer_id]

    def transports(self) -> list[MemoryTransport]:
        """Running transports, in the order they started."""
        return list(self._transports.values())

    def connected_peers(self, transport: MemoryTransport) -> list[str]:
        """Who `transport` is connected to: everyone else here (a link model may narrow it)."""
        return [peer for peer in self._transports if peer != transport.peer_id]

    def locate(self, peer: str, network: str | None) -> None:
        """Say at which network `peer` is seen (simnet's stand-in for the address of a
        direct connection; None: nowhere)."""
        if network is None:
            self._locations.pop(peer, None)
        else:
            self._locations[peer] = network

    def peer_network(self, transport: MemoryTransport, peer: str) -> str | None:
        """The network `transport` sees `peer` at (`locate`), or None."""
        return self._locations.get(peer)

    def route(self, src: MemoryTransport, topic: str, data: bytes) -> int:
        """Offer `data` to every other subscriber of `topic`; return how many were offered."""
        self.published += 1
        receivers = [
            dst for dst in self._transports.values() if dst is not src and dst.is_subscribed(topic)
        ]
        for dst in receivers:
            self.routed += 1
            self.deliver(src, dst, topic, data)
        return len(receivers)


_NETWORKS: dict[str, MemoryNetwork] = {}


def get_network(name: str = "default") -> MemoryNetwork:
    """The process-wide network called `name`, created on first use."""
    network = _NETWORKS.get(name)
    if network is None:
        network = MemoryNetwork(name)
        _NETWORKS[name] = network
    return network


def remove_network(name: str) -> None:
    """Forget a named network (tests use this to start clean)."""
    _NETWORKS.pop(name, None)


class MemoryTransport:
    """One peer's end of a `MemoryNetwork`; implements `swarm.transport.Transport`.

    `MemoryTransport(config, identity)` joins the network named `config.network` (the
    process-wide registry); pass `network=` to join a given hub instead (simnet, with its
    link model). `identity` may be a bare peer id string (hostile peers in simnet).
    """

    def __init__(
        self,
        config: MemoryTransportConfig,
        identity: Identity | str,
        *,
        network: MemoryNetwork | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        if queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        self.peer_id = identity if isinstance(identity, str) else identity.peer_id
        self.network = network if network is not None else get_network(config.network)
        self._max_message_bytes = config.max_message_bytes
        self._max_queued_bytes = config.max_queued_bytes
        self._queue: asyncio.Queue[TransportMessage] = asyncio.Queue(maxsize=queue_size)
        self.queued_bytes = 0
        """Bytes charged for the messages in the queue (see the module docstring)."""
        self._topics: set[str] = set()
        self._running = False
        self.drops: Counter[str] = Counter()
        """Messages offered to this transport but not queued, by reason."""
        self.delivered = 0
        """Messages queued for this transport's `receive`."""

    @property
    def max_message_bytes(self) -> int:
        return self._max_message_bytes

    @property
    def running(self) -> bool:
        return self._running

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    def is_subscribed(self, topic: str) -> bool:
        return topic in self._topics

    async def start(self) -> None:
        self.network.attach(self)
        self._running = True

    async def stop(self) -> None:
        self._running = False
        self.network.detach(self)
        while not self._queue.empty():
            self._queue.get_nowait()
        self.queued_bytes = 0

    async def subscribe(self, topic: str) -> None:
        self._topics.add(topic)

    async def publish(self, topic: str, data: bytes) -> None:
        if not self._running:
            raise RuntimeError(f"memory transport {self.peer_id} is not started")
        if not isinstance(data, bytes):
            raise TypeError("data must be bytes")
        if len(data) > self._max_message_bytes:
            raise ValueError(f"{len(data)} bytes > max_message_bytes {self._max_message_bytes}")
        self.network.route(self, topic, data)

    async def receive(self) -> TransportMessage:
        message = await self._queue.get()
        self.queued_bytes -= len(message.data) + MESSAGE_OVERHEAD_BYTES
        return message

    def connected_peers(self) -> list[str]:
        return self.network.connected_peers(self) if self._running else []

    def peer_network(self, peer: str) -> str | None:
        return self.network.peer_network(self, peer)

    def pending(self) -> int:
        """Messages queued and not yet received."""
        return self._queue.qsize()

    def deliver_now(self, topic: str, data: bytes, *, source: str) -> TransportMessage | None:
        """`enqueue` then `receive` at once (see the module docstring); None if dropped."""
        if not self._queue.empty():
            if not self.enqueue(topic, data, source=source):
                return None
            message = self._queue.get_nowait()
            self.queued_bytes -= len(message.data) + MESSAGE_OVERHEAD_BYTES
            return message
        # An empty queue: `enqueue`'s checks, none of which can refuse for size (a message
        # arriving at an empty queue always fits), and `receive` would hand it back.
        if not self._running:
            self.drops["not_running"] += 1
            return None
        if topic not in self._topics:
            self.drops["not_subscribed"] += 1
            return None
        self.delivered += 1
        return MemoryMessage(topic=topic, data=data, via=None, source=source)

    def enqueue(self, topic: str, data: bytes, *, source: str) -> bool:
        """Queue one message for `receive` (the delivery policy's end); False if dropped."""
        if not self._running:
            self.drops["not_running"] += 1
            return False
        if topic not in self._topics:
            self.drops["not_subscribed"] += 1
            return False
        size = len(data) + MESSAGE_OVERHEAD_BYTES
        if self.queued_bytes + size > self._max_queued_bytes and not self._queue.empty():
            self.drops["queue_full"] += 1
            return False
        try:
            self._queue.put_nowait(MemoryMessage(topic=topic, data=data, via=None, source=source))
        except asyncio.QueueFull:
            self.drops["queue_full"] += 1
            return False
        self.queued_bytes += size
        self.delivered += 1
        return True
