"""A rollout group's sampler logprobs (protocol 4): round trips, float32 encoding, and
every refusal a peer can provoke, each a `bad_payload` WireError."""

from __future__ import annotations

import math
import struct

import pytest

from swarm import PROTOCOL_VERSION
from swarm.codec import Limits, pack
from swarm.errors import WireError
from swarm.messages import (
    RolloutBatch,
    RolloutGroup,
    decode_payload,
    encode_payload,
    pack_logprobs,
    unpack_logprobs,
)
from swarm.token_arrays import MAX_LOGPROB_TOKENS
from tests.swarm.test_messages import group as plain_group

LIMITS = Limits()


def group(**overrides: object) -> RolloutGroup:
    """`test_messages.group` with the protocol-4 fields set."""
    fields: dict = {
        "finished": (True, False),
        "model_family": "fam",
        "logprobs": ((-0.5, -0.25), (-3.0,)),
    }
    fields.update(overrides)
    return plain_group(**fields)


def test_protocol_is_5() -> None:
    assert PROTOCOL_VERSION == 5  # 4 added logprobs, 5 token ids (test_messages_token_ids)


def test_roundtrip_with_logprobs() -> None:
    batch = RolloutBatch((group(), group(logprobs=(), model_family="")))
    decoded = decode_payload("rollouts", encode_payload(batch), LIMITS)
    assert decoded == batch
    assert decoded.groups[0].logprobs == ((-0.5, -0.25), (-3.0,))
    assert decoded.groups[0].model_family == "fam"


def test_values_travel_as_little_endian_float32() -> None:
    g = group(logprobs=((-0.1,), (-1e-3, -20.0)))
    # Rounded to float32 on construction, so what is held is what peers receive.
    assert g.logprobs[0][0] == struct.unpack("<f", struct.pack("<f", -0.1))[0] != -0.1
    wire = g.to_wire()
    assert wire["logprobs"][0] == struct.pack("<f", -0.1)
    assert wire["logprobs"][1] == struct.pack("<2f", -1e-3, -20.0)
    assert RolloutGroup.from_wire(wire) == g
    assert unpack_logprobs(pack_logprobs(g.logprobs[1])) == g.logprobs[1]


def test_groups_without_logprobs_keep_the_protocol_3_keys() -> None:
    wire = group(logprobs=(), model_family="").to_wire()
    assert "logprobs" not in wire and "model_family" not in wire
    assert RolloutGroup.from_wire(wire).logprobs == ()
    # A family alone is allowed (the sender chose not to send logprobs).
    assert RolloutGroup.from_wire({**wire, "model_family": "fam"}).model_family == "fam"
    # An empty list means "not carried".
    assert RolloutGroup.from_wire({**wire, "logprobs": []}).logprobs == ()


def _with(**wire_overrides: object) -> dict:
    wire = group().to_wire()
    wire.update(wire_overrides)
    return wire


@pytest.mark.parametrize(
    "wire",
    [
        _with(logprobs=[struct.pack("<f", math.nan), b""]),
        _with(logprobs=[struct.pack("<f", math.inf), b""]),
        _with(logprobs=[struct.pack("<f", -math.inf), b""]),
        _with(logprobs=[struct.pack("<f", 0.5), b""]),  # a probability above 1
        _with(logprobs=[struct.pack("<f", -1.0)]),  # one entry for two completions
        _with(logprobs=[b"", b"", b""]),  # three for two
        _with(logprobs=[b"\x00\x00\x80", b""]),  # not 4 bytes a token
        _with(logprobs=[b"\x00" * (4 * MAX_LOGPROB_TOKENS + 4), b""]),  # too many tokens
        _with(logprobs=[[-1.0], [-1.0]]),  # floats, not bytes
        _with(logprobs=b"\x00\x00\x80\xbf"),  # not a list
        _with(model_family=7),
        {k: v for k, v in group().to_wire().items() if k != "model_family"},  # no family
        _with(model_family=""),
    ],
    ids=[
        "nan", "inf", "-inf", "positive", "too_few", "too_many", "ragged", "oversized",
        "floats", "not_a_list", "family_type", "no_family", "empty_family",
    ],
)  # fmt: skip
def test_bad_logprobs_refuse_the_group(wire: dict) -> None:
    with pytest.raises(WireError) as refused:
        RolloutGroup.from_wire(wire)
    assert refused.value.reason == "bad_payload"
    # The same through the codec, as a peer's envelope payload would arrive.
    with pytest.raises(WireError) as refused:
        decode_payload("rollouts", pack({"groups": [wire]}), LIMITS)
    assert refused.value.reason == "bad_payload"


def test_the_longest_allowed_entry_is_accepted() -> None:
    wire = _with(logprobs=[b"\x00\x00\x80\xbf" * MAX_LOGPROB_TOKENS, b""])  # -1.0 each
    assert RolloutGroup.from_wire(wire).logprobs[0] == (-1.0,) * MAX_LOGPROB_TOKENS


@pytest.mark.parametrize(
    "logprobs", [((0.1,), ()), ((math.nan,), ()), ((-1e39,), ()), ((-1.0,),), (("x",), ())]
)
def test_bad_logprobs_are_refused_at_construction(logprobs: tuple) -> None:
    with pytest.raises(WireError):
        group(logprobs=logprobs)


def test_logprobs_need_a_family_at_construction() -> None:
    with pytest.raises(WireError):
        group(model_family="")
