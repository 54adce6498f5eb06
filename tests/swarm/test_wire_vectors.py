"""The test vectors in docs/wire.md: any implementation can check its envelopes
against them; this test checks ours (and that the doc is current).

Each vector is a fenced block of `name: hex-or-value` lines. Regenerate them with
`.venv/bin/python -m tests.swarm.test_wire_vectors` after a deliberate wire change.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import msgpack
import pytest

from swarm.codec import Limits
from swarm.envelope import Envelope, decode_envelope, seal
from swarm.errors import WireError
from swarm.identity import Identity
from swarm.messages import (
    Chunk,
    DeltaPacket,
    Hello,
    RolloutBatch,
    RolloutGroup,
    TaskRef,
    decode_payload,
    encode_payload,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire.md"
SWARM = "vectors"
SEED = bytes(range(32))
LIMITS = Limits(max_message_bytes=1 << 20)


def _payloads() -> list[tuple[str, int, int, object]]:
    """(kind, seq, policy_version, message) of each vector."""
    group = RolloutGroup(
        TaskRef("add", 7, 3), "2+5=", ("<answer>7</answer>", "8"), (1.5, 0.0), "builtin:tiny", 4,
        (True, False), "f433a6096222", ((-0.25, -1.5, -0.125), (-2.0,)),
    )  # fmt: skip
    data = b"part of a large envelope"
    chunk = Chunk(hashlib.sha256(b"whole").digest(), 0, 2, 48, data)
    hello = Hello(
        "builtin:tiny", "f433a6096222", 4, ("rollouts",), (("rounds", 9.0), ("reward", 0.25))
    )
    delta = DeltaPacket("f433a6096222", 4, "raw", b"\x00\x01", {})
    seq = 1_764_633_600_000_000  # microseconds since the epoch, as senders start
    return [
        ("hello", seq, 4, hello),
        ("rollouts", seq + 1, 4, RolloutBatch((group,))),
        ("delta", seq + 2, 5, delta),
        ("chunk", seq + 3, 5, chunk),
    ]


def render() -> str:
    identity = Identity.from_seed(SEED)
    blocks = []
    for kind, seq, version, message in _payloads():
        payload = encode_payload(message)
        envelope = seal(identity, kind=kind, swarm_id=SWARM, seq=seq, policy_version=version,
                        payload=payload)  # fmt: skip
        lines = [
            f"vector: {kind}",
            f"private_key_seed: {SEED.hex()}",
            f"peer_id: {identity.peer_id}",
            f"swarm_id: {SWARM}",
            f"seq: {seq}",
            f"policy_version: {version}",
            f"payload: {payload.hex()}",
            f"signing_input: {envelope.signed_bytes().hex()}",
            f"signature: {envelope.signature.hex()}",
            f"envelope: {envelope.encode().hex()}",
        ]
        blocks.append("```text\n" + "\n".join(lines) + "\n```")
    return "\n\n".join(blocks)


def _documented() -> list[dict[str, str]]:
    text = DOC.read_text()
    blocks = re.findall(r"```text\n(vector: .*?)\n```", text, re.S)
    return [dict(line.split(": ", 1) for line in block.splitlines()) for block in blocks]


def test_the_documented_vectors_are_what_we_produce() -> None:
    documented = _documented()
    assert [v["vector"] for v in documented] == ["hello", "rollouts", "delta", "chunk"]
    assert (
        "\n\n".join(
            "```text\n" + "\n".join(f"{k}: {v}" for k, v in vector.items()) + "\n```"
            for vector in documented
        )
        == render()
    ), "docs/wire.md is stale: python -m tests.swarm.test_wire_vectors"


@pytest.mark.parametrize("index", range(4))
def test_each_vector_decodes_and_any_msgpack_encoding_of_it_verifies(index: int) -> None:
    vector = _documented()[index]
    wire = bytes.fromhex(vector["envelope"])
    envelope = decode_envelope(wire, LIMITS, SWARM)
    assert envelope.sender == vector["peer_id"] and envelope.seq == int(vector["seq"])
    assert envelope.signed_bytes().hex() == vector["signing_input"]
    decode_payload(envelope.kind, envelope.payload, LIMITS)
    # Another encoder's choices (every int as uint64, strings as str32): same signature.
    fields = msgpack.unpackb(wire, raw=False)

    def wide(obj: object) -> bytes:
        if isinstance(obj, bool) or obj is None:
            return msgpack.packb(obj)
        if isinstance(obj, int):
            return b"\xcf" + obj.to_bytes(8, "big")
        if isinstance(obj, str):
            raw = obj.encode()
            return b"\xdb" + len(raw).to_bytes(4, "big") + raw
        return msgpack.packb(obj, use_bin_type=True)

    reencoded = b"\xdc" + len(fields).to_bytes(2, "big") + b"".join(wide(f) for f in fields)
    assert reencoded != wire
    assert decode_envelope(reencoded, LIMITS, SWARM) == envelope
    # A single changed payload byte is refused.
    tampered = Envelope(*fields[:6], envelope.payload[:-1] + b"\xff", envelope.signature)
    with pytest.raises(WireError) as refused:
        decode_envelope(tampered.encode(), LIMITS, SWARM)
    assert refused.value.reason == "bad_signature"


if __name__ == "__main__":
    print(render())
