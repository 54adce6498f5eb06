"""py-libp2p 0.8.1 defaults that drop, hoard, stall or log noisily, replaced (see
the project's shared notes, `libp2p-and-mqtt.md`).

Invariants: every class here subclasses or replaces a library internal that is pinned to
libp2p==0.8.1; each one is listed in `gossip.libp2p_selfcheck`, which the transport runs
before building these (a moved internal stops the start, naming the installed version and
the pin), and the instances the library's constructors build are checked here
(`check_instance`); nothing here owns a socket or a thread; the transport in
`gossip.libp2p` composes these pieces.

What the library does and what replaces it:
- Outbound queues, bounded by RPC count and bytes, a slow peer skipped by our publish:
  `gossip.libp2p_queues` (installed by `SwarmPubsub`).
- Oversize inbound RPCs, read and discarded with the stream kept instead of a reset that
  loses the peer's subscriptions: `gossip.libp2p_oversize` (wrapped around each stream
  by `SwarmPubsub`), counted as `oversize_rpc` either way.
- Torn outbound RPCs: yamux sends a frame over the peer's window in pieces, releasing
  its lock between them, and the library's several writers to one pubsub stream (the
  queue's sender, GossipSub's flushes and IWANT replies) could interleave their frames.
  `SwarmPubsub.write_msg` writes one RPC at a time per stream.
- Malformed inbound RPCs: a frame that does not parse as a pubsub RPC raised
  `DecodeError` out of the library's read loop and ended the whole host (seen in a test
  suite under load). `SwarmPubsub` counts it (`malformed_rpc`) and reads on at the next
  frame; the `MAX_MALFORMED_RPCS`-th on one stream resets it, as the library resets one
  after an oversize frame.
- Signature refusals: `Pubsub.push_msg` drops an unsigned or badly signed message at
  DEBUG level; `SwarmPubsub.push_msg` counts it (`unsigned`, `bad_signature`) without
  verifying any signature a second time on the accepted path.
- Validation before forwarding: the library forwards every message that is new and
  validly signed. With a `ForwardGate` set (`SwarmPubsub.forward_gate`, the gossip
  layer's envelope checks), a message new to us is first shown to it
  (`gossip.libp2p_forward_gate`).
- Equivocation (same origin and seqno, different content): counted (`equivocation`).
- The per-forwarder rate limit ("spam protection"): the library keeps a list of
  timestamps per peer and topic and rebuilds it on every message. `SwarmGossipSub` keeps
  a token bucket instead (`FORWARDER_RATE_PER_S`, `FORWARDER_BURST`); a refusal is
  counted (`forwarder_rate_limited`) and blamed on the forwarder (`rate_limited`).
- Seqnos: the library numbers a host's messages on from the wall clock in *seconds*, one
  per message, and peers drop as already seen, silently, any (origin, seqno) seen in the
  last 120 s (and our equivocation check refuses one seen with other content). A node
  that published more messages than seconds passed and restarted re-used its recent
  seqnos, and its next messages were lost. `SwarmPubsub` counts on from the wall clock in
  nanoseconds, as go-libp2p does: a restart's seqnos are always fresh (also with the
  clock stepped back, which starts them far below the previous run's).
- Re-dials (the swarm's `AutoConnector`, an ERROR line per failed attempt):
  `gossip.libp2p_dialer`.
- Sender records (the signed peer record on every pubsub RPC): `gossip.libp2p_records`.
- Mesh pruning: above `degree_high` the library prunes random mesh peers;
  `SwarmGossipSub` prunes by delivery instead (`gossip.libp2p_mesh`).
Every refusal is counted in one `Refusals` (`gossip.libp2p_refusals`, read by
`Libp2pTransport.stats()`), and logged once per (reason, peer) per 10 minutes, never once
per message.
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio
from google.protobuf.message import DecodeError
from libp2p.abc import IHost, INetStream
from libp2p.io.exceptions import IOException
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.mcache import MessageCache, default_msg_id_fn
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import signature_validator

from gossip.libp2p_forward_gate import refused_by_gate
from gossip.libp2p_mesh import DeliveryRankedPruning
from gossip.libp2p_oversize import OversizeRpcFilter
from gossip.libp2p_queues import PeerQueues
from gossip.libp2p_refusals import Refusals
from gossip.libp2p_selfcheck import check_instance, reaches
from swarm.bounded import BoundedDict
from swarm.transport import ForwardGate

log = logging.getLogger("gossip.libp2p")
_HERE = "gossip/libp2p_patches.py"

_EQUIVOCATION_MEMORY = 16384
_ADAPTIVE_LIST_WINDOW_S = 60.0
MAX_MALFORMED_RPCS = 16
"""Frames that do not parse as pubsub RPCs, on one stream, before it is reset."""

FORWARDER_RATE_PER_S = 2000.0
FORWARDER_BURST = 10_000.0
"""Messages a connected peer may hand us per topic: a burst of 10,000, then 2,000 a
second, whoever signed them (per-sender limits live in the gossip layer). The library's
own limit kept a list of timestamps per peer and topic, rebuilt on every message (its
cost grows with the rate allowed); this is a token bucket."""
_FORWARDER_BUCKETS = 4096


class SwarmPubsub(Pubsub):
    """Pubsub handing every received message to a callback instead of a 32-slot channel,
    discarding oversize RPCs without losing the stream, and counting its refusals."""

    def __init__(
        self,
        host: IHost,
        router: GossipSub,
        *,
        sink: Callable[[str, bytes, bytes], None],
        max_inbound_rpc_size: int,
        max_rpc_bytes: int,
        max_queued_bytes: int,
        refusals: Refusals,
    ) -> None:
        super().__init__(
            host,
            router,
            strict_signing=True,
            max_inbound_rpc_size=max_inbound_rpc_size,
        )
        self._sink = sink
        self.refusals = refusals
        self.forward_gate: ForwardGate | None = None
        """Checks a peer's message must pass before it is forwarded or delivered."""
        check_instance(
            self,
            [("counter", int), ("peer_queues", dict), ("max_inbound_rpc_size", int),
             ("subscribed_topics_receive", None), ("peer_topics", dict)],
            _HERE,
        )  # fmt: skip
        self.peer_queues = PeerQueues(max_rpc_bytes, max_queued_bytes)
        self._write_locks: weakref.WeakKeyDictionary[INetStream, trio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        """One lock per pubsub stream (`write_msg`), gone with the stream."""
        # Our messages' seqnos count on from the wall clock in nanoseconds (go-libp2p's
        # choice), not seconds: see the module docstring.
        self.counter = time.time_ns()

    async def continuously_read_stream(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        limit = self.max_inbound_rpc_size

        def on_oversize(length: int, discarded: bool) -> None:
            what = "discarded, stream kept" if discarded else "stream reset by the library"
            self.refusals.add(
                "oversize_rpc", peer, f"inbound RPC of {length} bytes over {limit} ({what})"
            )
            if self.forward_gate is not None:
                self.forward_gate.blame(peer, "oversize")

        filtered = OversizeRpcFilter(stream, limit, on_oversize)
        malformed = 0
        while True:
            try:
                await super().continuously_read_stream(filtered)  # type: ignore[arg-type]
                return
            except DecodeError as exc:
                # The library lets this out of the stream's task, which ends the whole
                # host. The frame was read whole (its length prefix held), so reading
                # goes on at the next one; past MAX_MALFORMED_RPCS on one stream (its
                # framing is lost, or the peer means it) the stream is reset as the
                # library resets one over the size limit. Not blamed: a frame torn on
                # the way may be no fault of the sender's.
                malformed += 1
                self.refusals.add(
                    "malformed_rpc", peer, f"inbound RPC is not a pubsub RPC: {exc}"
                )
                if malformed >= MAX_MALFORMED_RPCS:
                    break
        try:
            await stream.reset()
        except (StreamError, IOException, RawConnError) as reset_error:
            log.debug("resetting %s's pubsub stream: %r", peer, reset_error)
        self._handle_dead_peer(stream.muxed_conn.peer_id)

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        """The library's `write_msg`, one RPC frame at a time per stream.

        yamux writes a frame larger than the peer's window in pieces and lets go of its
        lock while it waits for the window to open: another writer's frame (the queue's
        sender, GossipSub's flush of pending messages or its replies to IWANT) then went
        out between the pieces, and the peer read a torn RPC."""
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            return await super().write_msg(stream, rpc_msg)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        """The library's `push_msg`, plus a count of signature refusals.

        A message from a peer that was unseen before and is still unseen after the
        library's checks was refused by one of them; only then is its signature checked
        here again, to name the reason. The accepted path verifies once.
        """
        if msg_forwarder == self.my_id:
            await super().push_msg(msg_forwarder, msg)
            return
        seen_before = self._is_msg_seen(msg)
        if not seen_before and self.forward_gate is not None and refused_by_gate(
            self, self.forward_gate, msg_forwarder, msg
        ):
            return
        await super().push_msg(msg_forwarder, msg)
        if seen_before or self._is_msg_seen(msg):
            return
        if not msg.signature:
            reason = "unsigned"
        else:
            try:
                valid = signature_validator(msg)
            except Exception:  # noqa: BLE001 - a hostile key or id the validator chokes on
                valid = False
            if valid:
                return  # refused for another reason (blacklist, score gate, validator)
            reason = "bad_signature"
        self.refusals.add(
            reason, msg_forwarder.to_base58(), f"GossipSub message from {ID(msg.from_id)} dropped"
        )
        if self.forward_gate is not None:
            self.forward_gate.blame(msg_forwarder.to_base58(), reason)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        if publish_message.from_id == self.my_id.to_bytes():
            return  # our own publish: the node already has it
        for topic in publish_message.topicIDs:
            if topic in self.subscribed_topics_receive:
                self._sink(topic, publish_message.data, publish_message.from_id)


class BoundedMessageCache(MessageCache):
    """GossipSub's cache of recent messages (answers to IWANT), bounded in bytes too.

    The library keeps every message for `history_size` heartbeats whatever their size:
    at 30 MB/s and a 1 s heartbeat that is ~150 MB. Here, beyond `max_bytes` (sizes as
    serialized) the oldest messages leave first; the newest one always stays.
    """

    def __init__(self, window_size: int, history_size: int, max_bytes: int) -> None:
        super().__init__(window_size, history_size)
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0
        self._sizes: dict[bytes, int] = {}

    def put(self, msg: rpc_pb2.Message) -> None:
        mid = default_msg_id_fn(msg)
        if mid in self.msgs:
            return
        super().put(msg)
        size = msg.ByteSize()
        self._sizes[mid] = size
        self.bytes += size
        while self.bytes > self.max_bytes and len(self._sizes) > 1:
            self._evict_oldest()

    def shift(self) -> None:
        for entry in self.history[-1]:
            self._forget(entry.mid)
        super().shift()

    def _forget(self, mid: bytes) -> bool:
        self.msgs.pop(mid, None)
        size = self._sizes.pop(mid, None)
        if size is None:
            return False
        self.bytes -= size
        return True

    def _evict_oldest(self) -> None:
        for bucket in reversed(self.history):
            while bucket:
                if self._forget(bucket.pop(0).mid):
                    self.evicted += 1
                    return


class SwarmGossipSub(DeliveryRankedPruning, GossipSub):
    """GossipSub with bounded equivocation memory and message cache, and a counted
    token-bucket rate limit per forwarder and topic (none on own publishes)."""

    def __init__(
        self,
        *,
        mcache_max_bytes: int = 64 << 20,
        refusals: Refusals | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.refusals = refusals if refusals is not None else Refusals()
        check_instance(
            self,
            [("mcache", MessageCache), ("scorer", None), ("pubsub", None), ("mesh", dict),
             ("peer_protocol", dict), ("recent_message_deliveries", dict),
             ("recent_peer_connections", list), ("recent_peer_disconnections", list)],
            _HERE,
        )  # fmt: skip
        if type(self.mcache) is not MessageCache:
            r = reaches()
            r.problem(f"GossipSub.mcache is a {type(self.mcache).__name__}", _HERE)
            r.raise_if_missing()
        self.mcache = BoundedMessageCache(
            self.mcache.window_size, self.mcache.history_size, mcache_max_bytes
        )
        self._digests: OrderedDict[bytes, bytes] = OrderedDict()
        self._forwarder_buckets: BoundedDict[tuple[ID, str], tuple[float, float]] = (
            BoundedDict(_FORWARDER_BUCKETS)
        )
        self.forward_gate_blame: Callable[[str, str], None] | None = None
        """Reports a refusal against the peer that handed the message over (set by the
        transport with its forward gate)."""

    @property
    def mcache_bytes(self) -> int:
        cache = self.mcache
        return cache.bytes if isinstance(cache, BoundedMessageCache) else 0

    def _check_spam_protection(self, peer_id: ID, msg: rpc_pb2.Message) -> bool:
        """`FORWARDER_RATE_PER_S` per connected peer and topic (our own publishes are not
        limited); a refusal is counted and blamed on that peer."""
        if self.pubsub is not None and peer_id == self.pubsub.my_id:
            return True
        now = time.monotonic()
        for topic in msg.topicIDs:
            key = (peer_id, topic)
            tokens, last = self._forwarder_buckets.get(key, (FORWARDER_BURST, now))
            tokens = min(FORWARDER_BURST, tokens + max(0.0, now - last) * FORWARDER_RATE_PER_S)
            if tokens < 1.0:
                self._forwarder_buckets[key] = (tokens, now)
                peer = peer_id.to_base58()
                self.refusals.add("forwarder_rate_limited", peer, f"over the rate on {topic}")
                if self.forward_gate_blame is not None:
                    self.forward_gate_blame(peer, "rate_limited")
                return False
            self._forwarder_buckets[key] = (tokens - 1.0, now)
        return True

    def _check_equivocation(self, msg: rpc_pb2.Message) -> bool:
        key = msg.from_id + msg.seqno
        h = hashlib.blake2b(msg.data, digest_size=16)
        for topic in msg.topicIDs:
            h.update(b"\x00" + topic.encode())
        digest = h.digest()
        seen = self._digests.get(key)
        if seen is None:
            self._digests[key] = digest
            while len(self._digests) > _EQUIVOCATION_MEMORY:
                self._digests.popitem(last=False)
            return True
        if seen == digest:
            return True
        origin = ID(msg.from_id)
        self.refusals.add("equivocation", origin.to_base58(), "same seqno, different content")
        if self.scorer is not None:
            self.scorer.penalize_equivocation(origin, 100.0)
        return False

    def _periodic_security_cleanup(self) -> None:
        super()._periodic_security_cleanup()
        cutoff = time.time() - _ADAPTIVE_LIST_WINDOW_S
        for topic in list(self.recent_message_deliveries):
            kept = [t for t in self.recent_message_deliveries[topic] if t > cutoff]
            if kept:
                self.recent_message_deliveries[topic] = kept
            else:
                del self.recent_message_deliveries[topic]
        self.recent_peer_connections[:] = [t for t in self.recent_peer_connections if t > cutoff]
        self.recent_peer_disconnections[:] = [
            t for t in self.recent_peer_disconnections if t > cutoff
        ]
