"""Oversize inbound pubsub RPCs read and discarded, the stream kept (py-libp2p 0.8.1).

The library reads a frame's length, raises `MessageTooLarge`, resets the pubsub stream
and forgets the peer's subscriptions; the peer's later valid messages are lost until it
notices and opens a new stream. `OversizeRpcFilter` sits between the stream and the
library's reader instead: an oversize frame is read and thrown away and the stream stays
open; only a frame claiming more than `MAX_DISCARD_BYTES` is left to the library's reset.

Invariants: bytes of frames within the limit reach the library unchanged and in order; a
malformed or truncated length prefix is handed through as read (the library raises as it
would have); no socket of its own, no thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libp2p.abc import INetStream
from libp2p.exceptions import ParseError
from libp2p.utils.varint import decode_uvarint

MAX_DISCARD_BYTES = 256 << 20
"""An inbound RPC frame over the size limit is read and discarded up to this claimed
length; a larger claim (no implementation sends one) is left to the library's reset."""
_DISCARD_CHUNK_BYTES = 64 * 1024
_READ_BYTES = 64 * 1024
"""How much `OversizeRpcFilter` asks of the stream at a time (what is there comes back)."""


class OversizeRpcFilter:
    """A pubsub stream as `Pubsub.continuously_read_stream` reads it, minus oversize RPCs.

    Reads the varint length of each RPC frame itself. A frame within `limit` is handed
    through unchanged (prefix, then body); a frame over `limit` but at most
    `MAX_DISCARD_BYTES` is read and thrown away in `_DISCARD_CHUNK_BYTES` pieces (the
    sender pays its bandwidth; the stream, the peer's subscriptions and its later RPCs
    survive) and reported to `on_oversize(length, True)`; a larger claim is reported with
    `False` and handed through, so the library raises `MessageTooLarge` and resets the
    stream. A malformed or truncated prefix is handed through as read, so the library
    raises as it would have. Everything else is the wrapped stream's.

    The stream is read `_READ_BYTES` at a time into a buffer the frames are cut from. Read
    a byte at a time (the library's varint reader), each read of a yamux stream sent a
    window update, i.e. an encrypted frame and a socket write per byte of each prefix:
    ~20% of the transport thread under a flood.
    """

    def __init__(
        self, stream: INetStream, limit: int, on_oversize: Callable[[int, bool], None]
    ) -> None:
        self._stream = stream
        self._limit = limit
        self._on_oversize = on_oversize
        self._prefix = b""
        self._body_left = 0
        self._buffer = b""
        self._at = 0
        """`_buffer[_at:]` was read from the stream and not handed on yet."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def read(self, n: int | None = None) -> bytes:
        if n is None or n < 0:
            raise ValueError("OversizeRpcFilter reads bounded pieces only")
        if not self._prefix and self._body_left == 0:
            await self._next_frame()
        if self._prefix:
            piece, self._prefix = self._prefix[:n], self._prefix[n:]
            return piece
        if self._body_left:
            piece = await self._take(min(n, self._body_left))
            self._body_left -= len(piece)
            return piece
        return b""

    async def _take(self, n: int) -> bytes:
        """Up to `n` bytes of the stream (b"" at its end): buffered ones first."""
        if self._at == len(self._buffer):
            if n >= _READ_BYTES:
                return await self._stream.read(n)  # a large body: no copy through here
            self._buffer, self._at = await self._stream.read(_READ_BYTES), 0
        piece = self._buffer[self._at : self._at + n]
        self._at += len(piece)
        return piece

    async def _next_frame(self) -> None:
        while True:
            prefix = bytearray()
            while True:
                byte = await self._take(1)
                if not byte:
                    self._prefix = bytes(prefix)  # truncated: the library reports it
                    return
                prefix += byte
                if not byte[0] & 0x80:
                    break
                if len(prefix) >= 10:
                    self._prefix = bytes(prefix)  # not a 64-bit varint: ParseError there
                    return
            try:
                length = decode_uvarint(bytes(prefix))
            except ParseError:
                self._prefix = bytes(prefix)  # over 64 bits: the library raises too
                return
            if length <= self._limit or length > MAX_DISCARD_BYTES:
                if length > self._limit:
                    self._on_oversize(length, False)
                self._prefix, self._body_left = bytes(prefix), length
                return
            left = length
            while left:
                piece = await self._take(min(left, _DISCARD_CHUNK_BYTES))
                if not piece:
                    return  # the stream ended: the library sees that at the next read
                left -= len(piece)
            self._on_oversize(length, True)
