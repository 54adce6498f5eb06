"""The corpus: valid encodings every target's inputs start from.

Part of the fuzz harness; `tests/swarm/fuzz_wire.py` says what it checks and how it runs.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from gossip.chunking import sha256, split
from swarm.codec import pack, unpack
from swarm.envelope import Envelope, seal
from swarm.messages import (
    Chunk,
    DeltaPacket,
    Hello,
    Payload,
    RolloutBatch,
    RolloutGroup,
    TaskRef,
    encode_payload,
)
from tests.swarm.fuzz.harness import BY_PEER, CORPUS_LIMITS, FAMILY, KINDS, SIGNERS, SWARM_ID
from tests.swarm.fuzz.mutate import hostile_value, mutate_bytes, mutate_value, random_bytes

# ---- corpus -----------------------------------------------------------------------------


def _group(source: str, seed: int, index: int, prompt: str, n: int) -> RolloutGroup:
    completions = tuple(f"<answer>{i}</answer>" if i % 2 else str(i) for i in range(n))
    rewards = tuple(float(i % 2) for i in range(n))
    return RolloutGroup(TaskRef(source, seed, index), prompt, completions, rewards, "tiny", 4)


@cache
def corpus_payloads() -> dict[str, tuple[Payload, ...]]:
    """Valid payloads of every kind, from small to near their bounds."""
    inner = seal(
        SIGNERS[0], kind="hello", swarm_id=SWARM_ID, seq=1, policy_version=1,
        payload=encode_payload(Hello("m", FAMILY, 1)),
    ).encode() * 3  # fmt: skip
    return {
        "hello": (
            Hello("tiny", FAMILY, 3, ("rollouts", "deltas")),
            Hello("", "", 0),
            Hello("m" * 256, "f" * 256, 2**63 - 1, tuple("c" * 64 for _ in range(32))),
        ),
        "rollouts": (
            RolloutBatch((_group("add", 1, 2, "3+4=", 2),)),
            RolloutBatch(
                (
                    _group("rg:basic_arithmetic", 0, 5, "What is 2+2?", 4),
                    _group("copy", 2**63 - 1, 2**63 - 1, "copy abc=\u00e9😀", 8),
                )
            ),
            RolloutBatch(()),
        ),
        "delta": (
            DeltaPacket(FAMILY, 7, "topk", bytes(range(256)) * 2, {"k": "v"}),
            DeltaPacket(FAMILY, 0, "dense_fp16", b"", {}),
            DeltaPacket("other", 2**63 - 1, "x" * 64, b"\x00" * 40, {"a" * 256: "b" * 4096}),
        ),
        "chunk": (*split(inner, 97, sha256(inner))[:3], Chunk(b"\x00" * 32, 0, 1, 1, b"")),
    }


@dataclass(frozen=True)
class WireCorpus:
    envelopes: tuple[Envelope, ...]
    envelope_bytes: tuple[bytes, ...]
    payload_bytes: dict[str, tuple[bytes, ...]]
    payload_values: dict[str, tuple[Any, ...]]
    all_payload_bytes: tuple[bytes, ...]


@cache
def wire_corpus() -> WireCorpus:
    payloads = corpus_payloads()
    envelopes = []
    for i, (kind, messages) in enumerate(sorted(payloads.items())):
        for j, message in enumerate(messages):
            signer = SIGNERS[(i + j) % len(SIGNERS)]
            seq, rnd = (2**63 - 1, 2**63 - 1) if j == 2 else (10 * i + j + 1, 5)
            envelopes.append(
                seal(signer, kind=kind, swarm_id=SWARM_ID, seq=seq, policy_version=rnd,
                     payload=encode_payload(message))
            )  # fmt: skip
    payload_bytes = {k: tuple(encode_payload(m) for m in ms) for k, ms in payloads.items()}
    # the structure-aware mutations start from values decoded by swarm.codec itself
    values = {k: tuple(unpack(b, CORPUS_LIMITS) for b in bs) for k, bs in payload_bytes.items()}
    return WireCorpus(
        envelopes=tuple(envelopes),
        envelope_bytes=tuple(e.encode() for e in envelopes),
        payload_bytes=payload_bytes,
        payload_values=values,
        all_payload_bytes=tuple(b for bs in payload_bytes.values() for b in bs),
    )


def payload_input(rng: random.Random, kind: str) -> bytes:
    """A mutated payload of `kind` (or another kind's, or garbage)."""
    corpus = wire_corpus()
    r = rng.random()
    if r < 0.50:
        return pack(mutate_value(rng, rng.choice(corpus.payload_values[kind])))
    if r < 0.80:
        base = rng.choice(corpus.payload_bytes[kind])
        return mutate_bytes(rng, base, corpus.all_payload_bytes)
    if r < 0.86:
        other = rng.choice(corpus.payload_values[rng.choice(KINDS)])
        return pack(other if rng.random() < 0.5 else mutate_value(rng, other))
    if r < 0.94:
        return pack(hostile_value(rng))
    return random_bytes(rng)


def _resign(fields: list[Any]) -> list[Any]:
    """Fields with a valid signature by the identity their sender field names, if any."""
    signer = BY_PEER.get(fields[3]) if isinstance(fields[3], str) else None
    if signer is None:
        return fields
    try:
        signing_input = Envelope(*fields[:7]).signed_bytes()
    except (struct.error, AttributeError, TypeError, ValueError, UnicodeError):
        return fields  # outside the wire's types or ranges: nothing can sign it
    return [*fields[:7], signer.sign(signing_input)]


def envelope_input(rng: random.Random, base: Envelope | None = None) -> bytes:
    """A hostile envelope: garbage, mutated bytes, mutated fields or a re-signed payload."""
    corpus = wire_corpus()
    base = base if base is not None else rng.choice(corpus.envelopes)
    r = rng.random()
    if r < 0.06:
        return random_bytes(rng)
    if r < 0.10:
        return pack(hostile_value(rng))
    if r < 0.32:  # byte damage to a signed envelope: dies at the signature check at best
        return mutate_bytes(rng, base.encode(), corpus.envelope_bytes)
    if r < 0.50:  # fields of another type or value, mostly re-signed
        fields: Any = mutate_value(
            rng, [base.version, base.kind, base.swarm_id, base.sender, base.seq,
                  base.policy_version, base.payload, base.signature],
        )  # fmt: skip
        if isinstance(fields, list) and len(fields) == 8 and rng.random() < 0.8:
            fields = _resign(fields)
        return pack(fields)
    # a mutated payload, validly signed: reaches the payload decoder
    kind = base.kind if rng.random() < 0.92 else rng.choice((*KINDS, "bogus"))
    signer = BY_PEER[base.sender]
    envelope = seal(
        signer,
        kind=kind,
        swarm_id=SWARM_ID,
        seq=rng.choice((base.seq, 0, 2**63 - 1, rng.randrange(2**63))),
        policy_version=rng.choice((0, base.policy_version, 2**63 - 1)),
        payload=payload_input(rng, base.kind),
    )
    data = envelope.encode()
    return mutate_bytes(rng, data) if rng.random() < 0.05 else data
