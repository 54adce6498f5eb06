"""A rollout group's sampled token ids (protocol 5): round trips, uint32 encoding, and
every refusal a peer can provoke, each a `bad_payload` WireError."""

from __future__ import annotations

import struct

import pytest

from swarm.codec import pack
from swarm.errors import WireError
from swarm.messages import RolloutBatch, RolloutGroup, decode_payload, encode_payload
from swarm.token_arrays import MAX_LOGPROB_TOKENS, pack_token_ids, unpack_token_ids
from tests.swarm.test_messages_logprobs import LIMITS
from tests.swarm.test_messages_logprobs import group as logprob_group


def group(**overrides: object) -> RolloutGroup:
    """`test_messages_logprobs.group` (logprobs of 2 and 1 tokens) with token ids."""
    return logprob_group(**{"token_ids": ((17, 2), (49151,)), **overrides})


def test_roundtrip_with_token_ids() -> None:
    bare = group(logprobs=(), model_family="", token_ids=())
    batch = RolloutBatch((group(), group(token_ids=()), bare))
    decoded = decode_payload("rollouts", encode_payload(batch), LIMITS)
    assert decoded == batch
    assert decoded.groups[0].token_ids == ((17, 2), (49151,))
    assert decoded.groups[1].token_ids == ()


def test_ids_travel_as_little_endian_uint32() -> None:
    g = group(logprobs=(), token_ids=((0,), (2**32 - 1, 151_643)))
    wire = g.to_wire()
    assert wire["token_ids"][1] == struct.pack("<2I", 2**32 - 1, 151_643)
    assert RolloutGroup.from_wire(wire) == g
    assert unpack_token_ids(pack_token_ids((5, 6, 7))) == (5, 6, 7)
    # Without token ids the key is absent: a protocol-4 group's keys.
    assert "token_ids" not in group(token_ids=()).to_wire()


def _with(**wire_overrides: object) -> dict:
    wire = group().to_wire()
    wire.update(wire_overrides)
    return wire


@pytest.mark.parametrize(
    "wire",
    [
        _with(token_ids=[struct.pack("<2I", 1, 2)]),  # one entry for two completions
        _with(token_ids=[b"\x01\x00\x00", struct.pack("<I", 1)]),  # not 4 bytes per id
        _with(token_ids=[[1, 2], [3]]),  # ints instead of bytes
        _with(token_ids="ids"),
        _with(token_ids=[struct.pack("<3I", 1, 2, 3), struct.pack("<I", 1)]),  # 3 ids, 2 logprobs
        _with(token_ids=[b"\x00" * 4 * (MAX_LOGPROB_TOKENS + 1), struct.pack("<I", 1)]),
        {k: v for k, v in _with().items() if k not in ("model_family", "logprobs")},  # no family
    ],
)
def test_bad_token_ids_are_refused(wire: dict) -> None:
    with pytest.raises(WireError) as err:
        decode_payload("rollouts", pack({"groups": [wire]}), LIMITS)
    assert err.value.reason == "bad_payload"


def test_constructor_refuses_what_the_wire_refuses() -> None:
    for bad in ({"token_ids": ((1,),)}, {"token_ids": ((1, 2), (-1,))},
                {"token_ids": ((1, 2), (True,))}, {"token_ids": ((1, 2), (2**32,))},
                {"token_ids": ((1, 2), (3, 4))}, {"model_family": "", "logprobs": ()}):  # fmt: skip
        with pytest.raises(WireError):
            group(**bad)
    # Without logprobs any length goes (the sender may send ids alone).
    assert group(logprobs=(), token_ids=((1, 2, 3), ())).token_ids == ((1, 2, 3), ())
