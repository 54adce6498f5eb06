"""Property tests: no sequence of hostile transport messages makes `Gossip.accept` raise,
hit an internal error, or exceed its memory bounds."""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossip.layer import Gossip
from gossip.memory import MemoryNetwork, MemoryTransport
from swarm.codec import pack
from swarm.config.network import GossipConfig, MemoryTransportConfig
from swarm.envelope import seal
from swarm.identity import Identity
from swarm.messages import PAYLOAD_TYPES, Chunk, Hello, encode_payload
from swarm.transport import TransportMessage, peers_topic

SWARM = "fuzz"
TOPICS = [peers_topic(SWARM), "free"]
ATTACKERS = [Identity.from_seed(bytes([100 + i]) * 32) for i in range(3)]
ME = Identity.from_seed(b"\x01" * 32)
CONFIG = GossipConfig(
    max_envelope_bytes=64 * 1024, max_reassembly_bytes=1 << 20, rate_burst=1000, seen_cache_size=128
)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONTENT = [hashlib.sha256(bytes([i])).digest() for i in range(3)]


class StillClock:
    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        return None


def fresh_gossip() -> Gossip:
    transport = MemoryTransport(
        MemoryTransportConfig(network="fuzz", max_message_bytes=4096), ME, network=MemoryNetwork()
    )
    return Gossip(transport, ME, SWARM, CONFIG, StillClock(), initial_seq=1)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=16)
    | st.binary(max_size=32)
)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


@st.composite
def chunk_payloads(draw: st.DrawFn) -> bytes:
    """Mostly well-formed chunks with hostile numbers, so reassembly state is exercised."""
    data = draw(st.binary(min_size=0, max_size=300))
    wire: dict[str, Any] = {
        "inner_digest": draw(st.sampled_from(CONTENT)),
        "index": draw(st.integers(0, 4)),
        "count": draw(st.integers(1, 5)),
        "total_size": draw(st.sampled_from([1, 300, 600, 1500, 1 << 20, 1 << 33])),
        "data": data,
    }
    if draw(st.integers(0, 9)) == 0:
        wire[draw(st.sampled_from(sorted(wire)))] = draw(values)
    return pack(wire)


@st.composite
def wire_messages(draw: st.DrawFn) -> TransportMessage:
    choice = draw(st.integers(0, 3))
    topic = draw(st.sampled_from(TOPICS))
    if choice == 0:
        return TransportMessage(topic, draw(st.binary(max_size=600)))
    identity = draw(st.sampled_from([*ATTACKERS, ME]))
    kind = draw(st.sampled_from([*sorted(PAYLOAD_TYPES), "chunk", "chunk"]))
    if kind == "chunk" and choice != 3:
        payload = draw(chunk_payloads())
    elif choice == 1:
        payload = pack(draw(values))
    elif choice == 2:
        payload = encode_payload(Hello("m", "f", draw(st.integers(0, 5))))
    else:
        payload = draw(st.binary(max_size=300))
    envelope = seal(
        identity,
        kind=kind,
        swarm_id=SWARM,
        seq=draw(st.integers(0, 20)),
        policy_version=draw(st.integers(0, 3)),
        payload=payload,
    )
    via = draw(st.sampled_from([None, None, identity.peer_id, ATTACKERS[0].peer_id]))
    return TransportMessage(topic, envelope.encode(), via)


@SETTINGS
@given(st.lists(wire_messages(), min_size=1, max_size=25))
def test_hostile_sequences_never_crash_or_overflow(messages: list[TransportMessage]) -> None:
    gossip = fresh_gossip()
    accepted = 0
    for message in messages:
        received = gossip.accept(message)
        if received is not None:
            accepted += 1
            assert received.envelope.sender != ME.peer_id
            assert isinstance(received.message, PAYLOAD_TYPES[received.envelope.kind])
            assert not isinstance(received.message, Chunk)
            assert message.via in (None, received.envelope.sender)
        assert gossip.pending_reassembly_bytes <= CONFIG.max_reassembly_bytes
    counters = gossip.counters
    assert "internal_error" not in counters.dropped
    assert counters.messages_in == len(messages)
    judged = sum(counters.dropped.values()) + accepted + counters.received["chunk"]
    # each message is accepted, stored as a chunk, or refused exactly once; only a chunk
    # that completes its set is both stored and then accepted or refused
    assert len(messages) <= judged <= len(messages) + counters.received["chunk"]


@SETTINGS
@given(st.binary(max_size=2000), st.sampled_from([None, ATTACKERS[1].peer_id]))
def test_random_bytes_never_crash(data: bytes, via: str | None) -> None:
    gossip = fresh_gossip()
    assert gossip.accept(TransportMessage("free", data, via)) is None
    assert sum(gossip.counters.dropped.values()) == 1
    assert "internal_error" not in gossip.counters.dropped
