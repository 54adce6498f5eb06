"""The gossip target: `Gossip.accept` fed sequences of transport messages.

Part of the fuzz harness; `tests/swarm/fuzz_wire.py` says what it checks and how it runs.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import traceback
from collections import Counter
from functools import cache
from typing import Any

import msgpack

from gossip.chunking import sha256, split
from gossip.layer import Gossip, Received
from gossip.memory import MemoryNetwork, MemoryTransport
from swarm.codec import pack
from swarm.config.network import GossipConfig, MemoryTransportConfig, ScoringConfig
from swarm.envelope import Envelope, seal
from swarm.errors import WireError
from swarm.identity import Identity
from swarm.messages import (
    MAX_TEXT_CHARS,
    PAYLOAD_TYPES,
    Chunk,
    DeltaPacket,
    RolloutBatch,
    encode_payload,
)
from swarm.transport import TransportMessage, deltas_topic, peers_topic, rollouts_topic
from tests.swarm.fuzz.corpus import (
    _group,
    corpus_payloads,
    envelope_input,
    payload_input,
    wire_corpus,
)
from tests.swarm.fuzz.harness import (
    ATTACKERS,
    DEFAULT_TIME_LIMIT_S,
    FAMILY,
    ME,
    SIGNERS,
    SWARM_ID,
    InvariantViolation,
    Outcome,
    Target,
)
from tests.swarm.fuzz.mutate import EDGE_INTS, mutate_bytes, mutate_value, random_bytes

# ---- gossip target ----------------------------------------------------------------------

_SMALL = {"max_envelope_bytes": 64 * 1024, "max_reassembly_bytes": 1 << 20, "seen_cache_size": 128}
GOSSIP_CONFIGS = (
    # peer scoring off, so one attacker's garbage does not get its later messages ignored
    GossipConfig(
        **_SMALL, reassembly_timeout_s=30.0, rate_limit_per_s=1000.0, rate_burst=100_000,
        scoring=ScoringConfig(enabled=False),
    ),
    GossipConfig(
        **_SMALL, reassembly_timeout_s=5.0, rate_limit_per_s=1.0, rate_burst=20,
        scoring=ScoringConfig(enabled=False),
    ),
    GossipConfig(**_SMALL, rate_burst=100_000),  # default scoring: attackers get ignored
)  # fmt: skip
CONFIG_WEIGHTS = (0.6, 0.15, 0.25)
MAX_SET_CHUNKS = 300
"""Chunk sets are cut into at most this many pieces (a sequence stays short)."""
TRANSPORT_SIZES = (1024, 2048, 16384)
TOPICS = (
    peers_topic(SWARM_ID),
    rollouts_topic(SWARM_ID),
    deltas_topic(SWARM_ID, FAMILY),
    deltas_topic(SWARM_ID, "other"),
    "free",
    rollouts_topic("another-swarm"),
)
TOPIC_OF = {"hello": TOPICS[0], "rollouts": TOPICS[1], "delta": TOPICS[2], "chunk": TOPICS[2]}


class ManualClock:
    """A clock the input moves (reassembly expiry and rate limits read it)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def fresh_gossip(transport_size: int, config_index: int) -> tuple[Gossip, ManualClock]:
    config = MemoryTransportConfig(network="fuzz", max_message_bytes=transport_size)
    transport = MemoryTransport(config, ME, network=MemoryNetwork("fuzz"))
    clock = ManualClock()
    gossip = Gossip(transport, ME, SWARM_ID, GOSSIP_CONFIGS[config_index], clock, initial_seq=1)
    return gossip, clock


@cache
def chunk_data_bytes(transport_size: int) -> int:
    return fresh_gossip(transport_size, 0)[0].chunk_data_bytes


class _Sequence:
    """Builds one `gossip` input: [transport_size, config_index, [[topic, data, via, dt]]]."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.flood = rng.random() < 0.03
        self.transport_size = 16384 if self.flood else rng.choice(TRANSPORT_SIZES)
        self.config_index = rng.choices(range(len(GOSSIP_CONFIGS)), CONFIG_WEIGHTS)[0]
        self.chunk_data = chunk_data_bytes(self.transport_size)
        self.messages: list[list[Any]] = []
        self.seqs = {a.peer_id: rng.choice((0, 1, rng.randrange(2**40))) for a in ATTACKERS}

    def encode(self) -> bytes:
        return pack([self.transport_size, self.config_index, self.messages])

    def next_seq(self, identity: Identity) -> int:
        seq = self.seqs[identity.peer_id]
        self.seqs[identity.peer_id] = seq + 1
        r = self.rng.random()
        if r < 0.005:  # rare: the floor of the seen cache then refuses this sender's rest
            return self.rng.choice((0, 2**63 - 1))
        return max(seq - 1, 0) if r < 0.03 else seq  # a reused seq now and then

    def add(self, topic: str, data: bytes, sender: Identity | None) -> None:
        rng = self.rng
        r = rng.random()
        if sender is None or r < 0.7:
            via = None
        elif r < 0.9:
            via = sender.peer_id
        else:
            via = rng.choice(ATTACKERS).peer_id
        dt = 0.0 if rng.random() < 0.95 else rng.choice((0.5, 4.0, 6.0, 31.0, 1000.0))
        if rng.random() < 0.1:
            topic = rng.choice(TOPICS)
        self.messages.append([topic, data, via, dt])

    def seal(self, identity: Identity, kind: str, payload: bytes, seq: int | None = None) -> bytes:
        return self.seal_envelope(identity, kind, payload, seq).encode()

    def seal_envelope(
        self, identity: Identity, kind: str, payload: bytes, seq: int | None = None
    ) -> Envelope:
        seq = self.next_seq(identity) if seq is None else seq
        round = self.rng.choice((0, 1, 5, 2**63 - 1))
        return seal(
            identity, kind=kind, swarm_id=SWARM_ID, seq=seq, policy_version=round, payload=payload
        )

    def big_payload(self, kind: str) -> bytes:
        rng = self.rng
        size = rng.choice((500, 3000, 3000, 20_000, 60_000)) if rng.random() < 0.95 else 70_000
        if kind == "rollouts":
            n = rng.randint(1, 8)
            text = "x" * min(size // n, MAX_TEXT_CHARS)
            group = _group("add", 1, 2, "3+4=", n)
            group = dataclasses.replace(group, completions=(text,) * n)
            return encode_payload(RolloutBatch((group,)))
        if kind == "delta":
            return encode_payload(DeltaPacket(FAMILY, 1, "topk", rng.randbytes(size), {}))
        return encode_payload(rng.choice(corpus_payloads()["hello"]))

    def noise(self) -> None:
        rng = self.rng
        sender = rng.choice(SIGNERS)
        bases = [e for e in wire_corpus().envelopes if e.sender == sender.peer_id]
        base = rng.choice(bases)
        self.add(TOPIC_OF[base.kind], envelope_input(rng, base), sender)

    def valid(self, identity: Identity | None = None) -> None:
        rng = self.rng
        identity = identity or rng.choice(ATTACKERS)
        kind = rng.choice(("hello", "rollouts", "delta"))
        payload = encode_payload(rng.choice(corpus_payloads()[kind]))
        self.add(TOPIC_OF[kind], self.seal(identity, kind, payload), identity)

    def chunk_set(self) -> None:
        """One chunked message, often with one set-level mutation."""
        rng = self.rng
        sender = rng.choice(ATTACKERS[:6])
        kind = rng.choice(("rollouts", "delta", "hello"))
        r = rng.random()
        payload = (
            self.big_payload(kind) if r < 0.55
            else payload_input(rng, kind) if r < 0.9
            else random_bytes(rng)
        )  # fmt: skip
        inner_kind = kind if rng.random() < 0.95 else "chunk"
        inner_signer = sender if rng.random() < 0.93 else rng.choice(ATTACKERS)
        sealed = self.seal_envelope(inner_signer, inner_kind, payload)
        inner, digest = sealed.encode(), sealed.signing_digest
        if rng.random() < 0.08:  # damage before hashing: reassembles, then fails to decode
            inner = mutate_bytes(rng, inner)
        if not inner:
            inner = b"\x00"
        size = self.chunk_data if rng.random() < 0.7 else rng.randint(1, 400)
        size = max(size, -(-len(inner) // MAX_SET_CHUNKS))
        chunks: list[Any] = split(inner, size, digest)
        mutation = rng.randrange(14)
        if mutation == 0 and len(chunks) > 1:
            del chunks[rng.randrange(len(chunks))]
        elif mutation == 1:
            chunks.insert(rng.randrange(len(chunks) + 1), rng.choice(chunks))
        elif mutation == 2:
            rng.shuffle(chunks)
        elif mutation == 3:  # corrupted data (each chunk validly signed by its sender)
            i = rng.randrange(len(chunks))
            chunks[i] = dataclasses.replace(chunks[i], data=mutate_bytes(rng, chunks[i].data))
        elif mutation == 4:  # two chunks' data swapped
            i, j = rng.randrange(len(chunks)), rng.randrange(len(chunks))
            di, dj = chunks[i].data, chunks[j].data
            chunks[i] = dataclasses.replace(chunks[i], data=dj)
            chunks[j] = dataclasses.replace(chunks[j], data=di)
        elif mutation == 5:  # a hostile number in one chunk
            i = rng.randrange(len(chunks))
            name = rng.choice(("index", "count", "total_size"))
            value = rng.choice((*EDGE_INTS, len(inner) + 1, len(chunks) + 1))
            chunks[i] = dataclasses.replace(chunks[i], **{name: value})
        elif mutation == 6:  # any field of one chunk, structure-aware
            i = rng.randrange(len(chunks))
            chunks[i] = mutate_value(rng, chunks[i].to_wire())
        elif mutation == 7:  # the same content named as another envelope
            fake = sha256(rng.randbytes(8))
            chunks = [dataclasses.replace(c, inner_digest=fake) for c in chunks]
        for i, chunk in enumerate(chunks):
            payload = encode_payload(chunk) if isinstance(chunk, Chunk) else pack(chunk)
            signer = sender
            if mutation == 8 and i == 0:  # one piece signed by someone else
                signer = rng.choice(ATTACKERS)
            data = self.seal(signer, "chunk", payload)
            if mutation == 9 and i == len(chunks) - 1:
                data = mutate_bytes(rng, data)
            topic = TOPIC_OF[kind]
            if mutation == 10 and i == len(chunks) - 1:
                topic = rng.choice(TOPICS)
            self.add(topic, data, signer)

    def flood_partials(self) -> None:
        """Many senders each start two big chunk sets and never finish them: fills the
        per-sender and the global reassembly bounds (20 x 60 KB > 1 MiB)."""
        rng = self.rng
        size = 12_000  # 5 pieces make 60 KB, under max_envelope_bytes
        for sender in ATTACKERS:
            for _ in range(2):
                content = sha256(rng.randbytes(8))
                for index in rng.sample(range(5), 4):
                    data = rng.randbytes(size)
                    chunk = Chunk(content, index, 5, 5 * size, data)
                    payload = encode_payload(chunk)
                    self.add(TOPICS[2], self.seal(sender, "chunk", payload), sender)

    def replay(self) -> None:
        if self.messages:
            topic, data, _, _ = self.rng.choice(self.messages)
            self.add(topic, data, None)

    def own(self) -> None:
        payload = encode_payload(self.rng.choice(corpus_payloads()["hello"]))
        data = seal(ME, kind="hello", swarm_id=SWARM_ID, seq=1, policy_version=1, payload=payload)
        self.add(TOPICS[0], data.encode(), ME)


def gossip_input(rng: random.Random) -> bytes:
    sequence = _Sequence(rng)
    if sequence.flood:
        sequence.flood_partials()
    steps = rng.choice((1, 2, 5, 10, 20, 40))
    for _ in range(steps):
        r = rng.random()
        if r < 0.30:
            sequence.noise()
        elif r < 0.45:
            sequence.valid()
        elif r < 0.75:
            sequence.chunk_set()
        elif r < 0.85:
            sequence.replay()
        elif r < 0.90:
            sequence.own()
        else:
            sequence.add(rng.choice(TOPICS), random_bytes(rng), None)
    return sequence.encode()


class _ErrorLog(logging.Handler):
    """Collects ERROR records (with tracebacks) of one logger while installed."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.records.append(text)


class _captured_errors:
    """Route a logger's errors into an `_ErrorLog` (not to stderr) for a while."""

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)
        self.handler = _ErrorLog()

    def __enter__(self) -> _ErrorLog:
        self.propagate = self.logger.propagate
        self.logger.addHandler(self.handler)
        self.logger.propagate = False
        return self.handler

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = self.propagate


def _message_violation(
    gossip: Gossip,
    received: Received | None,
    new: Counter[str],
    errors: _ErrorLog,
    via: str | None,
    elapsed: float,
    time_limit_s: float | None,
) -> tuple[str, str] | None:
    """(kind, detail) of the first invariant one `accept` call broke, or None."""
    if errors.records or new["internal_error"]:
        return "internal_error", "\n".join(errors.records) or "counted"
    if time_limit_s is not None and elapsed > time_limit_s:
        return "slow", f"accept took {elapsed:.3f} s > {time_limit_s} s"
    bound = gossip.config.max_reassembly_bytes
    if gossip.pending_reassembly_bytes > bound:
        return "reassembly_bound", f"{gossip.pending_reassembly_bytes} > {bound}"
    if sum(new.values()) > 1 or (received is not None and new):
        return "counted_twice", f"{dict(new)}, received {received is not None}"
    if received is not None:
        sender, kind = received.envelope.sender, received.envelope.kind
        if sender == ME.peer_id or via not in (None, sender):
            return "wrong_sender", f"accepted from {sender} via {via}"
        message = received.message
        if isinstance(message, Chunk) or not isinstance(message, PAYLOAD_TYPES[kind]):
            return "wrong_type", f"{kind} -> {type(message).__name__}"
    return None


def check_gossip(data: bytes, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S) -> Outcome:
    transport_size, config_index, messages = msgpack.unpackb(data, raw=False)
    gossip, clock = fresh_gossip(transport_size, config_index)
    accepted = refused = 0
    slowest = 0.0
    reasons: Counter[str] = Counter()
    with _captured_errors("gossip.layer") as errors:
        for i, (topic, wire, via, dt) in enumerate(messages):
            clock.t += dt
            expired = gossip.expire_partials()  # what `receive` does before each message
            if expired:
                reasons["(partial sets expired)"] += expired
            before = Counter(gossip.counters.dropped)
            t0 = time.thread_time()
            received = gossip.accept(TransportMessage(topic, wire, via))
            elapsed = time.thread_time() - t0
            new = gossip.counters.dropped - before
            slowest = max(slowest, elapsed)
            violation = _message_violation(
                gossip, received, new, errors, via, elapsed, time_limit_s
            )
            if violation is not None:
                done = Outcome(accepted, refused, dict(reasons))
                raise InvariantViolation(violation[0], f"message {i}: {violation[1]}", done)
            if received is not None:
                accepted += 1
                reasons[f"(accepted {received.envelope.kind})"] += 1
            elif new:
                refused += 1
                reasons.update(new)
            else:
                accepted += 1
                reasons["(chunk held)"] += 1
    return Outcome(accepted, refused, dict(reasons), slowest)


def gossip_target(time_limit_s: float) -> Target:
    return Target(
        name="gossip",
        doc="Gossip.accept over a memory transport; one input = one transport message",
        generate=gossip_input,
        check=lambda data: check_gossip(data, time_limit_s),
        refusal=WireError,
        time_limit_s=None,
        note="per message",
    )
