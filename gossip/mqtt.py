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
- Memory is bounded: aiomqtt's incoming queue holds at most
  `config.max_queued_messages`, and so does our receive queue (which survives
  reconnects and is fed from aiomqtt's at once); a message arriving at either full
  queue is dropped and counted in `dropped_incoming`, never lost uncounted.
- A lost broker connection is retried forever with exponential backoff (0.2 s up to
  10 s); every subscribed topic is re-subscribed on each new connection.
- Payloads larger than `max_message_bytes` raise `ValueError` (the gossip layer chunks).
- After `stop`, `receive` raises `ConnectionError` (it never hangs on a dead transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import Callable

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from swarm.config.network import MqttTransportConfig
from swarm.identity import Identity
from swarm.transport import TransportMessage

__all__ = ["MqttTransport"]

log = logging.getLogger(__name__)

_BACKOFF_INITIAL_S = 0.2
_BACKOFF_MAX_S = 10.0
_CONNECT_TIMEOUT_S = 10.0
_QOS = 1
_CLOSED = object()


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
        self._queue: asyncio.Queue[TransportMessage | object] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._first_connect: asyncio.Future[None] | None = None
        self.dropped_incoming = 0
        """Messages dropped because the node did not read its queue fast enough."""
        self._client_queue_type = _counting_queue_type(self._count_drop)
        self.published = 0
        self.received = 0
        self.reconnects = 0

    # ---- Transport protocol -------------------------------------------------------

    @property
    def max_message_bytes(self) -> int:
        return self.config.max_message_bytes

    async def start(self, *, wait_connected_s: float | None = _CONNECT_TIMEOUT_S) -> None:
        """Start the connection loop; wait up to `wait_connected_s` for the broker.

        A broker that is not up yet is not fatal when `wait_connected_s` is None: the
        loop keeps retrying in the background.
        """
        if self._task is not None:
            raise RuntimeError("transport already started")
        self._stopping = False
        self._queue = asyncio.Queue(maxsize=self.config.max_queued_messages)
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
        queue = self._queue
        if queue is not None:
            while queue.full():
                queue.get_nowait()
                self.dropped_incoming += 1
            queue.put_nowait(_CLOSED)  # wakes (and fails) any pending receive()

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
        if self._queue is None:
            raise RuntimeError("transport not started")
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # every later receive() fails too
            raise ConnectionError("MQTT transport stopped")
        assert isinstance(item, TransportMessage)
        return item

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

    def stats(self) -> dict[str, int]:
        return {
            "published": self.published,
            "received": self.received,
            "dropped_incoming": self.dropped_incoming,
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
                    max_queued_incoming_messages=self.config.max_queued_messages,
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
                    await self._pump(client)
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

    async def _pump(self, client: aiomqtt.Client) -> None:
        assert self._queue is not None
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                continue  # never produced by peers of this swarm (they publish bytes)
            item = TransportMessage(topic=message.topic.value, data=bytes(payload), via=None)
            try:
                self._queue.put_nowait(item)
                self.received += 1
            except asyncio.QueueFull:
                self._count_drop()

    def _count_drop(self) -> None:
        self.dropped_incoming += 1
        if self.dropped_incoming in (1, 10, 100) or self.dropped_incoming % 1000 == 0:
            log.warning(
                "MQTT receive queue full (%d): %d messages dropped so far",
                self.config.max_queued_messages,
                self.dropped_incoming,
            )


def _counting_queue_type(
    on_drop: Callable[[], None],
) -> type[asyncio.Queue[aiomqtt.Message]]:
    """aiomqtt's incoming-queue class: bounded, counting (not just logging) each drop."""

    class CountingQueue(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            if self.full():
                on_drop()
                return
            super().put_nowait(item)

    return CountingQueue


def _subscribe_options() -> SubscribeOptions:
    return SubscribeOptions(qos=_QOS, noLocal=True)
