"""py-libp2p 0.8.1 defaults that drop or hoard messages, replaced (see notes/libp2p-and-mqtt.md).

Invariants: every class here subclasses or replaces a library internal that is pinned to
libp2p==0.8.1 (a check raises at start if the internal changed); nothing here owns a
socket or a thread; the transport in `gossip.libp2p` composes these pieces.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.pubsub import rpc_queue as _rpc_queue
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.mcache import MessageCache, default_msg_id_fn
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

log = logging.getLogger("gossip.libp2p")

_MAX_QUEUED_RPCS = 4096
_QUEUE_SLACK_RPCS = 16
"""Publishes wait while a peer's queue has fewer than this many free RPC slots, so
control messages and relayed traffic still fit."""
_EQUIVOCATION_MEMORY = 16384
_ADAPTIVE_LIST_WINDOW_S = 60.0

# Set (to a list) by our publish task while it runs pubsub.publish; the outbound queue
# records refused RPCs into it. trio tasks each have their own context, so refusals of
# RPCs relayed by other tasks are never attributed to our publish.
refused_rpcs: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "swarm_libp2p_refused_rpcs", default=None
)


class BoundedPriorityQueue(_rpc_queue.PriorityQueue):
    """The library's per-peer outbound queue, bounded by RPC count and by bytes."""

    def __init__(self, max_size: int, max_bytes: int, peer: str) -> None:
        super().__init__(max_size)
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.refused = 0
        self._peer = peer
        self._sizes: dict[int, deque[int]] = {}

    def push(self, rpc: rpc_pb2.RPC, priority: bool = False) -> bool:
        size = rpc.ByteSize()
        if len(self) >= self.max_size or self.queued_bytes + size > self.max_bytes:
            self.refused += 1
            refused = refused_rpcs.get()
            if refused is not None:
                refused.append(self._peer)
            return False
        ok = super().push(rpc, priority)
        if ok:
            self.queued_bytes += size
            self._sizes.setdefault(id(rpc), deque()).append(size)
        return ok

    def pop(self) -> rpc_pb2.RPC | None:
        rpc = super().pop()
        if rpc is not None:
            sizes = self._sizes.get(id(rpc))
            if sizes:
                self.queued_bytes -= sizes.popleft()
                if not sizes:
                    del self._sizes[id(rpc)]
        return rpc

    def has_room(self, size: int) -> bool:
        return (
            len(self) + _QUEUE_SLACK_RPCS <= self.max_size
            and self.queued_bytes + size <= self.max_bytes
        )


class PeerQueues(dict[ID, _rpc_queue.RpcQueue]):
    """`Pubsub.peer_queues`, resizing each new peer's queue before anything is pushed.

    `Pubsub._handle_new_peer` builds `RpcQueue()` with the defaults (32 RPCs, 1 MiB
    RPCs) and stores it here before any task can push to it.
    """

    def __init__(self, max_rpc_bytes: int, max_queued_bytes: int) -> None:
        super().__init__()
        self._max_rpc_bytes = max_rpc_bytes
        self._max_queued_bytes = max_queued_bytes

    def __setitem__(self, peer_id: ID, queue: _rpc_queue.RpcQueue) -> None:
        if not isinstance(getattr(queue, "_queue", None), _rpc_queue.PriorityQueue):
            raise RuntimeError("py-libp2p's RpcQueue changed; gossip/libp2p.py needs updating")
        if len(queue) == 0 and not isinstance(queue._queue, BoundedPriorityQueue):
            queue.max_message_size = self._max_rpc_bytes
            queue._queue = BoundedPriorityQueue(
                _MAX_QUEUED_RPCS, self._max_queued_bytes, peer_id.to_base58()
            )
        super().__setitem__(peer_id, queue)


class SwarmPubsub(Pubsub):
    """Pubsub handing every received message to a callback instead of a 32-slot channel."""

    def __init__(
        self,
        host: IHost,
        router: GossipSub,
        *,
        sink: Callable[[str, bytes, bytes], None],
        max_inbound_rpc_size: int,
        max_rpc_bytes: int,
        max_queued_bytes: int,
    ) -> None:
        super().__init__(
            host,
            router,
            strict_signing=True,
            max_inbound_rpc_size=max_inbound_rpc_size,
        )
        self._sink = sink
        self.peer_queues = PeerQueues(max_rpc_bytes, max_queued_bytes)

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


class SwarmGossipSub(GossipSub):
    """GossipSub with bounded equivocation memory and message cache, and no rate limit
    on own publishes."""

    def __init__(self, *, mcache_max_bytes: int = 64 << 20, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if type(self.mcache) is not MessageCache:
            raise RuntimeError("py-libp2p's MessageCache changed; gossip/libp2p.py needs updating")
        self.mcache = BoundedMessageCache(
            self.mcache.window_size, self.mcache.history_size, mcache_max_bytes
        )
        self._digests: OrderedDict[bytes, bytes] = OrderedDict()

    @property
    def mcache_bytes(self) -> int:
        cache = self.mcache
        return cache.bytes if isinstance(cache, BoundedMessageCache) else 0

    def _check_spam_protection(self, peer_id: ID, msg: rpc_pb2.Message) -> bool:
        if self.pubsub is not None and peer_id == self.pubsub.my_id:
            return True
        return super()._check_spam_protection(peer_id, msg)

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
        log.warning("equivocation from %s (same seqno, different content)", ID(msg.from_id))
        if self.scorer is not None:
            self.scorer.penalize_equivocation(ID(msg.from_id), 100.0)
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
