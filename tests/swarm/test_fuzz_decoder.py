"""Property tests: no input makes the wire decoders raise anything but WireError, and no
change to a signed envelope's bytes decodes to different content."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.codec import Limits, pack
from swarm.envelope import Envelope, decode_envelope, seal
from swarm.errors import WireError
from swarm.identity import Identity, peer_id_from_public_bytes
from swarm.messages import (
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
)

SWARM = "fuzz-swarm"
IDENTITY = Identity.from_seed(b"\x42" * 32)
LIMITS = Limits(
    max_message_bytes=1 << 16,
    max_str_len=1 << 12,
    max_bin_len=1 << 14,
    max_array_len=64,
    max_map_len=32,
    max_depth=6,
)
KINDS = sorted(PAYLOAD_TYPES)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EXAMPLES: list[Payload] = [
    Hello("tiny", "fam", 3, ("rollouts",)),
    RolloutBatch((RolloutGroup(TaskRef("add", 1, 2), "1+1=", ("2", "3"), (1.0, 0.0), "tiny", 4),)),
    DeltaPacket("fam", 7, "topk", b"\x01\x02" * 20, {"k": "v"}),
    Chunk(hashlib.sha256(b"x").digest(), 1, 3, 99, b"abc"),
]
ENVELOPES = [
    seal(
        IDENTITY, kind=m.KIND, swarm_id=SWARM, seq=i + 1, policy_version=5,
        payload=encode_payload(m),
    )
    for i, m in enumerate(EXAMPLES)
]

# Any msgpack-able value, nested a little: the shapes a hostile peer can send.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)


def only_wire_errors(fn: Any, *args: Any) -> Any:
    """Call `fn`; a WireError is fine (None), anything else fails the test."""
    try:
        return fn(*args)
    except WireError:
        return None


@FAST
@given(st.binary(max_size=2048))
def test_random_bytes_into_envelope_decoder(data: bytes) -> None:
    only_wire_errors(decode_envelope, data, LIMITS, SWARM)


@FAST
@given(st.sampled_from(KINDS), st.binary(max_size=2048))
def test_random_bytes_into_payload_decoders(kind: str, data: bytes) -> None:
    only_wire_errors(decode_payload, kind, data, LIMITS)


@FAST
@given(st.sampled_from(KINDS), values)
def test_random_values_into_payload_decoders(kind: str, value: Any) -> None:
    only_wire_errors(decode_payload, kind, pack(value), LIMITS)


@FAST
@given(st.lists(values, min_size=0, max_size=10))
def test_random_arrays_into_envelope_decoder(fields: list) -> None:
    only_wire_errors(decode_envelope, pack(fields), LIMITS, SWARM)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path inside a wire dict/list (where a hostile value can be put)."""
    paths = []
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    )
    for key, child in items:
        paths.append((*prefix, key))
        paths.extend(_paths(child, (*prefix, key)))
    return paths


@FAST
@given(st.sampled_from(EXAMPLES), st.data())
def test_valid_payload_with_one_field_replaced(message: Payload, data: st.DataObject) -> None:
    wire = copy.deepcopy(message.to_wire())
    path = data.draw(st.sampled_from(_paths(wire)))
    target = wire
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data.draw(values)
    decoded = only_wire_errors(decode_payload, message.KIND, pack(wire), LIMITS)
    if decoded is not None:
        assert isinstance(decoded, PAYLOAD_TYPES[message.KIND])


@FAST
@given(
    st.binary(min_size=32, max_size=32),
    st.binary(min_size=64, max_size=64),
    st.sampled_from(KINDS),
    st.binary(max_size=64),
)
def test_any_claimed_sender_and_signature(
    public: bytes, signature: bytes, kind: str, payload: bytes
) -> None:
    """Arbitrary keys (invalid points, small order...) and signatures never verify."""
    envelope = Envelope(1, kind, SWARM, peer_id_from_public_bytes(public), 1, 1, payload, signature)
    assert only_wire_errors(decode_envelope, envelope.encode(), LIMITS, SWARM) is None


def _assert_never_different(original: Envelope, data: bytes) -> None:
    decoded = only_wire_errors(decode_envelope, data, LIMITS, SWARM)
    assert decoded is None or decoded == original


@FAST
@given(st.sampled_from(ENVELOPES), st.data())
def test_flipped_bytes_never_verify_as_other_content(
    envelope: Envelope, data: st.DataObject
) -> None:
    raw = bytearray(envelope.encode())
    flips = data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=4))
    for index in flips:
        raw[index] ^= data.draw(st.integers(1, 255))
    _assert_never_different(envelope, bytes(raw))


@FAST
@given(st.sampled_from(ENVELOPES), st.data())
def test_truncated_envelopes_refused(envelope: Envelope, data: st.DataObject) -> None:
    raw = envelope.encode()
    cut = data.draw(st.integers(0, len(raw) - 1))
    assert only_wire_errors(decode_envelope, raw[:cut], LIMITS, SWARM) is None


@FAST
@given(st.sampled_from(ENVELOPES), st.binary(min_size=1, max_size=64))
def test_extended_envelopes_refused(envelope: Envelope, tail: bytes) -> None:
    assert only_wire_errors(decode_envelope, envelope.encode() + tail, LIMITS, SWARM) is None


@FAST
@given(st.sampled_from(ENVELOPES), st.data())
def test_inserted_or_deleted_bytes_never_verify_as_other_content(
    envelope: Envelope, data: st.DataObject
) -> None:
    raw = bytearray(envelope.encode())
    index = data.draw(st.integers(0, len(raw) - 1))
    if data.draw(st.booleans()):
        del raw[index]
    else:
        raw[index:index] = data.draw(st.binary(min_size=1, max_size=8))
    _assert_never_different(envelope, bytes(raw))


@FAST
@given(st.sampled_from(ENVELOPES), st.data())
def test_resigned_envelopes_with_hostile_payload_only_wire_errors(
    envelope: Envelope, data: st.DataObject
) -> None:
    """Correctly signed envelopes carrying garbage payloads: payload decoding stays safe."""
    payload = (
        pack(data.draw(values)) if data.draw(st.booleans()) else data.draw(st.binary(max_size=256))
    )
    hostile = seal(
        IDENTITY, kind=envelope.kind, swarm_id=SWARM, seq=9, policy_version=1, payload=payload
    )
    decoded = decode_envelope(hostile.encode(), LIMITS, SWARM)
    only_wire_errors(decode_payload, decoded.kind, decoded.payload, LIMITS)
