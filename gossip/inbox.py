"""A transport's receive queue: FIFO, bounded in messages and in bytes, fair between origins.

A transport's network side `offer`s each received message (from any thread); the node
reads them with `await get()` on its asyncio loop. Nothing here blocks the network side:
a message that does not fit is dropped at once and counted by reason.

Invariants:
- Bounds: at most `max_messages` messages and `max_bytes` bytes are held (a message's
  bytes are its payload plus `MESSAGE_OVERHEAD_BYTES` for the objects around it). The one
  exception is a message offered to an *empty* inbox, which is always admitted, so a
  message of any size the transport accepts can get through: held bytes never exceed
  `max(max_bytes, one message)`.
- Fairness (only where the transport knows an authenticated origin, e.g. libp2p's
  `from`; `origin=None` is one anonymous origin). Each origin's *share* is
  `share_bytes = max_bytes // PEER_SHARE_DIVISOR`. When a message from origin P does
  not fit: it is refused if P would then hold more than its share; otherwise the newest
  messages of the origin holding the most bytes are evicted while that origin holds
  more than its share, until the message fits. So an origin alone may fill the whole
  inbox (no room is wasted), but once another origin has something to deliver, an
  origin over its share loses its newest messages; an origin within its share never
  loses a queued message, and its new one is refused only when every origin holding
  messages is within its share too (no single origin can starve the others; Sybils
  with many origins can, which is the gossip layer's and peer scoring's concern).
- Drop reasons (`dropped`): `queue_full` (message bound), `bytes_full` (byte bound),
  `peer_share` (refused: the origin is over its share while others hold messages too),
  `evicted` (queued by an over-share origin, then evicted for another origin's
  message), `closed` (offered after `close`). `admitted` counts every message ever
  queued, evicted ones included.
- Delivery is FIFO over the messages still held. After `close`, `get` returns what is
  still held, then raises `ConnectionError`; offers after `close` are refused (`closed`).
- Thread-safety: `offer`, `close` and the counters may be used from any thread; `get`
  only on the loop `bind` was given. One lock guards the state; the loop is woken with
  `call_soon_threadsafe` from other threads, only by an offer into an empty inbox (a
  reader waits only after finding it empty).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, deque
from typing import Generic, TypeVar

__all__ = ["MESSAGE_OVERHEAD_BYTES", "PEER_SHARE_DIVISOR", "Inbox"]

log = logging.getLogger(__name__)

MESSAGE_OVERHEAD_BYTES = 512
"""Bytes charged per message on top of its payload (message object, topic, peer id)."""
PEER_SHARE_DIVISOR = 4
"""Under pressure, no origin keeps more than `max_bytes // PEER_SHARE_DIVISOR` bytes."""

T = TypeVar("T")


class _Entry(Generic[T]):
    """One held message; compared by identity (so `deque.remove` finds exactly it)."""

    __slots__ = ("item", "origin", "size")

    def __init__(self, item: T, size: int, origin: str | None) -> None:
        self.item = item
        self.size = size
        self.origin = origin


class Inbox(Generic[T]):
    """Bounded, origin-fair FIFO between a network thread and an asyncio reader."""

    def __init__(self, *, max_messages: int, max_bytes: int, name: str = "receive") -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("inbox bounds must be positive")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.share_bytes = max(1, max_bytes // PEER_SHARE_DIVISOR)
        self.name = name
        self.queued_bytes = 0
        self.peak_bytes = 0
        """Most bytes ever held at once (for metrics and tests)."""
        self.admitted = 0
        self.dropped: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._entries: deque[_Entry[T]] = deque()
        self._by_origin: dict[str | None, deque[_Entry[T]]] = {}
        self._origin_bytes: dict[str | None, int] = {}
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._ready: asyncio.Event | None = None

    # ---- any thread -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def origin_bytes(self, origin: str | None) -> int:
        """Bytes currently held for `origin`."""
        return self._origin_bytes.get(origin, 0)

    def offer(self, item: T, payload_bytes: int, origin: str | None = None) -> str | None:
        """Queue `item` unless a bound forbids it; return None, or the drop reason."""
        size = payload_bytes + MESSAGE_OVERHEAD_BYTES
        with self._lock:
            # The reader waits only once it found the inbox empty: a message joining
            # others needs no wake-up (one per message cost the transport's thread more
            # than the rest of its work under load; `gossip.loop_mailbox`).
            was_empty = not self._entries
            reason = self._make_room(size, origin)
            if reason is not None:
                self.dropped[reason] += 1
                total = self.dropped_total
                if total in (1, 10, 100) or total % 1000 == 0:
                    log.warning(
                        "%s queue full (%d messages, %d bytes held): %d dropped so far %s",
                        self.name,
                        len(self._entries),
                        self.queued_bytes,
                        total,
                        dict(self.dropped),
                    )
                return reason
            entry = _Entry(item, size, origin)
            self._entries.append(entry)
            self._by_origin.setdefault(origin, deque()).append(entry)
            self._origin_bytes[origin] = self._origin_bytes.get(origin, 0) + size
            self.queued_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
            self.admitted += 1
        if was_empty:
            self._wake()
        return None

    def close(self) -> None:
        """Refuse further offers; `get` drains what is held, then raises."""
        with self._lock:
            self._closed = True
        self._wake()

    def pop(self) -> T | None:
        """The oldest held message, or None."""
        with self._lock:
            if not self._entries:
                return None
            entry = self._entries.popleft()
            origin_entries = self._by_origin[entry.origin]
            oldest = origin_entries.popleft()
            assert oldest is entry, "per-origin order diverged from the global order"
            self._release(entry, origin_entries)
            return entry.item

    # ---- the asyncio side --------------------------------------------------------------

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach the reader's loop (call on that loop's thread, before `get`)."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._ready = asyncio.Event()

    async def get(self) -> T:
        """Wait for the next message; `ConnectionError` once closed and drained."""
        ready = self._ready
        if ready is None:
            raise RuntimeError("inbox not bound to a loop")
        while True:
            item = self.pop()
            if item is not None:
                return item
            if self._closed:
                ready.set()  # every other reader wakes and fails too
                raise ConnectionError(f"{self.name} queue closed")
            ready.clear()
            # An offer between the pop above and the clear would be missed: look again.
            item = self.pop()
            if item is not None:
                return item
            if not self._closed:
                await ready.wait()

    # ---- internals (lock held) -----------------------------------------------------------

    def _make_room(self, size: int, origin: str | None) -> str | None:
        if self._closed:
            return "closed"
        while self._entries and (
            len(self._entries) >= self.max_messages or self.queued_bytes + size > self.max_bytes
        ):
            full = "queue_full" if len(self._entries) >= self.max_messages else "bytes_full"
            held = self._origin_bytes.get(origin, 0)
            if held + size > self.share_bytes:
                # Blame the share only where it keeps room for someone else.
                return "peer_share" if 0 < held < self.queued_bytes else full
            hog = self._hog(exclude=origin)
            if hog is None:
                return full
            victim = hog.pop()  # the hog's newest
            self._entries.remove(victim)
            self._release(victim, hog)
            self.dropped["evicted"] += 1
        return None

    def _hog(self, exclude: str | None) -> deque[_Entry[T]] | None:
        """The entries of the origin (not `exclude`) holding the most bytes, if over its share."""
        hog: deque[_Entry[T]] | None = None
        most = self.share_bytes
        for origin, held in self._origin_bytes.items():
            if origin != exclude and held > most:
                hog, most = self._by_origin[origin], held
        return hog

    def _release(self, entry: _Entry[T], origin_entries: deque[_Entry[T]]) -> None:
        self.queued_bytes -= entry.size
        left = self._origin_bytes[entry.origin] - entry.size
        if origin_entries:
            self._origin_bytes[entry.origin] = left
        else:
            del self._origin_bytes[entry.origin]
            del self._by_origin[entry.origin]

    def _wake(self) -> None:
        loop, ready = self._loop, self._ready
        if loop is None or ready is None:
            return
        if threading.get_ident() == self._loop_thread:
            ready.set()
            return
        try:
            loop.call_soon_threadsafe(ready.set)
        except RuntimeError:
            log.debug("%s queue: reader loop closed; message left unread", self.name)
