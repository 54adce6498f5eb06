"""One pubsub RPC frame at a time per stream (`SwarmPubsub.write_msg`).

yamux writes a frame larger than the peer's receive window in pieces, releasing its lock
while it waits for the window to open; the library has several writers to one pubsub
stream. The stream below writes in 1 KB pieces and yields between them, as yamux does
at a closed window: two RPCs written at once by the library's own `write_msg` come out
torn (the check that this fake reproduces the fault), and through ours whole.
"""

from __future__ import annotations

import weakref
from typing import Any

import trio
from google.protobuf.message import DecodeError
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.utils.varint import decode_uvarint

from gossip.libp2p_patches import SwarmPubsub

PIECE = 1024


class SlowWindowStream:
    """A stream whose writes go out in `PIECE`-byte pieces, yielding between them."""

    def __init__(self) -> None:
        self.wire = bytearray()

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), PIECE):
            self.wire += data[start : start + PIECE]
            await trio.sleep(0)


def frames(wire: bytes) -> list[bytes]:
    """Split varint-length-prefixed frames."""
    out, at = [], 0
    while at < len(wire):
        end = at
        while wire[end] & 0x80:
            end += 1
        length = decode_uvarint(bytes(wire[at : end + 1]))
        out.append(bytes(wire[end + 1 : end + 1 + length]))
        at = end + 1 + length
    return out


def _rpc(data: bytes) -> rpc_pb2.RPC:
    return rpc_pb2.RPC(publish=[rpc_pb2.Message(data=data, topicIDs=["t"])])


def _write_two_at_once(write_msg: Any) -> list[bytes]:
    stream = SlowWindowStream()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_msg, stream, _rpc(b"\x01" * 50_000))
            while not stream.wire:  # the large one is under way, waiting for the window
                await trio.sleep(0)
            nursery.start_soon(write_msg, stream, _rpc(b"\x02" * 300))

    trio.run(main)
    return frames(bytes(stream.wire))


def _parses(frame: bytes) -> bool:
    rpc = rpc_pb2.RPC()
    try:
        rpc.ParseFromString(frame)
    except DecodeError:
        return False
    return len(rpc.publish) == 1 and len(set(rpc.publish[0].data)) == 1


def test_the_librarys_writers_tear_each_others_frames_on_such_a_stream() -> None:
    pubsub = object.__new__(Pubsub)  # write_msg uses only the stream on success
    got = _write_two_at_once(pubsub.write_msg)
    assert not all(_parses(f) for f in got)


def test_swarm_pubsub_writes_one_rpc_at_a_time_per_stream() -> None:
    pubsub = object.__new__(SwarmPubsub)
    pubsub._write_locks = weakref.WeakKeyDictionary()  # what __init__ sets for it
    got = _write_two_at_once(pubsub.write_msg)
    assert len(got) == 2 and all(_parses(f) for f in got)
    assert sorted(len(f) for f in got)[1] > 50_000
