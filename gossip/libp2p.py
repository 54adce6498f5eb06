"""GossipSub over py-libp2p (0.8.1) as a `swarm.transport.Transport` for an asyncio node.

py-libp2p is trio-based. This transport runs `trio.run` in one daemon thread per
transport and bridges the two event loops:

- asyncio -> trio: `asyncio.to_thread(trio.from_thread.run, fn, ..., trio_token=token)`;
- trio -> asyncio: pubsub hands each received message to a `gossip.inbox.Inbox`
  (thread-safe), which wakes the asyncio reader with `loop.call_soon_threadsafe`.

Invariants:
- Security is Noise only (no plaintext, secio or TLS offered); pubsub runs with
  `strict_signing=True`, so every delivered message carries a signature by its origin
  and `TransportMessage.via` is that libp2p-authenticated origin peer id (base58, the
  same format as `swarm.identity.Identity.peer_id`).
- The libp2p host key is the node's `Identity` (same Ed25519 seed, same peer id); the host
  and its GossipSub routers are built by `gossip.libp2p_host`.
- The pubsub and gossipsub services start before `host.run` (the other order crashes
  on the first dial).
- Nothing is dropped silently by library defaults: the spam-protection rate limit is
  raised (and never applies to our own publishes), each peer's outbound RPC queue is
  bounded by `_MAX_QUEUED_RPCS` RPCs and max(`_MIN_OUTBOUND_BYTES`, 8 messages) bytes
  instead of 32 RPCs, the outbound RPC size limit and `max_inbound_rpc_size` follow
  `config.max_message_bytes`, and received messages go straight from pubsub into our
  own queue (the library's 32-message subscription channel is bypassed).
- `publish` never waits on a peer and never raises for a network cause: a peer whose
  outbound queue lacks room (it reads slower than we send, or stopped reading) is
  skipped for that message and counted (`stats()["skipped_slow_peer"]`, one per message
  and peer; the first skip of a peer is logged, repeats only every 10 min); the other
  peers get the message at once. A dead connection is the library's to drop. `publish`
  raises `ValueError` for a payload over `max_message_bytes` (the caller's bug: gossip
  chunks) and `ConnectionError` only after `stop` or a crash of the transport itself.
- What the transport refuses from peers is counted by reason in
  `stats()["refused_incoming_by_reason"]` (see `gossip.libp2p_refusals`): `oversize_rpc`
  (an RPC over `max_inbound_rpc_size`: read and discarded, the stream and the peer's
  later messages survive), `unsigned` and `bad_signature` (GossipSub messages failing
  strict signing), `equivocation`, `not_forwarded` (refused by the gossip layer's
  checks before forwarding: `set_forward_gate`) and `ignored_forwarder` (handed over by
  a peer the layer ignores).
- Memory stays bounded: equivocation detection keeps a fixed number of 16-byte
  digests (the library keeps whole messages), and the adaptive-gossip bookkeeping
  lists are pruned every heartbeat.
- Received messages wait in an `Inbox` bounded by `receive_queue_size` messages (1024)
  and `config.max_queued_bytes` bytes, filled in the trio thread (so messages on their
  way to the asyncio loop count too) and never blocking it: a message that does not fit
  is dropped at once and counted by reason (`stats()["dropped_incoming_by_reason"]`,
  total in `dropped_incoming`). The origin (`from`, authenticated by strict signing) is
  known there, so the inbox is fair between origins: once the queue is full no origin
  keeps more than a quarter of the bytes, and a flooder's newest messages are the ones
  dropped (see `gossip.inbox`).
- GossipSub's message cache (kept for `gossip_history` heartbeats to answer IWANT) is
  bounded by `config.max_queued_bytes` too; the oldest messages leave it first.
- Adaptive gossip is off: degree and heartbeat are exactly those of the config (the
  library's adaptation would stretch a 1 s heartbeat to 30-60 s on a "poor health"
  score, which a 3-node test swarm always has).
- A node's own publishes are not delivered back to it.
- `start` raises `swarm.internals.LibraryInternalsChanged` if an internal of py-libp2p
  patched here moved (`gossip.libp2p_selfcheck`, naming the version and the pin), before
  anything is patched or listens.
- `start` raises if the listen address cannot be bound (the library only logs it), and
  `ConfigError` if another process already listens there (`gossip.libp2p_listen`: the
  library's SO_REUSEPORT would otherwise let two nodes share one port).
  After `stop` (or a crash of the trio thread), `receive` raises `ConnectionError`.
  `stop` closes every connection (within `_CLOSE_TIMEOUT_S`): peers see us leave at
  once, even while this process lives on.
- Re-dials are ours alone and bounded (the library's auto-connector, which re-dials
  every peer it ever saw forever with an ERROR line per attempt, is off): see
  `gossip.libp2p_dialer` for the policy. Counted in `stats()`: `dials_failed`,
  `peers_given_up`. A failed dial never crashes the transport.
- Discovery beyond `bootstrap` (peer exchange over `/swarm/peers/1`, the peer book at
  `peer_book_path`, connection targets and the `max_peers` cap) is
  `gossip.peer_exchange`'s; counted in `stats()["discovery"]`.

- NAT traversal (AutoNAT, circuit relay v2, DCUtR; `config.nat_traversal`): `gossip.nat`.
- Inbound connections take a slot from accept until they close, bounded in all
  (`max_peers`), per address (`max_inbound_per_ip`) and per subnet
  (`max_inbound_per_subnet`), loopback exempt from the last two
  (`gossip.libp2p_inbound`; the library kept each slot until the swarm stopped, so a
  node refused every inbound connection after its 64th). Counted in
  `stats()["inbound"]`; `stats()["connections_open"]` is what is open now.

Memory bound. What peers can make this transport hold is at most
  inbox:          max(max_queued_bytes, one message) + 512 B x queued messages
  message cache:  max_queued_bytes
  in flight:      RPCs being read or validated, each at most max_message_bytes + 64 KiB
                  (one RPC per stream is read at a time; its messages are queued or
                  dropped without waiting for the node)
  outbound:       per connected peer, max(64 MiB, 8 x max_message_bytes) and 4096 RPCs
                  (only towards peers that read slower than we send to them).
With the defaults (64 MiB, 1 MiB messages) a flood of any size from peers that read
what we send them costs at most ~130 MiB here, on top of the gossip layer's own bounds
(`GossipConfig.max_reassembly_bytes`) and allocator slack; `tests/gossip/test_flood_rss.py`
measures it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service

from gossip.inbox import Inbox
from gossip.libp2p_connections import (
    connected_peer_ids,
    connections_open,
    peer_links,
    peer_network,
)
from gossip.libp2p_dialer import Redialer
from gossip.libp2p_host import new_routers, new_swarm_host
from gossip.libp2p_inbound import InboundHandler
from gossip.libp2p_listen import announced_addrs, refuse_unusable_listen
from gossip.libp2p_patches import SwarmGossipSub, SwarmPubsub
from gossip.libp2p_queues import outbound_totals, refused_rpcs
from gossip.libp2p_refusals import Refusals
from gossip.nat import NatTraversal
from gossip.peer_exchange import PeerExchange
from swarm.config.network import Libp2pTransportConfig
from swarm.identity import Identity
from swarm.transport import ForwardGate, TransportMessage

__all__ = ["RPC_OVERHEAD_BYTES", "Libp2pTransport"]

log = logging.getLogger(__name__)

RPC_OVERHEAD_BYTES = 8 * 1024
"""Room kept inside `config.max_message_bytes` for the RPC framing around a payload
(protobuf fields, topic, from, seqno, 64-byte signature, public key, sender record)."""
_MIN_OUTBOUND_BYTES = 64 * (1 << 20)
_CLOSE_TIMEOUT_S = 5.0


def _unwrap(exc: BaseException) -> BaseException:
    """The one exception inside nested trio exception groups, else the group itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


T = TypeVar("T")


class Libp2pTransport:
    """GossipSub (meshsub 1.2, 1.1, 1.0 offered, newest first); see the module docstring."""

    def __init__(
        self,
        config: Libp2pTransportConfig,
        identity: Identity,
        *,
        receive_queue_size: int = 1024,
        peer_book_path: Path | None = None,
    ) -> None:
        if config.max_message_bytes <= RPC_OVERHEAD_BYTES:
            raise ValueError("max_message_bytes leaves no room for a payload")
        self.config = config
        self.identity = identity
        self.peer_id = identity.peer_id
        self._receive_queue_size = receive_queue_size
        self._max_rpc_bytes = config.max_message_bytes
        self._max_outbound_bytes = max(_MIN_OUTBOUND_BYTES, 8 * config.max_message_bytes)

        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: Inbox[TransportMessage] | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop_event: trio.Event | None = None
        self._host: IHost | None = None
        self._pubsub: SwarmPubsub | None = None
        self._gossipsub: SwarmGossipSub | None = None
        self._inbound: InboundHandler | None = None
        self._listen_addrs: list[str] = []
        self._closing = False
        self._stopped = False
        self._failure: BaseException | None = None
        self.refusals = Refusals()
        self._forward_gate: ForwardGate | None = None
        self.published = 0
        bootstrap = [info_from_p2p_addr(multiaddr.Multiaddr(a)) for a in config.bootstrap]
        self._redialer = Redialer(bootstrap, mdns=config.mdns)
        self._nat = (
            NatTraversal(relay=config.relay, member=self._is_swarm_peer)
            if config.nat_traversal
            else None
        )
        self._exchange = PeerExchange(
            config,
            self._redialer,
            book_path=peer_book_path,
            bootstrap=[b.peer_id for b in bootstrap],
        )

    # ---- Transport protocol -------------------------------------------------------

    @property
    def max_message_bytes(self) -> int:
        return self.config.max_message_bytes - RPC_OVERHEAD_BYTES

    @property
    def received(self) -> int:
        """Messages queued for `receive` (those later evicted from the queue included)."""
        return self._inbox.admitted if self._inbox is not None else 0

    @property
    def dropped_incoming(self) -> int:
        """Messages dropped because the node did not read its queue fast enough."""
        return self._inbox.dropped_total if self._inbox is not None else 0

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("transport already started")
        refuse_unusable_listen(self.config.listen)
        self._loop = asyncio.get_running_loop()
        self._inbox = Inbox(
            max_messages=self._receive_queue_size,
            max_bytes=self.config.max_queued_bytes,
            name="libp2p receive",
        )
        self._inbox.bind(self._loop)
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._thread_main,
            args=(started,),
            name=f"libp2p-{self.peer_id[-8:]}",
            daemon=True,
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(started)
        except BaseException:
            await self.stop()
            raise
        log.info("libp2p transport listening on %s", ", ".join(self._listen_addrs))

    async def stop(self) -> None:
        if self._thread is None or self._stopped:
            return
        self._closing = True
        self._stopped = True
        token, stop_event = self._token, self._stop_event
        if token is not None and stop_event is not None and self._thread.is_alive():
            try:
                await asyncio.to_thread(trio.from_thread.run_sync, stop_event.set, trio_token=token)
            except trio.RunFinishedError:
                log.debug("libp2p trio loop had already ended")
        await asyncio.to_thread(self._thread.join, 15.0)
        if self._thread.is_alive():
            log.warning("libp2p thread did not stop within 15 s; leaving it (daemon)")

    def _is_swarm_peer(self, peer: ID) -> bool:
        """Subscribed to one of our topics (trio thread): who may use our relay."""
        pubsub = self._pubsub
        if pubsub is None:
            return False
        ours = set(pubsub.subscribed_topics_receive)
        return any(peer in pubsub.peer_topics.get(topic, ()) for topic in ours)

    def set_forward_gate(self, gate: ForwardGate) -> None:
        """Forward (and deliver) only what `gate` passes (`swarm.transport.ForwardGate`);
        before `start`."""
        if self._thread is not None:
            raise RuntimeError("set the forward gate before start")
        self._forward_gate = gate

    async def subscribe(self, topic: str) -> None:
        await self._call(self._trio_subscribe, topic)

    async def publish(self, topic: str, data: bytes) -> None:
        if len(data) > self.max_message_bytes:
            raise ValueError(
                f"message of {len(data)} bytes exceeds max_message_bytes "
                f"{self.max_message_bytes}; the gossip layer must chunk it"
            )
        await self._call(self._trio_publish, topic, bytes(data))
        self.published += 1  # sent to every peer that had room (skips are counted)

    async def receive(self) -> TransportMessage:
        if self._inbox is None:
            raise RuntimeError("transport not started")
        try:
            return await self._inbox.get()
        except ConnectionError:
            raise ConnectionError(f"libp2p transport stopped: {self._failure!r}") from None

    def _live_host(self) -> IHost | None:
        return None if self._stopped else self._host

    def connected_peers(self) -> list[str]:
        host = self._live_host()
        return [] if host is None else connected_peer_ids(host)

    def peer_network(self, peer: str) -> str | None:
        """The network (`gossip.libp2p_inbound.network_key`) of a direct connection to
        `peer`, or None (not connected, or only through a relay)."""
        host = self._live_host()
        return None if host is None else peer_network(host, peer)

    def peer_links(self) -> dict[str, str]:
        """Connected peers: `direct`, or `relayed` when every connection is `/p2p-circuit`."""
        host = self._live_host()
        return {} if host is None else peer_links(host)

    # ---- extras for tests, the CLI and metrics --------------------------------------

    def listen_addrs(self) -> list[str]:
        """Full multiaddrs (with /p2p/<peer id> and the real port) others can dial."""
        return list(self._listen_addrs)

    async def topic_peers(self, topic: str) -> list[str]:
        """Peers known to be subscribed to `topic` (pubsub's view)."""

        async def read() -> list[str]:
            assert self._pubsub is not None
            return [p.to_base58() for p in self._pubsub.peer_topics.get(topic, ())]

        return await self._call(read)

    async def mesh_peers(self, topic: str) -> list[str]:
        """Peers in our GossipSub mesh for `topic` (receive full messages from us)."""

        async def read() -> list[str]:
            assert self._gossipsub is not None
            return [p.to_base58() for p in self._gossipsub.mesh.get(topic, ())]

        return await self._call(read)

    def stats(self) -> dict[str, Any]:
        """Counters for the node's metrics line (safe to call from the asyncio thread).

        `skipped_slow_peer`: (own message, peer) pairs not sent because the peer's
        outbound queue was full; `outbound_refused`: every RPC an outbound queue refused
        (own, relayed and control); `refused_incoming_by_reason`: what peers sent that
        was refused (`oversize_rpc`, `unsigned`, `bad_signature`, `equivocation`);
        `dials_failed`, `peers_given_up`: re-dial outcomes; `meshsub_peers`: peers by the
        GossipSub version negotiated with them; `connections_open`: connections open now
        (both directions); `inbound`: inbound slots (`slots_used` now, `accepted` and
        `refused_by_reason` at accept, `failed` upgrades; `gossip.libp2p_inbound`).
        """
        pubsub = self._pubsub
        refused, outbound_bytes = outbound_totals(pubsub.peer_queues) if pubsub else (0, 0)
        host = self._live_host()
        inbox = self._inbox
        gossipsub = self._gossipsub
        meshsub = tuple(gossipsub.peer_protocol.values()) if gossipsub is not None else ()
        return {
            "published": self.published,
            "received": self.received,
            "dropped_incoming": self.dropped_incoming,
            "dropped_incoming_by_reason": dict(inbox.dropped) if inbox is not None else {},
            "refused_incoming_by_reason": self.refusals.incoming(),
            "skipped_slow_peer": self.refusals.counts["skipped_slow_peer"],
            "queued_bytes": inbox.queued_bytes if inbox is not None else 0,
            "peak_queued_bytes": inbox.peak_bytes if inbox is not None else 0,
            "outbound_refused": refused,
            "outbound_queued_bytes": outbound_bytes,
            "message_cache_bytes": gossipsub.mcache_bytes if gossipsub is not None else 0,
            "meshsub_peers": dict(Counter(str(p) for p in meshsub)),
            "dials_attempted": self._redialer.dials_attempted,
            "dials_failed": self._redialer.dials_failed,
            "peers_given_up": self._redialer.peers_given_up,
            "discovery": self._exchange.stats(),
            "connections_open": 0 if host is None else connections_open(host),
            "inbound": self._inbound.stats() if self._inbound is not None else {},
            **(self._nat.stats() if self._nat is not None else {}),
        }

    # ---- asyncio <-> trio bridge ----------------------------------------------------

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `fn(*args)` in the trio thread and return its result here.

        (Scheduling with `token.run_sync_soon` and answering with
        `call_soon_threadsafe` avoids the worker thread, but measured 2-3x slower per
        publish here: the GIL hand-offs cost more than the thread hop.)
        """
        token = self._token
        if token is None or self._stopped:
            raise ConnectionError("libp2p transport is not running")
        try:
            return await asyncio.to_thread(trio.from_thread.run, fn, *args, trio_token=token)
        except trio.RunFinishedError:
            raise ConnectionError(f"libp2p transport stopped: {self._failure!r}") from None

    def _thread_main(self, started: concurrent.futures.Future[None]) -> None:
        try:
            trio.run(self._trio_main, started)
        except BaseException as exc:  # the thread's top level: report, never swallow
            exc = _unwrap(exc)
            self._failure = exc
            if not started.done():
                started.set_exception(exc)
            elif not self._closing:
                log.error("libp2p transport crashed", exc_info=exc)
        finally:
            if not started.done():
                started.set_exception(RuntimeError("libp2p transport exited during start"))
            self._signal_closed()

    def _signal_closed(self) -> None:
        if self._inbox is not None:
            self._inbox.close()  # receive() drains what is queued, then raises

    def _on_message(self, topic: str, data: bytes, from_id: bytes) -> None:
        """Runs in the trio thread for every message accepted by pubsub; never blocks."""
        inbox = self._inbox
        if inbox is None or self._closing:
            return
        via = ID(from_id).to_base58()
        if self._nat is not None:
            self._nat.note_origin(via)
        # With a forward gate, pubsub delivers only what its check passed, signature
        # included (`gossip.libp2p_forward_gate`).
        checked = self._forward_gate is not None
        message = TransportMessage(topic=topic, data=data, via=via, signature_checked=checked)
        inbox.offer(message, len(data), via)

    # ---- trio side ------------------------------------------------------------------

    async def _trio_main(self, started: concurrent.futures.Future[None]) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        listen = multiaddr.Multiaddr(self.config.listen)
        # Internals checked, then patched, before host.run (gossip.libp2p_host).
        host, self._inbound = new_swarm_host(self.config, self.identity, listen)
        self._exchange.install(host)
        pubsub, gossipsub = new_routers(
            host,
            self.config,
            refusals=self.refusals,
            sink=self._on_message,
            max_rpc_bytes=self._max_rpc_bytes,
            max_outbound_bytes=self._max_outbound_bytes,
        )
        self._host, self._pubsub, self._gossipsub = host, pubsub, gossipsub
        pubsub.forward_gate = self._forward_gate
        if self._forward_gate is not None:
            gossipsub.forward_gate_blame = self._forward_gate.blame
        self._exchange.router = gossipsub  # for its mesh sizes in stats()
        # Order matters: services first, then host.run (see the module docstring).
        async with background_trio_service(pubsub), background_trio_service(gossipsub):
            await pubsub.wait_until_ready()
            async with host.run(listen_addrs=[listen]):
                self._listen_addrs = announced_addrs(host, self.peer_id)
                if not self._listen_addrs:
                    # py-libp2p only logs a failed listen (e.g. port in use) and runs on.
                    raise OSError(f"could not listen on {self.config.listen} (port in use?)")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._redialer.run, host)
                    if self._nat is not None:
                        nursery.start_soon(self._nat.run, host)
                    nursery.start_soon(self._exchange.run, host)
                    started.set_result(None)
                    await self._stop_event.wait()
                    self._closing = True
                    nursery.cancel_scope.cancel()
                # Close every connection (peers see us leave at once), bounded in time;
                # leaving `host.run` alone leaves the sockets open while this process
                # lives, so peers kept us connected and queued messages for us.
                with trio.move_on_after(_CLOSE_TIMEOUT_S):
                    await host.get_network().close()

    async def _trio_subscribe(self, topic: str) -> None:
        assert self._pubsub is not None
        await self._pubsub.subscribe(topic)

    async def _trio_publish(self, topic: str, data: bytes) -> None:
        """Publish without waiting on any peer: a peer whose outbound queue lacks room
        for our message is skipped and counted (`skipped_slow_peer`)."""
        pubsub = self._pubsub
        assert pubsub is not None
        skipped: list[str] = []
        token = refused_rpcs.set(skipped)
        try:
            await pubsub.publish(topic, data)
        finally:
            refused_rpcs.reset(token)
        for peer in dict.fromkeys(skipped):
            self.refusals.add(
                "skipped_slow_peer",
                peer,
                f"outbound queue full; a message of {len(data)} bytes on {topic} not sent "
                "to this peer (the others got it)",
            )
