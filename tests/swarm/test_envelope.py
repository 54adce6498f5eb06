"""Envelopes: seal/decode round trip and one counted reason per refusal."""

from __future__ import annotations

import dataclasses

import pytest

import swarm.envelope
from swarm import PROTOCOL_VERSION
from swarm.codec import Limits, bin_header, pack
from swarm.envelope import Envelope, decode_envelope, seal, seal_parts
from swarm.errors import WireError
from swarm.identity import Identity
from swarm.messages import Chunk, Hello, decode_payload, encode_payload
from tests.swarm.mutations import byte_flips

V = PROTOCOL_VERSION
SWARM = "test-swarm"
IDENTITY = Identity.from_seed(bytes(range(32)))
LIMITS = Limits()


def sealed(**overrides: object) -> Envelope:
    fields: dict = {
        "kind": "hello",
        "swarm_id": SWARM,
        "seq": 7,
        "policy_version": 3,
        "payload": encode_payload(Hello("m", "fam", 1, ("rollouts",))),
    }
    fields.update(overrides)
    return seal(IDENTITY, **fields)


def resigned(envelope: Envelope, identity: Identity = IDENTITY, **changes: object) -> bytes:
    """An envelope with `changes`, correctly signed, so only the changed rule can refuse it."""
    unsigned = dataclasses.replace(envelope, signature=b"", **changes)
    return dataclasses.replace(unsigned, signature=identity.sign(unsigned.signed_bytes())).encode()


def reason(data: bytes, swarm_id: str = SWARM, limits: Limits = LIMITS) -> str:
    with pytest.raises(WireError) as info:
        decode_envelope(data, limits, swarm_id)
    return info.value.reason


def test_roundtrip() -> None:
    envelope = sealed()
    decoded = decode_envelope(envelope.encode(), LIMITS, SWARM)
    assert decoded == envelope
    assert decoded.sender == IDENTITY.peer_id
    assert decoded.version == PROTOCOL_VERSION
    assert decode_payload(decoded.kind, decoded.payload, LIMITS) == Hello(
        "m", "fam", 1, ("rollouts",)
    )


def test_sealing_is_deterministic() -> None:
    assert sealed().encode() == sealed().encode()


def test_tampered_signature_is_bad_signature() -> None:
    envelope = sealed()
    sig = bytearray(envelope.signature)
    sig[0] ^= 1
    assert reason(dataclasses.replace(envelope, signature=bytes(sig)).encode()) == "bad_signature"


def test_a_signature_checked_by_the_transport_is_not_verified_again_and_the_rest_is() -> None:
    envelope = sealed()
    sig = bytearray(envelope.signature)
    sig[0] ^= 1
    data = dataclasses.replace(envelope, signature=bytes(sig)).encode()
    decoded = decode_envelope(data, LIMITS, SWARM, signature_checked=True)
    assert decoded.signing_digest == envelope.signing_digest
    with pytest.raises(WireError) as info:
        decode_envelope(data, LIMITS, "another-swarm", signature_checked=True)
    assert info.value.reason == "wrong_swarm"


@pytest.mark.parametrize(
    "change", [{"seq": 8}, {"policy_version": 4}, {"payload": b"\x80"}, {"kind": "rollouts"}]
)
def test_tampered_field_is_bad_signature(change: dict) -> None:
    envelope = dataclasses.replace(sealed(), **change)
    assert reason(envelope.encode()) == "bad_signature"


def test_signature_by_someone_else_is_bad_signature() -> None:
    other = Identity.from_seed(b"\x01" * 32)
    forged = resigned(sealed(), identity=other)  # claims IDENTITY as sender
    assert reason(forged) == "bad_signature"


def test_short_signature_is_bad_signature() -> None:
    assert reason(dataclasses.replace(sealed(), signature=b"\x00" * 63).encode()) == "bad_signature"


def test_wrong_swarm() -> None:
    assert reason(sealed().encode(), swarm_id="other-swarm") == "wrong_swarm"
    assert reason(sealed(swarm_id="other-swarm").encode()) == "wrong_swarm"


def test_long_swarm_id_is_malformed() -> None:
    assert reason(resigned(sealed(), swarm_id="s" * 129)) == "malformed"


def test_unknown_version() -> None:
    assert reason(resigned(sealed(), version=PROTOCOL_VERSION + 1)) == "bad_version"


def test_unknown_kind() -> None:
    assert reason(resigned(sealed(), kind="teleport")) == "unknown_kind"


def test_sender_that_is_no_peer_id() -> None:
    assert reason(dataclasses.replace(sealed(), sender="not-a-peer-id").encode()) == "bad_sender"


def test_oversize_envelope() -> None:
    data = sealed(payload=b"x" * 5000).encode()
    assert reason(data, limits=Limits(max_message_bytes=4096)) == "oversize"


@pytest.mark.parametrize(
    "fields",
    [
        [V, "hello", SWARM, IDENTITY.peer_id, 0, 0, b"", b"s" * 64, "extra"],  # 9 fields
        [V, "hello", SWARM, IDENTITY.peer_id, 0, 0, b""],  # 7 fields
        {"version": 1},
        [True, "hello", SWARM, IDENTITY.peer_id, 0, 0, b"", b"s" * 64],  # bool version
        [V, 5, SWARM, IDENTITY.peer_id, 0, 0, b"", b"s" * 64],  # int kind
        [V, "hello", 5, IDENTITY.peer_id, 0, 0, b"", b"s" * 64],  # int swarm
        [V, "hello", SWARM, b"peer", 0, 0, b"", b"s" * 64],  # bytes sender
        [V, "hello", SWARM, IDENTITY.peer_id, True, 0, b"", b"s" * 64],  # bool seq
        [V, "hello", SWARM, IDENTITY.peer_id, -1, 0, b"", b"s" * 64],  # negative seq
        [V, "hello", SWARM, IDENTITY.peer_id, 0, 2**53, b"", b"s" * 64],  # over JS-safe ints
        [V, "hello", SWARM, IDENTITY.peer_id, 2**53, 0, b"", b"s" * 64],  # seq too
        [2**16, "hello", SWARM, IDENTITY.peer_id, 0, 0, b"", b"s" * 64],  # version over u16
        [V, "k" * 33, SWARM, IDENTITY.peer_id, 0, 0, b"", b"s" * 64],  # kind too long
        [V, "hello", SWARM, "p" * 129, 0, 0, b"", b"s" * 64],  # sender too long
        [V, "hello", SWARM, IDENTITY.peer_id, 0, 1.5, b"", b"s" * 64],  # float policy version
        [V, "hello", SWARM, IDENTITY.peer_id, 0, 0, "payload", b"s" * 64],  # str payload
        [V, "hello", SWARM, IDENTITY.peer_id, 0, 0, b"", "s" * 64],  # str signature
    ],
)
def test_malformed_structure(fields: object) -> None:
    assert reason(pack(fields)) == "malformed"


def test_garbage_bytes() -> None:
    assert reason(b"\x00\x01garbage") == "malformed"
    assert reason(b"") == "malformed"


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_535, 65_536, 1_000_003])
def test_bin_header_frames_bytes_as_pack_does(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert bin_header(len(data)) + data == pack(data)


@pytest.mark.parametrize("size", [1, 200, 70_000, 1_048_000])
@pytest.mark.parametrize("seq", [0, 2**53 - 1])
def test_sealing_a_chunk_in_parts_is_byte_identical(size: int, seq: int) -> None:
    """`seal_parts` (chunks framed from a view, copied once) must produce exactly the bytes
    and signing digest of `seal` + `encode` of the joined payload."""
    inner = bytes(i % 251 for i in range(size + 17))
    chunk = Chunk(b"\x07" * 32, 3, 9, 1 << 33, memoryview(inner)[17:])
    head, data = chunk.payload_parts()
    assert head + bytes(data) == encode_payload(chunk)
    fields = {"kind": "chunk", "swarm_id": SWARM, "seq": seq, "policy_version": 5}
    wire, digest = seal_parts(IDENTITY, payload_parts=(head, data), **fields)
    whole = seal(IDENTITY, payload=encode_payload(chunk), **fields)
    assert wire == whole.encode()
    assert digest == whole.signing_digest
    decoded = decode_envelope(wire, Limits(max_message_bytes=2 << 20, max_bin_len=2 << 20), SWARM)
    assert decode_payload("chunk", decoded.payload, Limits(max_bin_len=2 << 20)) == Chunk(
        b"\x07" * 32, 3, 9, 1 << 33, inner[17:]
    )


@pytest.mark.parametrize("size", [0, 65_535, 65_536, 3_000_001])
def test_large_envelopes_encode_as_msgpack_does(size: int) -> None:
    envelope = sealed(payload=bytes(i % 253 for i in range(size)))
    assert envelope.encode() == pack(
        [envelope.version, envelope.kind, envelope.swarm_id, envelope.sender, envelope.seq,
         envelope.policy_version, envelope.payload, envelope.signature]
    )  # fmt: skip


def _outcome(data: bytes, limits: Limits = LIMITS) -> tuple:
    try:
        envelope = decode_envelope(data, limits, SWARM)
    except WireError as exc:
        return ("refused", exc.reason)
    return ("accepted", dataclasses.replace(envelope, payload=bytes(envelope.payload)))


def _general(data: bytes, limits: Limits = LIMITS) -> tuple:
    """The outcome with the zero-copy reading off (every envelope through msgpack)."""
    original = swarm.envelope._VIEW_AT_BYTES
    swarm.envelope._VIEW_AT_BYTES = 1 << 62
    try:
        return _outcome(data, limits)
    finally:
        swarm.envelope._VIEW_AT_BYTES = original


@pytest.mark.parametrize("size", [20_000, 70_000, 300_000])
def test_large_envelopes_are_read_without_copying_the_payload(size: int) -> None:
    payload = encode_payload(Chunk(bytes(32), 0, 2, 2 * size, bytes(range(256)) * (size // 256)))
    wire = sealed(kind="chunk", payload=payload).encode()
    assert isinstance(decode_envelope(wire, LIMITS, SWARM).payload, memoryview)
    fast, general = _outcome(wire), _general(wire)
    assert fast == general and fast[0] == "accepted" and fast[1].payload == payload
    parts_wire, digest = seal_parts(
        IDENTITY, kind="chunk", swarm_id=SWARM, seq=9, policy_version=1,
        payload_parts=(payload[:100], memoryview(payload)[100:]),
    )  # fmt: skip
    read = decode_envelope(parts_wire, LIMITS, SWARM)
    assert isinstance(read.payload, memoryview) and read.signing_digest == digest


def test_zero_copy_reading_accepts_and_refuses_exactly_as_msgpack_does() -> None:
    """Byte flips in the head and around the payload, truncations and extensions of a
    large envelope: the zero-copy reading and the general decoder agree on every one
    (the same envelope, or the same reason)."""
    payload = encode_payload(Chunk(bytes(32), 0, 2, 60_000, bytes(30_000)))
    wire = sealed(kind="chunk", payload=payload).encode()
    hot = [*range(0, 120), *range(len(wire) - 80, len(wire))]
    cases = [wire, wire + b"\0", wire[:-1], wire[:-65], b"\x99" + wire[1:]]
    cases += byte_flips(wire, hot, 400, seed=5)
    small = Limits(max_bin_len=20_000)
    for case in cases:
        assert _outcome(case) == _general(case)
    assert _outcome(wire, small) == _general(wire, small) == ("refused", "oversize")
