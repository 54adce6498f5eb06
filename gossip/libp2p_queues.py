"""py-libp2p 0.8.1's per-peer outbound pubsub queues, bounded by RPC count and bytes.

The library builds each peer's `RpcQueue` with 32 RPCs of up to 1 MiB and no byte bound.
Here (`PeerQueues`, `BoundedPriorityQueue`) each queue holds at most `_MAX_QUEUED_RPCS`
RPCs and the transport's byte budget. While `refused_rpcs` is set (our own publish), a
message is refused for a peer whose queue lacks `_QUEUE_SLACK_RPCS` free slots or the
bytes, and the peer is reported: the publish skips that slow peer instead of waiting for
it; relayed and control RPCs meet only the hard bounds.

Invariants: `queued_bytes` is the sum of the sizes of the RPCs in the queue; a queue is
replaced only while empty, before any task pushed to it; the library internals touched
are listed in `gossip.libp2p_selfcheck`. No socket, no thread.
"""

from __future__ import annotations

import contextvars
from collections import deque

from libp2p.peer.id import ID
from libp2p.pubsub import rpc_queue as _rpc_queue
from libp2p.pubsub.pb import rpc_pb2

from gossip.libp2p_selfcheck import check_instance

_HERE = "gossip/libp2p_queues.py"

_MAX_QUEUED_RPCS = 4096
_QUEUE_SLACK_RPCS = 16
"""Publishes wait while a peer's queue has fewer than this many free RPC slots, so
control messages and relayed traffic still fit."""

# Set (to a list) by our publish task while it runs pubsub.publish; the outbound queue
# records the peers it refused our message for. trio tasks each have their own context,
# so refusals of RPCs relayed by other tasks are never attributed to our publish.
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
        report = refused_rpcs.get() if len(rpc.publish) else None
        # Our own message needs slack left over (relayed and control RPCs still fit);
        # anything else only the hard bounds.
        full = (
            not self.has_room(size)
            if report is not None
            else len(self) >= self.max_size or self.queued_bytes + size > self.max_bytes
        )
        if full:
            self.refused += 1
            if report is not None:
                report.append(self._peer)
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
        check_instance(queue, [("_queue", _rpc_queue.PriorityQueue)], _HERE)
        if len(queue) == 0 and not isinstance(queue._queue, BoundedPriorityQueue):
            queue.max_message_size = self._max_rpc_bytes
            queue._queue = BoundedPriorityQueue(
                _MAX_QUEUED_RPCS, self._max_queued_bytes, peer_id.to_base58()
            )
        super().__setitem__(peer_id, queue)


def outbound_totals(peer_queues: dict[ID, _rpc_queue.RpcQueue]) -> tuple[int, int]:
    """(RPCs refused, bytes queued) over every peer's bounded queue (a snapshot safe from
    the asyncio thread: `tuple()` over the dict runs under the GIL)."""
    refused = queued = 0
    for queue in tuple(peer_queues.values()):
        inner = queue._queue  # private: checked at start (gossip.libp2p_selfcheck)
        if isinstance(inner, BoundedPriorityQueue):
            refused += inner.refused
            queued += inner.queued_bytes
    return refused, queued
