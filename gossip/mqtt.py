"""MQTT (v5, through a broker) as a `swarm.transport.Transport`, over aiomqtt.

For networks where peers cannot reach each other directly. The broker only relays:
it authenticates nobody, so `TransportMessage.via` is always None and the gossip layer
verifies every envelope's signature.

Invariants:
- MQTT v5, QoS 1 both ways. `publish` hands the message to the broker connection and
  returns; its PUBACK is awaited in the background, with at most
  `config.max_inflight_publishes` publishes awaiting theirs at once (a further
  `publish` waits for a slot). So a burst (a chunked delta) is not one broker round
  trip per message: on a link with RTT r, n chunks take about n x r / window instead
  of n x r. Publishes reach the connection in call order. `publish` never raises for a
  network cause and never waits for an absent broker: a publish while disconnected, or
  one whose connection drops (or whose PUBACK does not come within
  `publish_timeout_s`) before the broker acknowledged it, is dropped and counted by
  reason (`stats()["dropped_outgoing_by_reason"]`: `disconnected`, `connection_lost`,
  `publish_failed`; total in `dropped_outgoing`), never retried, never lost uncounted;
  `published` counts PUBACKs received. `stop` waits up to `_STOP_GRACE_S` for the
  PUBACKs still due, then counts the rest as `connection_lost`. `publish` raises
  `ValueError` for a payload over `max_message_bytes` (the caller's bug) and
  `ConnectionError` only before `start`, after `stop`, after the connection loop
  crashed (our bug; `receive` raises then too), or after a publish failed for a cause
  other than the network (our bug too; logged with its traceback).
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
- A lost broker connection (a broker restart, a network cut) is retried forever with
  exponential backoff and jitter (0.2 s up to 10 s); every subscribed topic is
  re-subscribed on each new connection before the transport counts as connected. Only
  network errors (`aiomqtt.MqttError`, `OSError`, `TimeoutError`) are retried; anything
  else is our bug and ends the loop (logged, `receive` raises). The log gets one
  WARNING per distinct cause per outage (`gossip.mqtt_outage`), a reminder every 5 min while it
  lasts, and one INFO line when connected again (with the outage's length, attempts
  and dropped publishes); never one line per attempt or per dropped publish.
- TLS and credentials (`gossip.mqtt_connect`): resolved when the transport is built
  (a bad password file, key or CA raises `ConfigError` there, never in the loop). A
  broker refusing our credentials, a failed TLS handshake or any other failed attempt
  is an outage like a broker restart: retried forever with the same backoff, counted
  by cause (`stats()["connect_failures_by_cause"]`, e.g. `auth_refused`,
  `tls_failed`), logged once per cause per outage in a sentence naming what to check.
  Only at start, where nothing is lost by stopping, do such refusals
  (`MISCONFIGURED_CAUSES`) raise `ConfigError` instead; a broker that is merely not up
  yet is waited for `_START_WAIT_S`, then retried in the background while the node
  trains alone (as a libp2p node whose bootstrap peer is down).
- Payloads larger than `max_message_bytes` raise `ValueError` (the gossip layer chunks).
- `start` raises `swarm.internals.LibraryInternalsChanged` when an aiomqtt or paho
  internal that `gossip.mqtt_connect` reaches into moved (`gossip.mqtt_selfcheck`: it
  names the library, its version and the pin).
- After `stop`, `receive` raises `ConnectionError` (it never hangs on a dead transport).

Memory bound. What peers can make this transport hold is at most
  inbox:        max(max_queued_bytes, one message) + 512 B x queued messages
  one packet:   being read by paho, max_message_bytes + `_PACKET_MARGIN_BYTES`
(defaults: ~65 MiB); our own publishes awaiting a PUBACK hold at most
`max_inflight_publishes` x `max_message_bytes` (defaults: 16 MiB); all on top of the
gossip layer's own bounds and allocator slack; `tests/gossip/test_flood_rss.py`
measures it. The broker holds the rest for us
(mosquitto: its `max_queued_messages` per client).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import secrets
from collections import Counter
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gossip.inbox import Inbox
from gossip.mqtt_connect import (
    CONNECT_FAILURE_CAUSES,
    MISCONFIGURED_CAUSES,
    BrokerClient,
    broker_credentials,
    describe_failure,
    inbox_queue_type,
    subscribe_options,
    wait_disconnected,
    warn_if_password_in_clear,
)
from gossip.mqtt_outage import Outage
from gossip.mqtt_selfcheck import check_mqtt_internals
from swarm.config.network import MqttTransportConfig
from swarm.errors import ConfigError
from swarm.identity import Identity
from swarm.transport import TransportMessage

__all__ = ["MqttTransport"]

log = logging.getLogger(__name__)

_BACKOFF_INITIAL_S = 0.2
_BACKOFF_MAX_S = 10.0
_CONNECT_TIMEOUT_S = 10.0
_START_WAIT_S = 3.0
"""How long `start` waits for a first connection, so that the first round can share: a
broker on this machine or across the internet answers within a second; one that is down
costs the node no more than this before it trains alone (and a slow one still connects
in the background)."""
_PUBLISH_TIMEOUT_S = 10.0
"""Longest wait for the broker's PUBACK before a publish is dropped (`publish_failed`)."""
_STOP_GRACE_S = 2.0
"""On `stop`, the longest wait for PUBACKs still due (a node's last round's rollouts)."""
_NETWORK_ERRORS = (aiomqtt.MqttError, OSError, TimeoutError)
OUTGOING_REASONS = ("disconnected", "connection_lost", "publish_failed")
"""Why a publish was dropped (`stats()["dropped_outgoing_by_reason"]`)."""
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
        publish_timeout_s: float = _PUBLISH_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.identity = identity
        self.peer_id = identity.peer_id
        self.client_id = f"swarm-{identity.peer_id}-{secrets.token_hex(4)}"
        self._publish_timeout_s = publish_timeout_s
        self._credentials = broker_credentials(config)  # ConfigError: field and fix
        self._topics: list[str] = []
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._connection_lost: asyncio.Future[None] | None = None
        """Resolved when the current broker connection ends (publishes race it)."""
        self._failure: BaseException | None = None
        self.dropped_outgoing: Counter[str] = Counter(dict.fromkeys(OUTGOING_REASONS, 0))
        self._inbox: Inbox[TransportMessage] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._first_connect: asyncio.Future[None] | None = None
        self._client_queue_type = inbox_queue_type(self._offer)
        self._window: asyncio.Semaphore | None = None
        """One slot per publish awaiting its PUBACK (made by `start`, in its loop)."""
        self._inflight: set[asyncio.Future[None]] = set()
        self.published = 0
        self.reconnects = 0
        self.connect_failures: Counter[str] = Counter(dict.fromkeys(CONNECT_FAILURE_CAUSES, 0))
        self._last_failure = ""
        self._last_cause = ""

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

    async def start(
        self,
        *,
        wait_connected_s: float | None = _START_WAIT_S,
        require_connection: bool = False,
    ) -> None:
        """Start the connection loop; wait up to `wait_connected_s` (None: not at all) for
        the broker, so that a node's first round can already share.

        A broker that is not up yet, or unreachable, is not fatal: a WARNING says so and
        the loop keeps retrying in the background while the node trains alone. A broker
        that answered and refused us for our configuration (credentials, TLS, a plain
        port for TLS: `MISCONFIGURED_CAUSES`) raises `ConfigError` naming what to check;
        so does any failure with `require_connection` (`ConnectionError` then).
        """
        if self._task is not None:
            raise RuntimeError("transport already started")
        check_mqtt_internals()  # LibraryInternalsChanged: aiomqtt's or paho's, version, pin
        warn_if_password_in_clear(self.config, self._credentials)
        self._stopping = False
        self._last_failure = ""
        self._last_cause = ""
        self._inbox = Inbox(
            max_messages=self.config.max_queued_messages,
            max_bytes=self.config.max_queued_bytes,
            name="MQTT receive",
        )
        self._inbox.bind(asyncio.get_running_loop())
        self._window = asyncio.Semaphore(self.config.max_inflight_publishes)
        self._inflight = set()
        self._first_connect = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"mqtt-{self.peer_id[-8:]}")
        if wait_connected_s is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._first_connect), wait_connected_s)
        except TimeoutError:
            broker = f"the MQTT broker at {self.config.host}:{self.config.port}"
            last = f" (last failure: {self._last_failure})" if self._last_failure else ""
            if self._last_cause in MISCONFIGURED_CAUSES:
                await self.stop()
                raise ConfigError(
                    f"transport: {broker} refused us: {self._last_failure}"
                ) from None
            if require_connection:
                await self.stop()
                raise ConnectionError(
                    f"no connection to {broker} within {wait_connected_s:g} s{last}"
                ) from None
            log.warning(
                "no connection to %s within %g s%s; training alone meanwhile, and "
                "sharing from the first round after it answers (retrying with backoff "
                "up to %.0f s)",
                broker, wait_connected_s, last, _BACKOFF_MAX_S,
            )  # fmt: skip

    async def stop(self) -> None:
        self._stopping = True
        if self._inflight:
            # The PUBACKs still due: a stopping node's last publishes should arrive.
            await asyncio.wait(set(self._inflight), timeout=_STOP_GRACE_S)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # a crash was logged (and recorded) by the loop itself
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
                await client.subscribe(topic, options=subscribe_options(_QOS))
            except _NETWORK_ERRORS as exc:
                # The reconnect loop re-subscribes every topic in self._topics.
                log.info("subscribe to %s deferred to the next connection: %s", topic, exc)

    async def publish(self, topic: str, data: bytes) -> None:
        if len(data) > self.max_message_bytes:
            raise ValueError(
                f"message of {len(data)} bytes exceeds max_message_bytes "
                f"{self.max_message_bytes}; the gossip layer must chunk it"
            )
        window = self._window
        if self._task is None or self._failure is not None or window is None:
            raise ConnectionError(
                f"MQTT transport not running (failure: {self._failure!r})"
                if self._failure is not None
                else "MQTT transport not started, or stopped"
            )
        await window.acquire()
        # Checked after the wait for a slot: the connection may have gone meanwhile.
        client, lost = self._client, self._connection_lost
        if client is None or lost is None or lost.done() or not self._connected.is_set():
            window.release()
            self.dropped_outgoing["disconnected"] += 1
            return
        publishing = asyncio.ensure_future(
            client.publish(topic, bytes(data), qos=_QOS, timeout=self._publish_timeout_s)
        )
        self._inflight.add(publishing)
        publishing.add_done_callback(functools.partial(self._acknowledged, window, lost))
        # Let it hand the packet to paho now (tasks start in the order they were made,
        # so publishes reach the connection in call order either way).
        await asyncio.sleep(0)

    def _acknowledged(
        self,
        window: asyncio.Semaphore,
        lost: asyncio.Future[None],
        publishing: asyncio.Future[None],
    ) -> None:
        """A publish's PUBACK came, or it was dropped: free its slot, count the outcome."""
        self._inflight.discard(publishing)
        window.release()
        if publishing.cancelled():
            # Cancelled when its connection ended (the connection loop's `finally`).
            self.dropped_outgoing["connection_lost"] += 1
            return
        exc = publishing.exception()
        if exc is None:
            self.published += 1
        elif isinstance(exc, _NETWORK_ERRORS):
            # A PUBACK that never came (timeout) or a connection that dropped under it.
            reason = "connection_lost" if lost.done() else "publish_failed"
            self.dropped_outgoing[reason] += 1
            log.debug("MQTT publish dropped (%s): %s", reason, exc)
        else:
            # Not the network: our bug. Later publishes raise ConnectionError naming it.
            self._failure = exc
            log.error("MQTT publish failed", exc_info=exc)

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

    def peer_network(self, peer: str) -> str | None:
        """Always None: peers reach us only through the broker, whose address is not theirs."""
        return None

    # ---- extras ---------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout_s)

    def stats(self) -> dict[str, Any]:
        """Counters for the node's metrics line.

        `dropped_outgoing_by_reason`: publishes not delivered to the broker
        (`disconnected`, `connection_lost`, `publish_failed`); `reconnects`: connection
        attempts after the first (failed ones included); `connect_failures_by_cause`:
        failed attempts and lost connections by cause; `connected`: now.
        """
        inbox = self._inbox
        return {
            "published": self.published,
            "received": self.received,
            "dropped_incoming": self.dropped_incoming,
            "dropped_incoming_by_reason": dict(inbox.dropped) if inbox is not None else {},
            "dropped_outgoing": sum(self.dropped_outgoing.values()),
            "dropped_outgoing_by_reason": dict(self.dropped_outgoing),
            "queued_bytes": inbox.queued_bytes if inbox is not None else 0,
            "peak_queued_bytes": inbox.peak_bytes if inbox is not None else 0,
            "reconnects": self.reconnects,
            "connect_failures_by_cause": dict(self.connect_failures),
            "connected": self.connected,
        }

    # ---- connection loop --------------------------------------------------------------

    async def _run(self) -> None:
        """Connect, subscribe, wait for the connection to drop; again, forever.

        Network errors are retried with backoff (see the module docstring); any other
        exception is our bug: it is recorded, the inbox is closed (so `receive` raises
        and the node stops with the error) and the task ends with it.
        """
        try:
            await self._connection_loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failure = exc
            log.error("MQTT connection loop crashed", exc_info=exc)
            if self._inbox is not None:
                self._inbox.close()
            raise

    async def _connection_loop(self) -> None:
        delay = _BACKOFF_INITIAL_S
        outage = Outage(f"{self.config.host}:{self.config.port}", _BACKOFF_MAX_S)
        credentials = self._credentials
        while not self._stopping:
            accepted = False
            try:
                async with BrokerClient(
                    self.config.host,
                    self.config.port,
                    identifier=self.client_id,
                    username=credentials.username,
                    password=credentials.password,
                    tls_context=credentials.tls_context,
                    protocol=aiomqtt.ProtocolVersion.V5,
                    queue_type=self._client_queue_type,
                    properties=self._connect_properties(),
                    max_inflight_messages=self.config.max_inflight_publishes,
                    timeout=_CONNECT_TIMEOUT_S,
                    keepalive=30,
                ) as client:
                    accepted = True
                    # aiomqtt warns above this many publishes awaiting a PUBACK; ours
                    # are bounded by the window, by design.
                    client.pending_calls_threshold = self.config.max_inflight_publishes
                    done: set[str] = set()
                    while pending := [t for t in self._topics if t not in done]:
                        for topic in pending:
                            await client.subscribe(topic, options=subscribe_options(_QOS))
                            done.add(topic)
                    # No await since the last check: a concurrent subscribe() either
                    # was seen above or finds the client connected and subscribes itself.
                    self._client = client
                    self._connection_lost = asyncio.get_running_loop().create_future()
                    self._connected.set()
                    if self._first_connect is not None and not self._first_connect.done():
                        self._first_connect.set_result(None)
                    delay = _BACKOFF_INITIAL_S
                    outage.ended(self._dropped_total(), len(done))
                    await wait_disconnected(client)
            except _NETWORK_ERRORS as exc:
                if self._stopping:
                    break
                cause, self._last_failure = describe_failure(
                    exc, connected=accepted, tls=credentials.tls_context is not None
                )
                self._last_cause = cause
                self.connect_failures[cause] += 1
                outage.failed(self._last_failure, delay, self._dropped_total())
            finally:
                self._connected.clear()
                self._client = None
                lost = self._connection_lost
                if lost is not None and not lost.done():
                    lost.set_result(None)
                for publishing in list(self._inflight):
                    publishing.cancel()  # no PUBACK comes over a closed connection
            if self._stopping:
                break
            self.reconnects += 1
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2.0, _BACKOFF_MAX_S)

    def _dropped_total(self) -> int:
        return sum(self.dropped_outgoing.values())

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
