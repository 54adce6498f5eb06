"""Splitting an encoded envelope into `Chunk`s and reassembling them, with hard bounds.

A message too large for the transport travels as `count` chunks; each names
`inner_digest` (the signing digest of the inner envelope, which names the set), its
`index`, the `count` and the `total_size`. The gossip layer seals each chunk as its own
signed envelope (the signature covers the chunk's data) and takes the reassembled
envelope's digest from the chunks' `inner_digest` (their signer's word); this module only
sees authenticated chunks and knows nothing of envelopes or transports. It hashes
nothing: every byte is hashed once on arrival, by the chunk's signature check.

Invariants:
- Partial sets are keyed by `(sender, inner_digest)`, so one sender cannot add pieces to
  (or spoil) another sender's message.
- Memory is bounded: the bytes held by all partial sets together never exceed
  `max_pending_bytes`; one sender's never exceed `max_message_bytes`; there are at most
  `max_partials` sets. A sender over its own allowance first loses its *older* partial
  sets (`evicted`: a set that lost a chunk in transit must not lock an honest sender out
  until it expires). A chunk that would still break a bound is refused
  (`reassembly_full`) and its whole set dropped at once (it could never complete), and
  later chunks of that set are refused too without being stored.
- A declared `total_size` above `max_message_bytes` is refused (`oversize`) before
  anything is stored. Every chunk must agree with its set's first chunk on `count`,
  `total_size` and topic, carry non-empty data, and the data may never add up to more
  than `total_size` (`bad_chunk`; the set is dropped).
- Bytes are returned only when all `count` chunks arrived and their sizes add up
  exactly; whether they are the envelope `inner_digest` names is the caller's check.
- A set whose first chunk arrived more than `timeout_s` ago is dropped by `expire`.
- Every refusal is a `WireError`; nothing else escapes for any chunk values.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from swarm.bounded import BoundedDict
from swarm.errors import WireError
from swarm.messages import Chunk

MAX_CHUNKS = 1 << 16  # Chunk.from_wire refuses a larger count
DEFAULT_MAX_PARTIALS = 1024


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def split(
    data: bytes, max_chunk_data: int, inner_digest: bytes, *, views: bool = False
) -> list[Chunk]:
    """Cut `data` (an encoded envelope whose signing digest is `inner_digest`) into chunks
    of at most `max_chunk_data` bytes each (>= 2 chunks unless small). With `views`, each
    chunk's data is a memoryview of `data` (no copy; the gossip layer copies it once, into
    the chunk's wire bytes); otherwise bytes."""
    if max_chunk_data < 1:
        raise ValueError("max_chunk_data must be >= 1")
    if not data:
        raise ValueError("nothing to chunk")
    count = -(-len(data) // max_chunk_data)
    if count > MAX_CHUNKS:
        raise ValueError(f"{len(data)} bytes need {count} chunks; at most {MAX_CHUNKS} allowed")
    if len(inner_digest) != 32:
        raise ValueError("inner_digest must be 32 bytes")
    source = memoryview(data) if views else data
    return [
        Chunk(inner_digest, index, count, len(data), source[start : start + max_chunk_data])
        for index, start in enumerate(range(0, len(data), max_chunk_data))
    ]


@dataclass
class _Partial:
    sender: str
    topic: str
    count: int
    total_size: int
    started: float
    parts: dict[int, bytes | memoryview] = field(default_factory=dict)
    size: int = 0


class Reassembler:
    """Collects authenticated chunks per (sender, inner_digest) until a set completes."""

    def __init__(
        self,
        *,
        max_pending_bytes: int,
        max_message_bytes: int,
        timeout_s: float,
        max_partials: int = DEFAULT_MAX_PARTIALS,
    ) -> None:
        if max_pending_bytes < 1 or max_message_bytes < 1 or timeout_s <= 0 or max_partials < 1:
            raise ValueError("reassembly bounds must be positive")
        self.max_pending_bytes = max_pending_bytes
        self.max_message_bytes = max_message_bytes
        self.timeout_s = timeout_s
        self.max_partials = max_partials
        self.pending_bytes = 0
        self._partials: OrderedDict[tuple[str, bytes], _Partial] = OrderedDict()
        self._per_sender: dict[str, int] = {}
        self._abandoned: BoundedDict[tuple[str, bytes], None] = BoundedDict(max_partials, fifo=True)
        self.evicted = 0
        """Partial sets dropped to make room for a newer set of the same sender."""

    def __len__(self) -> int:
        return len(self._partials)

    def pending_for(self, sender: str) -> int:
        return self._per_sender.get(sender, 0)

    def add(self, sender: str, topic: str, chunk: Chunk, now: float) -> bytes | None:
        """Store one verified-signature chunk; return the whole content once complete."""
        if chunk.total_size > self.max_message_bytes:
            raise WireError(
                "oversize", f"chunked message of {chunk.total_size} > {self.max_message_bytes}"
            )
        if not chunk.data:
            raise WireError("bad_chunk", "empty chunk")
        key = (sender, chunk.inner_digest)
        if key in self._abandoned:
            raise WireError("reassembly_full", "rest of a chunk set dropped for lack of room")
        partial = self._partials.get(key)
        if partial is None:
            if len(self._partials) >= self.max_partials:
                self._abandon(key)
                raise WireError("reassembly_full", f"{len(self._partials)} partial sets held")
            partial = _Partial(sender, topic, chunk.count, chunk.total_size, now)
            self._partials[key] = partial
        elif (partial.count, partial.total_size, partial.topic) != (
            chunk.count, chunk.total_size, topic
        ):
            self._discard(key)
            raise WireError("bad_chunk", "chunk disagrees with its set on count/size/topic")
        if chunk.index in partial.parts:
            raise WireError("duplicate", f"chunk {chunk.index} already held")
        size = len(chunk.data)
        if partial.size + size > partial.total_size:
            self._discard(key)
            raise WireError("bad_chunk", "chunks add up to more than total_size")
        self._make_room_for(sender, key, size)
        if (
            self.pending_bytes + size > self.max_pending_bytes
            or self.pending_for(sender) + size > self.max_message_bytes
        ):
            detail = f"{self.pending_bytes} bytes pending, {size} more refused"
            self._discard(key)
            self._abandon(key)
            raise WireError("reassembly_full", detail)
        partial.parts[chunk.index] = chunk.data
        partial.size += size
        self.pending_bytes += size
        self._per_sender[sender] = self.pending_for(sender) + size
        if len(partial.parts) < partial.count:
            return None
        self._discard(key)
        if partial.size != partial.total_size:
            raise WireError("bad_chunk", "chunks add up to less than total_size")
        return b"".join(partial.parts[i] for i in range(partial.count))

    def expire(self, now: float) -> int:
        """Drop sets older than the timeout; return how many were dropped."""
        expired = 0
        while self._partials:
            key, partial = next(iter(self._partials.items()))
            if now - partial.started <= self.timeout_s:
                break
            self._discard(key)
            expired += 1
        return expired

    def _make_room_for(self, sender: str, key: tuple[str, bytes], size: int) -> None:
        """Over its own allowance, a sender's *older* partial sets go first (counted in
        `evicted`): one lost chunk must not lock a peer out until its set expires."""
        while self.pending_for(sender) + size > self.max_message_bytes:
            older = next((k for k in self._partials if k[0] == sender and k != key), None)
            if older is None:
                return
            self._discard(older)
            self._abandon(older)
            self.evicted += 1

    def discard_sender(self, sender: str) -> int:
        """Drop every partial set of `sender` (a peer being ignored); return how many."""
        keys = [key for key in self._partials if key[0] == sender]
        for key in keys:
            self._discard(key)
        return len(keys)

    def clear(self) -> None:
        for key in list(self._partials):
            self._discard(key)
        self._abandoned.clear()

    def _discard(self, key: tuple[str, bytes]) -> None:
        partial = self._partials.pop(key, None)
        if partial is None:
            return
        self.pending_bytes -= partial.size
        left = self.pending_for(partial.sender) - partial.size
        if left > 0:
            self._per_sender[partial.sender] = left
        else:
            self._per_sender.pop(partial.sender, None)

    def _abandon(self, key: tuple[str, bytes]) -> None:
        self._abandoned[key] = None
