"""Hellos carry optional progress claims (for peers' dashboards) and an optional proof of
work on the key, strictly typed."""

from __future__ import annotations

import pytest

from swarm.codec import Limits, pack
from swarm.errors import WireError
from swarm.messages import Hello, decode_payload, encode_payload

LIMITS = Limits(max_message_bytes=1 << 16)


def test_progress_round_trips_and_is_optional() -> None:
    hello = Hello("m", "f", 3, (), (("rounds", 12.0), ("reward", 0.25), ("eval", 0.5)))
    assert decode_payload("hello", encode_payload(hello), LIMITS) == hello
    bare = Hello("m", "f", 3)
    assert "progress" not in bare.to_wire()
    assert decode_payload("hello", encode_payload(bare), LIMITS) == bare


@pytest.mark.parametrize(
    "progress", [{"rounds": "many"}, {"secret": 1.0}, {"reward": float("nan")}, [1.0]]
)
def test_bad_progress_is_refused(progress: object) -> None:
    wire = {**Hello("m", "f", 3).to_wire(), "progress": progress}
    with pytest.raises(WireError):
        decode_payload("hello", pack(wire), LIMITS)


def test_proof_of_work_round_trips_is_optional_and_strictly_typed() -> None:
    hello = Hello("m", "f", 3, (), (), work=2**64 - 1)
    assert decode_payload("hello", encode_payload(hello), LIMITS) == hello
    assert "work" not in Hello("m", "f", 3).to_wire()  # absent unless the swarm asks
    for bad in (-1, "7", 1.5, True):  # (2**64 and beyond: no msgpack int holds them)
        with pytest.raises(WireError):
            decode_payload("hello", pack({**Hello("m", "f", 3).to_wire(), "work": bad}), LIMITS)
