"""MQTT (v5, through a broker) as a `swarm.transport.Transport`, over aiomqtt.

For networks where peers cannot reach each other directly. The broker only relays:
it authenticates nobody, so `TransportMessage.via` is always None and the gossip layer
verifies every envelope's signature.

Invariants:
- MQTT v5, QoS 1 both ways (the broker acknowledges each publish; `publish` returns
  only after the PUBACK and raises `ConnectionError` when not connected or when the
  broker connection drops mid-publish: nothing is dropped silently).
- Subscriptions use the MQTT v5 `no_local` option, so a node's own publishes are not
  delivered back to it.
- The client identifier is derived from the peer id (`swarm-<peer id>-<random>`): the
  random suffix keeps two processes sharing a key from kicking each other off the
  broker in a reconnect loop.
- Memory is bounded. Received messages wait in one `gossip.inbox.Inbox` (which survives
  reconnects) bounded by `config.max_queued_messages` messages and
  `config.max_queued_bytes` bytes; a message that does not fit is dropped and counted by
  reason (`stats()["dropped_incoming_by_reason"]`, total in `dropped_incoming`), never
  lost uncounted. aiomqtt's own incoming queue never holds anything: its `put_nowait`
  hands each message straight to the inbox, in the same callback that parsed it. MQTT
  names no authenticated sender, so the inbox cannot be fair between peers (a flooder
  and an honest peer look alike until the gossip layer verifies signatures).
- The broker is told (MQTT v5 CONNECT property Maximum Packet Size) never to send us a
  packet over `max_message_bytes` + `_PACKET_MARGIN_BYTES`: without it, a peer's
  256 MiB publish would be buffered whole by paho before anything here could refuse
  it. The broker discards such a message for us without telling anyone (the MQTT v5
  rule for a packet over the client's Maximum Packet Size; mosquitto 2.0 does so and
  keeps the connection); the gossip layer would have refused it anyway (`oversize`).
- A lost broker connection is retried forever with exponential backoff (0.2 s up to
  10 s); every subscribed topic is re-subscribed on each new connection.
- Payloads larger than `max_message_bytes` raise `ValueError` (the gossip layer chunks).
- After `stop`, `receive` raises `ConnectionError` (it never hangs on a dead transport).

Memory bound. What peers can make this transport hold is at most
  inbox:        max(max_queued_bytes, one message) + 512 B x queued messages
  one packet:   being read by paho, max_message_bytes + `_PACKET_MARGIN_BYTES`
(defaults: ~65 MiB), on top of the gossip layer's own bounds and allocator slack;
`tests/gossip/test_flood_rss.py` measures it. The broker holds the rest for us
(mosquitto: its `max_queued_messages` per client).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import Callable
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gossip.inbox import Inbox
from swarm.config.network import MqttTransportConfig
from swarm.identity import Identity
from swarm.transport import TransportMessage

__all__ = ["MqttTransport"]

log = logging.getLogger(__name__)

_BACKOFF_INITIAL_S = 0.2
_BACKOFF_MAX_S = 10.0
_CONNECT_TIMEOUT_S = 10.0
_QOS = 1
_PACKET_MARGIN_BYTES = 128 * 1024
"""Room over `max_message_bytes` in an incoming PUBLISH packet (topic, properties)."""


class MqttTransport:
    """Publish/subscribe through an MQTT v5 broker; see the module docstring."""

    def __init__(
        self,
        config: MqttTransportConfig,
        identity: Identity,
        *,
        publish_timeout_s: float = 30.0,
    ) -> None:
        self.config = config
        self.identity = identity
        self.peer_id = identity.peer_id
        self.client_id = f"swarm-{identity.peer_id}-{secrets.token_hex(4)}"
        self._publish_timeout_s = publish_timeout_s
        self._topics: list[str] = []
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._inbox: Inbox[TransportMessage] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._first_connect: asyncio.Future[None] | None = None
        self._client_queue_type = _inbox_queue_type(self._offer)
        self.published = 0
        self.reconnects = 0

    # ---- Transport protocol -------------------------------------------------------

    @property
    def max_message_bytes(self) -> int:
        return self.config.max_message_bytes

    @property
    def received(self) -> int:
        """Messages queued for `receive`."""
        return self._inbox.admitted if self._inbox is not None else 0

    @property
    def dropped_incoming(self) -> int:
        """Messages dropped because the node did not read its queue fast enough."""
        return self._inbox.dropped_total if self._inbox is not None else 0

    async def start(self, *, wait_connected_s: float | None = _CONNECT_TIMEOUT_S) -> None:
        """Start the connection loop; wait up to `wait_connected_s` for the broker.

        A broker that is not up yet is not fatal when `wait_connected_s` is None: the
        loop keeps retrying in the background.
        """
        if self._task is not None:
            raise RuntimeError("transport already started")
        self._stopping = False
        self._inbox = Inbox(
            max_messages=self.config.max_queued_messages,
            max_bytes=self.config.max_queued_bytes,
            name="MQTT receive",
        )
        self._inbox.bind(asyncio.get_running_loop())
        self._first_connect = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"mqtt-{self.peer_id[-8:]}")
        if wait_connected_s is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._first_connect), wait_connected_s)
            except TimeoutError:
                await self.stop()
                raise ConnectionError(
                    f"no MQTT broker answered at {self.config.host}:{self.config.port} "
                    f"within {wait_connected_s:.0f} s"
                ) from None

    async def stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._connected.clear()
        if self._inbox is not None:
            self._inbox.close()  # receive() drains what is queued, then raises

    async def subscribe(self, topic: str) -> None:
        if topic in self._topics:
            return
        self._topics.append(topic)
        client = self._client
        if client is not None and self._connected.is_set():
            try:
                await client.subscribe(topic, options=_subscribe_options())
            except aiomqtt.MqttError as exc:
                # The reconnect loop re-subscribes every topic in self._topics.
                log.info("subscribe to %s deferred to the next connection: %s", topic, exc)

    async def publish(self, topic: str, data: bytes) -> None:
        if len(data) > self.max_message_bytes:
            raise ValueError(
                f"message of {len(data)} bytes exceeds max_message_bytes "
                f"{self.max_message_bytes}; the gossip layer must chunk it"
            )
        client = self._client
        if client is None or not self._connected.is_set():
            raise ConnectionError(
                f"not connected to the MQTT broker {self.config.host}:{self.config.port}"
            )
        try:
            await client.publish(
                topic, bytes(data), qos=_QOS, timeout=self._publish_timeout_s
            )
        except aiomqtt.MqttError as exc:
            raise ConnectionError(f"MQTT publish on {topic} failed: {exc}") from exc
        self.published += 1

    async def receive(self) -> TransportMessage:
        if self._inbox is None:
            raise RuntimeError("transport not started")
        try:
            return await self._inbox.get()
        except ConnectionError:
            raise ConnectionError("MQTT transport stopped") from None

    def connected_peers(self) -> list[str]:
        """MQTT does not reveal peers; the broker stands in for all of them."""
        if self._connected.is_set():
            return [f"mqtt://{self.config.host}:{self.config.port}"]
        return []

    # ---- extras ---------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout_s)

    def stats(self) -> dict[str, Any]:
        inbox = self._inbox
        return {
            "published": self.published,
            "received": self.received,
            "dropped_incoming": self.dropped_incoming,
            "dropped_incoming_by_reason": dict(inbox.dropped) if inbox is not None else {},
            "queued_bytes": inbox.queued_bytes if inbox is not None else 0,
            "peak_queued_bytes": inbox.peak_bytes if inbox is not None else 0,
            "reconnects": self.reconnects,
        }

    # ---- connection loop --------------------------------------------------------------

    async def _run(self) -> None:
        delay = _BACKOFF_INITIAL_S
        while not self._stopping:
            try:
                async with aiomqtt.Client(
                    self.config.host,
                    self.config.port,
                    identifier=self.client_id,
                    protocol=aiomqtt.ProtocolVersion.V5,
                    queue_type=self._client_queue_type,
                    properties=self._connect_properties(),
                    timeout=_CONNECT_TIMEOUT_S,
                    keepalive=30,
                ) as client:
                    done: set[str] = set()
                    while pending := [t for t in self._topics if t not in done]:
                        for topic in pending:
                            await client.subscribe(topic, options=_subscribe_options())
                            done.add(topic)
                    # No await since the last check: a concurrent subscribe() either
                    # was seen above or finds the client connected and subscribes itself.
                    self._client = client
                    self._connected.set()
                    if self._first_connect is not None and not self._first_connect.done():
                        self._first_connect.set_result(None)
                    delay = _BACKOFF_INITIAL_S
                    log.info("connected to MQTT broker %s:%d", self.config.host, self.config.port)
                    await _wait_disconnected(client)
            except aiomqtt.MqttError as exc:
                if self._stopping:
                    break
                log.warning(
                    "MQTT broker %s:%d unavailable (%s); retrying in %.1f s",
                    self.config.host,
                    self.config.port,
                    exc,
                    delay,
                )
            finally:
                self._connected.clear()
                self._client = None
            if self._stopping:
                break
            self.reconnects += 1
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2.0, _BACKOFF_MAX_S)

    def _connect_properties(self) -> Properties:
        properties = Properties(PacketTypes.CONNECT)
        properties.MaximumPacketSize = self.config.max_message_bytes + _PACKET_MARGIN_BYTES
        return properties

    def _offer(self, message: aiomqtt.Message) -> None:
        """aiomqtt's callback for each received message: into the inbox or counted out."""
        inbox = self._inbox
        payload = message.payload
        if inbox is None or not isinstance(payload, bytes | bytearray):
            return  # never produced by peers of this swarm (they publish bytes)
        item = TransportMessage(topic=message.topic.value, data=bytes(payload), via=None)
        inbox.offer(item, len(payload))


async def _wait_disconnected(client: aiomqtt.Client) -> None:
    """Wait until the broker connection drops, then raise `MqttError`.

    aiomqtt's message iterator also ends on disconnection; its queue never holds a
    message here (`_inbox_queue_type`), so it yields nothing.
    """
    async for _ in client.messages:
        raise RuntimeError("aiomqtt queued a message; the inbox queue type was bypassed")


def _inbox_queue_type(
    on_message: Callable[[aiomqtt.Message], None],
) -> type[asyncio.Queue[aiomqtt.Message]]:
    """aiomqtt's incoming-queue class: hands every message to `on_message`, keeps none."""

    class InboxQueue(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            on_message(item)

    return InboxQueue


def _subscribe_options() -> SubscribeOptions:
    return SubscribeOptions(qos=_QOS, noLocal=True)
