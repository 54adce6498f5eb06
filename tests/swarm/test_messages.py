"""Wire types: strict from_wire (types, bounds, fields) and round trips of every kind."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math

import pytest

from swarm.codec import Limits, pack, unpack
from swarm.errors import WireError
from swarm.messages import (
    MAX_GROUP_SIZE,
    PAYLOAD_TYPES,
    Chunk,
    DeltaPacket,
    Hello,
    Payload,
    RolloutBatch,
    RolloutGroup,
    TaskRef,
    decode_payload,
    encode_payload,
    payload_parts,
)
from tests.swarm.mutations import byte_flips

LIMITS = Limits()


def group(**overrides: object) -> RolloutGroup:
    fields: dict = {
        "task": TaskRef("add", 1, 2),
        "prompt": "1+1=",
        "completions": ("2", "3"),
        "rewards": (1.0, 0.0),
        "model_id": "tiny",
        "policy_version": 4,
    }
    fields.update(overrides)
    return RolloutGroup(**fields)


EXAMPLES: list[Payload] = [
    Hello("tiny", "fam", 3, ("rollouts", "deltas")),
    Hello("", "", 0),
    RolloutBatch((group(), group(prompt="héllo ✓", rewards=(-0.5, 2)))),
    RolloutBatch(()),
    DeltaPacket("fam", 7, "topk-int8", b"\x00" * 1000, {"k": "v"}),
    Chunk(hashlib.sha256(b"x").digest(), 0, 2, 10, b"abc"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_roundtrip(message: Payload) -> None:
    assert decode_payload(message.KIND, encode_payload(message), LIMITS) == message


def test_every_kind_is_registered() -> None:
    assert set(PAYLOAD_TYPES) == {"hello", "rollouts", "delta", "chunk"}


def test_unknown_kind() -> None:
    with pytest.raises(WireError) as info:
        decode_payload("teleport", pack({}), LIMITS)
    assert info.value.reason == "unknown_kind"


def mutate(message: Payload, path: tuple, value: object) -> dict:
    wire = copy.deepcopy(message.to_wire())
    target = wire
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return wire


def refused(kind: str, wire: object) -> str:
    with pytest.raises(WireError) as info:
        decode_payload(kind, pack(wire), LIMITS)
    return info.value.reason


HELLO = EXAMPLES[0]
BATCH = EXAMPLES[2]
DELTA = EXAMPLES[4]
CHUNK = EXAMPLES[5]


@pytest.mark.parametrize(
    ("message", "path", "value"),
    [
        (HELLO, ("policy_version",), True),  # bool is not an int
        (HELLO, ("policy_version",), -1),
        (HELLO, ("policy_version",), 1.0),
        (HELLO, ("model_id",), b"bytes"),
        (HELLO, ("model_id",), "m" * 257),
        (HELLO, ("capabilities",), ["c"] * 33),
        (HELLO, ("capabilities",), "rollouts"),
        (BATCH, ("groups", 0, "rewards", 0), math.nan),
        (BATCH, ("groups", 0, "rewards", 0), math.inf),
        (BATCH, ("groups", 0, "rewards", 0), True),
        (BATCH, ("groups", 0, "rewards", 0), "1.0"),
        (BATCH, ("groups", 0, "rewards"), [1.0]),  # length differs from completions
        (BATCH, ("groups", 0, "completions"), []),
        (BATCH, ("groups", 0, "rewards"), [0.0] * (MAX_GROUP_SIZE + 1)),
        (BATCH, ("groups", 0, "task", "seed"), False),
        (BATCH, ("groups", 0, "task", "index"), -3),
        (BATCH, ("groups", 0, "task"), ["add", 1, 2]),
        (BATCH, ("groups", 0, "prompt"), "p" * (64 * 1024 + 1)),
        (BATCH, ("groups",), {"0": {}}),
        (DELTA, ("base_version",), True),
        (DELTA, ("tensors",), "not bytes"),
        (DELTA, ("meta",), {str(i): "v" for i in range(65)}),
        (DELTA, ("meta",), {"k": 1}),
        (DELTA, ("encoding",), "e" * 65),
        (CHUNK, ("inner_digest",), b"\x00" * 31),
        (CHUNK, ("inner_digest",), b"\x00" * 33),
        (CHUNK, ("index",), 2),  # index must be < count
        (CHUNK, ("count",), 0),
        (CHUNK, ("count",), (1 << 16) + 1),
        (CHUNK, ("total_size",), 0),
        (CHUNK, ("data",), "text"),
    ],
)
def test_bad_field_refused(message: Payload, path: tuple, value: object) -> None:
    assert refused(message.KIND, mutate(message, path, value)) == "bad_payload"


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_unknown_field_refused(message: Payload) -> None:
    wire = message.to_wire()
    wire["surprise"] = 1
    assert refused(message.KIND, wire) == "bad_payload"


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_missing_field_refused(message: Payload) -> None:
    wire = message.to_wire()
    wire.pop(next(iter(wire)))
    assert refused(message.KIND, wire) == "bad_payload"


@pytest.mark.parametrize("kind", sorted(PAYLOAD_TYPES))
@pytest.mark.parametrize("wire", [[], "x", 1, None, b"\x00"])
def test_non_map_payload_refused(kind: str, wire: object) -> None:
    assert refused(kind, wire) == "bad_payload"


def test_int_reward_accepted_as_float() -> None:
    wire = mutate(BATCH, ("groups", 0, "rewards", 0), 1)
    decoded = decode_payload("rollouts", pack(wire), LIMITS)
    assert isinstance(decoded, RolloutBatch)
    assert decoded.groups[0].rewards[0] == 1.0
    assert isinstance(decoded.groups[0].rewards[0], float)


def test_group_constructor_checks_lengths() -> None:
    with pytest.raises(WireError):
        group(rewards=(1.0,))


@pytest.mark.parametrize("size", [0, 255, 256, 65_535, 65_536, 300_000])
@pytest.mark.parametrize("meta", [{}, {"scale": "0.5", "k": "12"}])
def test_payload_parts_join_to_the_encoding(size: int, meta: dict[str, str]) -> None:
    """The pieces a delta's or a chunk's payload is framed from (large tensors, chunk
    data left unjoined) concatenate to exactly `encode_payload`'s bytes."""
    tensors = bytes(range(256)) * (size // 256) + bytes(size % 256)
    delta = DeltaPacket("fam-é", 2**40, "topk-fp16", tensors, meta)
    parts = payload_parts(delta)
    assert b"".join(parts) == encode_payload(delta)
    assert (len(parts) == 3) == (size >= 65_536)
    if size:
        chunk = Chunk(bytes(32), 1, 3, 3 * size, memoryview(tensors))
        assert b"".join(chunk.payload_parts()) == pack({**chunk.to_wire(), "data": tensors})


def _chunk_outcome(data: bytes, limits: Limits, *, general: bool) -> tuple:
    try:
        if general:  # every payload through msgpack
            chunk = Chunk.from_wire(unpack(data, limits))
        else:
            chunk = decode_payload("chunk", data, limits)
    except WireError as exc:
        return ("refused", exc.reason)
    return ("accepted", dataclasses.replace(chunk, data=bytes(chunk.data)))


def test_large_chunks_are_read_without_copying_their_data() -> None:
    data = bytes(range(256)) * 400
    chunk = Chunk(hashlib.sha256(b"set").digest(), 1, 3, 3 * len(data), data)
    payload = encode_payload(chunk)
    read = decode_payload("chunk", payload, Limits())
    assert isinstance(read.data, memoryview) and read.data.readonly
    assert dataclasses.replace(read, data=bytes(read.data)) == chunk
    # The same map in another key order: the general decoder reads it (data as bytes).
    reordered = pack({"data": data, **{k: v for k, v in chunk.to_wire().items() if k != "data"}})
    assert decode_payload("chunk", reordered, Limits()) == chunk


def test_zero_copy_chunk_reading_accepts_and_refuses_exactly_as_msgpack_does() -> None:
    """Byte flips in the head and at the end of a large chunk payload, truncations,
    extensions and tight limits (each limit the general decoder enforces): the zero-copy
    reading and the general decoder agree on every one (the same chunk, or the same
    reason)."""
    payload = encode_payload(Chunk(bytes(range(32)), 2, 5, 500_000, bytes(70_000)))
    hot = [*range(0, 90), *range(len(payload) - 20, len(payload))]
    cases = [payload, payload + b"\0", payload[:-1], b"\x84" + payload[1:]]
    cases += byte_flips(payload, hot, 500, seed=11)
    limits = [
        Limits(),
        Limits(max_bin_len=60_000),
        Limits(max_str_len=4),
        Limits(max_map_len=4),
        Limits(max_message_bytes=70_000),
        Limits(max_depth=0),
        Limits(max_containers=0),
    ]
    accepted = 0
    for case in cases:
        for limit in limits:
            fast = _chunk_outcome(case, limit, general=False)
            assert fast == _chunk_outcome(case, limit, general=True), (case[:90], limit)
            accepted += fast[0] == "accepted"
    assert accepted > 50  # many mutations (ints, digest bytes) still decode
