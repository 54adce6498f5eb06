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

from gossip.chunking import split
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


def _payloads() -> list[tuple[str, str, int, int, object]]:
    """(vector name, kind, seq, policy_version, message) of each vector. The two chunk
    vectors are the `delta` vector's envelope split in two, as the gossip layer splits
    an envelope too large for the transport."""
    group = RolloutGroup(
        TaskRef("add", 7, 3), "2+5=", ("<answer>7</answer>", "8"), (1.5, 0.0), "builtin:tiny", 4,
        (True, False), "f433a6096222", ((-0.25, -1.5, -0.125), (-2.0,)), ((27, 22, 2), (23,)),
    )  # fmt: skip
    hello = Hello(
        "builtin:tiny", "f433a6096222", 4, ("rollouts",), (("rounds", 9.0), ("reward", 0.25))
    )
    delta = DeltaPacket("f433a6096222", 4, "raw", b"\x00\x01", {})
    seq = 1_764_633_600_000_000  # microseconds since the epoch, as senders start
    inner = _seal("delta", seq + 2, 5, delta)
    data = inner.encode()
    chunks = split(data, -(-len(data) // 2), hashlib.sha256(inner.signed_bytes()).digest())
    return [
        ("hello", "hello", seq, 4, hello),
        ("rollouts", "rollouts", seq + 1, 4, RolloutBatch((group,))),
        ("delta", "delta", seq + 2, 5, delta),
        ("chunk-0", "chunk", seq + 3, 5, chunks[0]),
        ("chunk-1", "chunk", seq + 4, 5, chunks[1]),
    ]


def _seal(kind: str, seq: int, version: int, message: object) -> Envelope:
    return seal(Identity.from_seed(SEED), kind=kind, swarm_id=SWARM, seq=seq,
                policy_version=version, payload=encode_payload(message))  # fmt: skip


def render() -> str:
    identity = Identity.from_seed(SEED)
    blocks = []
    for name, kind, seq, version, message in _payloads():
        envelope = _seal(kind, seq, version, message)
        lines = [
            f"vector: {name}",
            f"kind: {kind}",
            f"private_key_seed: {SEED.hex()}",
            f"peer_id: {identity.peer_id}",
            f"swarm_id: {SWARM}",
            f"seq: {seq}",
            f"policy_version: {version}",
            f"payload: {bytes(envelope.payload).hex()}",
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
    assert [v["vector"] for v in documented] == ["hello", "rollouts", "delta", "chunk-0", "chunk-1"]
    assert (
        "\n\n".join(
            "```text\n" + "\n".join(f"{k}: {v}" for k, v in vector.items()) + "\n```"
            for vector in documented
        )
        == render()
    ), "docs/wire.md is stale: python -m tests.swarm.test_wire_vectors"


@pytest.mark.parametrize("index", range(5))
def test_each_vector_decodes_and_any_msgpack_encoding_of_it_verifies(index: int) -> None:
    vector = _documented()[index]
    wire = bytes.fromhex(vector["envelope"])
    envelope = decode_envelope(wire, LIMITS, SWARM)
    assert envelope.sender == vector["peer_id"] and envelope.seq == int(vector["seq"])
    assert envelope.kind == vector["kind"]
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


def test_the_chunk_vectors_carry_the_delta_vector_whole() -> None:
    """What an implementer reassembles: the chunks' data in index order is the inner
    envelope's bytes, and `inner_digest` is sha256 of that envelope's signing input."""
    vectors = {v["vector"]: v for v in _documented()}
    chunks = []
    for name in ("chunk-0", "chunk-1"):
        envelope = decode_envelope(bytes.fromhex(vectors[name]["envelope"]), LIMITS, SWARM)
        chunk = decode_payload("chunk", envelope.payload, LIMITS)
        assert isinstance(chunk, Chunk)
        chunks.append(chunk)
    inner = bytes.fromhex(vectors["delta"]["envelope"])
    assert [c.index for c in chunks] == [0, 1] and {c.count for c in chunks} == {2}
    assert b"".join(bytes(c.data) for c in chunks) == inner
    assert all(c.total_size == len(inner) for c in chunks)
    digest = hashlib.sha256(bytes.fromhex(vectors["delta"]["signing_input"])).digest()
    assert all(c.inner_digest == digest for c in chunks)


if __name__ == "__main__":
    print(render())
