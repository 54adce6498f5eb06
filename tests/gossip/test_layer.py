"""The gossip layer end to end over the memory transport: delivery, chunking, and one
counted reason for every kind of hostile or broken input."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from gossip.chunking import split as split_with_digest
from gossip.layer import Gossip, Received, envelope_limits
from gossip.memory import MemoryTransport, remove_network
from swarm import PROTOCOL_VERSION
from swarm.codec import pack
from swarm.config.network import ONE_MIB, GossipConfig, MemoryTransportConfig
from swarm.envelope import Envelope, decode_envelope, seal
from swarm.identity import Identity
from swarm.messages import (
    Chunk,
    DeltaPacket,
    Hello,
    RolloutBatch,
    RolloutGroup,
    TaskRef,
    encode_payload,
)
from swarm.transport import TransportMessage, deltas_topic, peers_topic, rollouts_topic

SWARM = "layer-swarm"
PEERS = peers_topic(SWARM)
ROLLOUTS = rollouts_topic(SWARM)
DELTAS = deltas_topic(SWARM, "fam")
ALL_TOPICS = (PEERS, ROLLOUTS, DELTAS)
KIB = 1024
HELLO = Hello("tiny", "fam", 3, ("rollouts",))
BATCH = RolloutBatch(
    (RolloutGroup(TaskRef("add", 0, 1), "2+2=", ("4", "5"), (1.0, 0.0), "tiny", 3),)
)


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))


def ident(seed: int) -> Identity:
    return Identity.from_seed(bytes([seed]) * 32)


class Swarm:
    """One memory network holding gossip nodes and raw (spying or hostile) transports."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.clock = FakeClock()

    async def node(
        self,
        seed: int,
        *,
        config: GossipConfig | None = None,
        max_bytes: int = ONE_MIB,
        swarm_id: str = SWARM,
        topics: tuple[str, ...] = ALL_TOPICS,
    ) -> Gossip:
        identity = ident(seed)
        transport = MemoryTransport(
            MemoryTransportConfig(network=self.name, max_message_bytes=max_bytes), identity
        )
        gossip = Gossip(
            transport, identity, swarm_id, config or GossipConfig(), self.clock, initial_seq=1
        )
        await gossip.start()
        for topic in topics:
            await gossip.subscribe(topic)
        return gossip

    async def raw(self, peer: str, *, topics: tuple[str, ...] = ()) -> MemoryTransport:
        config = MemoryTransportConfig(network=self.name, max_message_bytes=16 * ONE_MIB)
        transport = MemoryTransport(config, peer, queue_size=4096)
        await transport.start()
        for topic in topics:
            await transport.subscribe(topic)
        return transport


@pytest.fixture
def swarm(request: pytest.FixtureRequest) -> Iterator[Swarm]:
    name = f"test-layer-{request.node.name}"
    remove_network(name)
    yield Swarm(name)
    remove_network(name)


def memory(gossip: Gossip) -> MemoryTransport:
    assert isinstance(gossip.transport, MemoryTransport)
    return gossip.transport


async def settle(gossip: Gossip) -> list[Received]:
    """Judge everything already queued for `gossip`, as `receive` would; return accepted."""
    transport = memory(gossip)
    accepted = []
    while transport.pending():
        message = await transport.receive()
        gossip.expire_partials()
        received = gossip.accept(message)
        if received is not None:
            accepted.append(received)
    return accepted


async def captured(spy: MemoryTransport) -> list[bytes]:
    out = []
    while spy.pending():
        out.append((await spy.receive()).data)
    return out


def hostile_seal(identity: Identity, kind: str, payload: bytes, seq: int = 1, **kw: Any) -> bytes:
    fields: dict = {"swarm_id": SWARM, "policy_version": 0}
    fields.update(kw)
    return seal(identity, kind=kind, seq=seq, payload=payload, **fields).encode()


# delivery --------------------------------------------------------------------------


def test_hello_and_rollouts_reach_every_other_node(swarm: Swarm) -> None:
    async def main() -> None:
        a, b, c = [await swarm.node(seed) for seed in (1, 2, 3)]
        sent = await a.publish(PEERS, HELLO, 4)
        await a.publish(ROLLOUTS, BATCH, 5)
        for receiver in (b, c):
            hello = await asyncio.wait_for(receiver.receive(), 2)
            assert (hello.topic, hello.message) == (PEERS, HELLO)
            assert hello.envelope.sender == a.peer_id
            assert hello.envelope.policy_version == 4
            assert hello.size_bytes == sent
            batch = await asyncio.wait_for(receiver.receive(), 2)
            assert (batch.topic, batch.message) == (ROLLOUTS, BATCH)
            assert batch.envelope.policy_version == 5
            assert batch.envelope.seq > hello.envelope.seq
            assert receiver.counters.received == {"hello": 1, "rollouts": 1}
            assert sum(receiver.counters.dropped.values()) == 0
        assert memory(a).pending() == 0  # the memory transport never echoes
        assert a.counters.bytes_out >= sent and a.counters.messages_out == 2
        assert a.counters.published == {"hello": 1, "rollouts": 1}

    run(main())


def test_receive_skips_refused_messages(swarm: Swarm) -> None:
    async def main() -> None:
        a, b = await swarm.node(1), await swarm.node(2)
        hostile = await swarm.raw("hostile")
        await hostile.publish(PEERS, b"garbage")
        await hostile.publish(PEERS, b"\x98" + b"\x00" * 7)
        await a.publish(PEERS, HELLO, 0)
        received = await asyncio.wait_for(b.receive(), 2)
        assert received.message == HELLO
        assert b.counters.dropped["malformed"] == 2
        assert b.counters.messages_in == 3

    run(main())


def test_own_messages_echoed_back_are_counted(swarm: Swarm) -> None:
    async def main() -> None:
        a, b = await swarm.node(1), await swarm.node(2)
        spy = await swarm.raw("spy", topics=(PEERS,))
        await a.publish(PEERS, HELLO, 0)
        (wire,) = await captured(spy)
        assert a.accept(TransportMessage(PEERS, wire)) is None
        assert a.counters.dropped == {"own": 1}
        assert a.counters.per_peer_drops == {}
        assert len(await settle(b)) == 1

    run(main())


def test_8mb_delta_travels_in_chunks_and_arrives_intact(swarm: Swarm) -> None:
    async def main() -> None:
        max_bytes = 256 * KIB
        a = await swarm.node(1, max_bytes=max_bytes)
        b = await swarm.node(2, max_bytes=max_bytes)
        c = await swarm.node(3, max_bytes=max_bytes)
        spy = await swarm.raw("spy", topics=(DELTAS,))
        tensors = random.Random(0).randbytes(8 * ONE_MIB)
        packet = DeltaPacket("fam", 12, "safetensors", tensors, {"note": "8 MB"})
        sent = await a.publish(DELTAS, packet, 9)
        wires = await captured(spy)
        assert len(wires) == a.counters.messages_out >= 32
        assert sum(len(w) for w in wires) == sent == a.counters.bytes_out
        assert max(len(w) for w in wires) <= max_bytes
        envelopes = [decode_envelope(w, envelope_limits(ONE_MIB), SWARM) for w in wires]
        assert {e.kind for e in envelopes} == {"chunk"}
        seqs = [e.seq for e in envelopes]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        for receiver in (b, c):
            received = await asyncio.wait_for(receiver.receive(), 5)
            assert received.message == packet
            assert received.envelope.kind == "delta"
            assert received.envelope.sender == a.peer_id
            assert received.envelope.policy_version == 9
            assert received.topic == DELTAS
            assert received.size_bytes > 8 * ONE_MIB
            assert receiver.counters.received == {"chunk": len(wires), "delta": 1}
            assert receiver.pending_reassembly_bytes == 0
            assert sum(receiver.counters.dropped.values()) == 0
        # the next message after a chunked one still gets a larger seq
        await a.publish(PEERS, HELLO, 9)
        hello = await asyncio.wait_for(b.receive(), 2)
        assert hello.envelope.seq > max(seqs)

    run(main())


def test_receive_lets_other_tasks_run_between_queued_messages(swarm: Swarm) -> None:
    """A backlog in the inbox is handed over without suspending; `receive` must still
    yield between messages, or the node's other tasks starve while a burst is judged."""

    async def main() -> None:
        a = await swarm.node(1)
        b = await swarm.node(2)
        for _ in range(20):
            await a.publish(PEERS, HELLO, 1)
        assert memory(b).pending() == 20
        turns = 0
        stop = asyncio.Event()

        async def other_task() -> None:
            nonlocal turns
            while not stop.is_set():
                turns += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(other_task())
        await asyncio.sleep(0)  # the ticker starts
        before = turns
        for _ in range(20):
            await b.receive()
        stop.set()
        await ticker
        assert turns - before >= 19  # one turn per message at least, not one per backlog

    run(main())


def test_publish_refuses_local_mistakes(swarm: Swarm) -> None:
    async def main() -> None:
        config = GossipConfig(max_envelope_bytes=64 * KIB)
        identity = ident(1)
        transport = MemoryTransport(MemoryTransportConfig(network=swarm.name), identity)
        a = Gossip(transport, identity, SWARM, config, swarm.clock, initial_seq=1)
        with pytest.raises(RuntimeError):
            await a.publish(PEERS, HELLO, 0)
        await a.start()
        with pytest.raises(ValueError):
            await a.publish(PEERS, split(b"x" * 10, 5)[0], 0)
        with pytest.raises(ValueError):
            await a.publish(PEERS, HELLO, -1)
        with pytest.raises(ValueError):
            await a.publish(PEERS, HELLO, True)
        with pytest.raises(ValueError, match="max_envelope_bytes"):
            await a.publish(DELTAS, DeltaPacket("fam", 0, "raw", b"x" * 70 * KIB), 0)
        assert a.counters.messages_out == 0

    run(main())


class TinyTransport(MemoryTransport):
    @property
    def max_message_bytes(self) -> int:
        return 400


def test_transport_too_small_for_chunks_refused(swarm: Swarm) -> None:
    identity = ident(1)
    transport = TinyTransport(MemoryTransportConfig(network=swarm.name), identity)
    with pytest.raises(ValueError, match="no room"):
        Gossip(transport, identity, "s" * 128, GossipConfig(), swarm.clock)
    Gossip(transport, identity, "s", GossipConfig(), swarm.clock)  # a short swarm id fits


def test_smallest_transport_still_chunks_correctly(swarm: Swarm) -> None:
    async def main() -> None:
        a = await swarm.node(1, max_bytes=1024)
        b = await swarm.node(2, max_bytes=1024)
        packet = DeltaPacket("fam", 0, "raw", bytes(range(256)) * 40)
        await a.publish(DELTAS, packet, 0)
        assert a.counters.messages_out > 10
        received = await settle(b)
        assert [r.message for r in received] == [packet]

    run(main())


# replays and duplicates ------------------------------------------------------------


def test_replayed_envelope_is_a_duplicate(swarm: Swarm) -> None:
    async def main() -> None:
        a, b = await swarm.node(1), await swarm.node(2)
        spy = await swarm.raw("spy", topics=(PEERS,))
        hostile = await swarm.raw("hostile")
        await a.publish(PEERS, HELLO, 0)
        (wire,) = await captured(spy)
        assert len(await settle(b)) == 1
        await hostile.publish(PEERS, wire)
        await hostile.publish(PEERS, wire)
        assert await settle(b) == []
        assert b.counters.dropped == {"duplicate": 2}
        assert b.counters.per_peer_drops == {}  # duplicates are no one's fault

    run(main())


def test_reencoded_replay_is_caught_by_sender_and_seq(swarm: Swarm) -> None:
    """Same signed fields, different bytes (non-canonical msgpack): still a duplicate."""

    async def main() -> None:
        a, b = await swarm.node(1), await swarm.node(2)
        spy = await swarm.raw("spy", topics=(PEERS,))
        hostile = await swarm.raw("hostile")
        await a.publish(PEERS, HELLO, 0)
        (wire,) = await captured(spy)
        envelope = decode_envelope(wire, envelope_limits(ONE_MIB), SWARM)
        assert wire[1] == PROTOCOL_VERSION  # positive fixint version
        reencoded = wire[:1] + b"\xcc" + bytes([PROTOCOL_VERSION]) + wire[2:]  # as uint8
        assert reencoded != wire
        assert decode_envelope(reencoded, envelope_limits(ONE_MIB), SWARM) == envelope
        await hostile.publish(PEERS, reencoded)  # after a's original
        assert len(await settle(b)) == 1
        assert b.counters.dropped == {"duplicate": 1}

    run(main())


def test_replayed_chunks_of_a_delivered_message_are_duplicates(swarm: Swarm) -> None:
    async def main() -> None:
        a = await swarm.node(1, max_bytes=64 * KIB)
        b = await swarm.node(2, max_bytes=64 * KIB)
        spy = await swarm.raw("spy", topics=(DELTAS,))
        hostile = await swarm.raw("hostile")
        await a.publish(DELTAS, DeltaPacket("fam", 0, "raw", b"d" * 200 * KIB), 0)
        wires = await captured(spy)
        assert len(await settle(b)) == 1
        for wire in wires:
            await hostile.publish(DELTAS, wire)
        assert await settle(b) == []
        assert b.counters.dropped == {"duplicate": len(wires)}
        assert b.pending_reassembly_bytes == 0

    run(main())


# refusals by the envelope decoder ---------------------------------------------------


def test_wrong_swarm_refused(swarm: Swarm) -> None:
    async def main() -> None:
        other = await swarm.node(1, swarm_id="other-swarm")
        b = await swarm.node(2)
        await other.publish(PEERS, HELLO, 0)  # same topic name, other swarm id
        assert await settle(b) == []
        assert b.counters.dropped == {"wrong_swarm": 1}

    run(main())


def test_tampered_signature_refused_and_not_blamed_on_claimed_sender(swarm: Swarm) -> None:
    async def main() -> None:
        a, b = await swarm.node(1), await swarm.node(2)
        hostile = await swarm.raw("hostile")
        envelope = seal(
            a.identity, kind="hello", swarm_id=SWARM, seq=5, policy_version=0,
            payload=encode_payload(HELLO),
        )
        forged = dataclasses.replace(envelope, payload=encode_payload(Hello("evil", "fam", 0)))
        await hostile.publish(PEERS, forged.encode())
        flipped = bytearray(envelope.signature)
        flipped[10] ^= 0x40
        await hostile.publish(
            PEERS, dataclasses.replace(envelope, signature=bytes(flipped)).encode()
        )
        assert await settle(b) == []
        assert b.counters.dropped == {"bad_signature": 2}
        assert a.peer_id not in b.counters.per_peer_drops

    run(main())


def test_garbage_refused(swarm: Swarm) -> None:
    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        rng = random.Random(1)
        for size in (0, 1, 7, 100, 5000):
            await hostile.publish(PEERS, rng.randbytes(size))
        await hostile.publish(PEERS, pack({"not": "an envelope"}))
        assert await settle(b) == []
        assert b.counters.dropped == {"malformed": 6}
        assert b.counters.bytes_in == 1 + 7 + 100 + 5000 + len(pack({"not": "an envelope"}))

    run(main())


def test_oversize_wire_message_refused(swarm: Swarm) -> None:
    async def main() -> None:
        b = await swarm.node(2, max_bytes=256 * KIB)
        hostile = await swarm.raw("hostile")
        attacker = ident(66)
        payload = encode_payload(DeltaPacket("fam", 0, "raw", b"x" * 300 * KIB))
        await hostile.publish(DELTAS, hostile_seal(attacker, "delta", payload))
        await hostile.publish(DELTAS, b"\x00" * (ONE_MIB + 1))
        assert await settle(b) == []
        assert b.counters.dropped == {"oversize": 2}

    run(main())


def test_whole_envelope_over_max_envelope_bytes_refused(swarm: Swarm) -> None:
    """A peer with a bigger transport limit cannot skip max_envelope_bytes by not chunking."""

    async def main() -> None:
        config = GossipConfig(max_envelope_bytes=64 * KIB)
        b = await swarm.node(2, config=config)
        hostile = await swarm.raw("hostile")
        attacker = ident(66)
        payload = encode_payload(DeltaPacket("fam", 0, "raw", b"x" * 100 * KIB))
        await hostile.publish(DELTAS, hostile_seal(attacker, "delta", payload))
        assert await settle(b) == []
        assert b.counters.dropped == {"oversize": 1}
        assert b.counters.per_peer_drops[attacker.peer_id] == {"oversize": 1}

    run(main())


def test_transport_authenticated_sender_must_match(swarm: Swarm) -> None:
    async def main() -> None:
        b = await swarm.node(2)
        attacker = ident(66)
        wire = hostile_seal(attacker, "hello", encode_payload(HELLO))
        assert b.accept(TransportMessage(PEERS, wire, via="12D3KooWsomeoneelse")) is None
        assert b.counters.dropped == {"sender_mismatch": 1}
        assert b.counters.per_peer_drops == {"12D3KooWsomeoneelse": {"sender_mismatch": 1}}
        accepted = b.accept(TransportMessage(PEERS, wire, via=attacker.peer_id))
        assert accepted is not None and accepted.envelope.sender == attacker.peer_id

    run(main())


def test_bad_payload_refused_and_blamed(swarm: Swarm) -> None:
    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        attacker = ident(66)
        bad_hello = dict(HELLO.to_wire(), policy_version=True)
        await hostile.publish(PEERS, hostile_seal(attacker, "hello", pack(bad_hello), seq=1))
        await hostile.publish(PEERS, hostile_seal(attacker, "hello", b"\xc1", seq=2))
        assert await settle(b) == []
        assert b.counters.dropped == {"bad_payload": 1, "malformed": 1}
        assert b.counters.per_peer_drops[attacker.peer_id] == {"bad_payload": 1, "malformed": 1}

    run(main())


def test_kind_must_match_topic(swarm: Swarm) -> None:
    async def main() -> None:
        a, b = await swarm.node(1), await swarm.node(2, topics=(*ALL_TOPICS, "free/topic"))
        await a.subscribe("free/topic")
        await a.publish(ROLLOUTS, HELLO, 0)
        await a.publish(DELTAS, DeltaPacket("other-family", 0, "raw", b"x"), 0)
        await a.publish(PEERS, HELLO, 0)
        await a.publish("free/topic", HELLO, 0)  # topics outside the naming: any kind
        received = await settle(b)
        assert [r.topic for r in received] == [PEERS, "free/topic"]
        assert b.counters.dropped == {"wrong_topic": 2}

    run(main())


# rate limits -----------------------------------------------------------------------


def test_flood_is_rate_limited_per_peer(swarm: Swarm) -> None:
    async def main() -> None:
        config = GossipConfig(rate_limit_per_s=2.0, rate_burst=5)
        flooder = await swarm.node(1)
        honest = await swarm.node(3)
        b = await swarm.node(2, config=config)
        for _ in range(20):
            await flooder.publish(PEERS, HELLO, 0)
        await honest.publish(PEERS, HELLO, 0)
        received = await settle(b)
        assert [r.envelope.sender for r in received] == [flooder.peer_id] * 5 + [honest.peer_id]
        assert b.counters.dropped == {"rate_limited": 15}
        assert b.counters.per_peer_drops[flooder.peer_id] == {"rate_limited": 15}
        swarm.clock.t += 1.5  # refills 3 tokens on the injected clock
        for _ in range(5):
            await flooder.publish(PEERS, HELLO, 0)
        assert len(await settle(b)) == 3
        assert b.counters.dropped == {"rate_limited": 17}

    run(main())


def test_rate_limited_message_is_not_remembered(swarm: Swarm) -> None:
    """A message refused for rate alone can still be accepted when delivered again later."""

    async def main() -> None:
        config = GossipConfig(rate_limit_per_s=1.0, rate_burst=1)
        a, b = await swarm.node(1), await swarm.node(2, config=config)
        spy = await swarm.raw("spy", topics=(PEERS,))
        hostile = await swarm.raw("hostile")
        await a.publish(PEERS, HELLO, 0)
        await a.publish(PEERS, HELLO, 1)
        second = (await captured(spy))[1]
        assert len(await settle(b)) == 1
        swarm.clock.t += 1
        await hostile.publish(PEERS, second)
        assert [r.envelope.policy_version for r in await settle(b)] == [1]

    run(main())


# chunk refusals --------------------------------------------------------------------


async def send_chunks(
    hostile: MemoryTransport,
    identity: Identity,
    chunks: list[Chunk],
    topic: str = DELTAS,
    first_seq: int = 100,
) -> None:
    for i, chunk in enumerate(chunks):
        await hostile.publish(
            topic, hostile_seal(identity, "chunk", encode_payload(chunk), seq=first_seq + i)
        )


def split(inner: bytes, size: int) -> list[Chunk]:
    """`inner` (an encoded envelope) cut into chunks naming its signing digest."""
    if not inner.startswith(b"\x98"):  # not an envelope: any name will do
        return split_with_digest(inner, size, bytes(32))
    digest = decode_envelope(inner, envelope_limits(1 << 24), SWARM).signing_digest
    return split_with_digest(inner, size, digest)


def inner_delta(identity: Identity, size: int, seq: int = 1) -> bytes:
    payload = encode_payload(DeltaPacket("fam", 0, "raw", b"z" * size))
    return hostile_seal(identity, "delta", payload, seq=seq)


def test_handmade_chunks_are_reassembled(swarm: Swarm) -> None:
    """The wire format is the documented one: another implementation's chunks work."""

    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("peer")
        other = ident(70)
        await send_chunks(hostile, other, list(reversed(split(inner_delta(other, 5000), 999))))
        (received,) = await settle(b)
        assert received.envelope.sender == other.peer_id
        assert isinstance(received.message, DeltaPacket)
        assert received.message.tensors == b"z" * 5000

    run(main())


def test_chunk_altered_after_signing_refused(swarm: Swarm) -> None:
    """A chunk whose data changed after its signer sealed it (in transit)."""

    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        signer = ident(66)
        chunks = split(inner_delta(signer, 5000), 1000)
        wires = [
            hostile_seal(signer, "chunk", encode_payload(c), seq=100 + i)
            for i, c in enumerate(chunks)
        ]
        at = wires[2].index(chunks[2].data)
        wires[2] = wires[2][:at] + b"Z" + wires[2][at + 1 :]
        for wire in wires:
            await hostile.publish(DELTAS, wire)
        assert await settle(b) == []
        assert b.counters.dropped == {"bad_signature": 1}
        assert signer.peer_id not in b.counters.per_peer_drops  # anyone could alter it
        # The rest waits for the missing chunk (until the reassembly timeout).
        assert b.pending_reassembly_bytes == sum(len(c.data) for c in chunks) - 1000

    run(main())


def test_a_signers_chunks_vouch_for_its_inner_envelope(swarm: Swarm) -> None:
    """The chunks' signatures cover every byte of the envelope they carry, so its own
    signature is not checked again: a signer whose inner envelope's signature or digest
    does not match (its chunks vouch for other bytes) has sent its own message, with
    those bytes, attributed to it alone."""

    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        signer = ident(66)
        chunks = split(inner_delta(signer, 5000), 1000)
        # Data changed before the chunk was signed: the inner signature no longer fits.
        altered = dataclasses.replace(chunks[2], data=b"Z" + chunks[2].data[1:])
        await send_chunks(hostile, signer, [*chunks[:2], altered, *chunks[3:]])
        (received,) = await settle(b)
        assert received.envelope.sender == signer.peer_id
        assert isinstance(received.message, DeltaPacket)
        assert received.message.tensors.count(b"Z") == 1
        # A set naming a digest that is not its envelope's: the same.
        lying = [
            dataclasses.replace(c, inner_digest=b"\x11" * 32)
            for c in split(inner_delta(signer, 3000, seq=2), 1000)
        ]
        await send_chunks(hostile, signer, lying, first_seq=200)
        (received,) = await settle(b)
        assert received.envelope.signing_digest == b"\x11" * 32
        assert b.counters.dropped == {}
        assert b.pending_reassembly_bytes == 0

    run(main())


def test_naming_another_signers_digest_blocks_nothing_of_theirs(swarm: Swarm) -> None:
    """An attacker that saw an honest set's first chunk races it with a small set of its
    own naming the same digest: the digest is the attacker's word, kept per sender, so
    the honest message is still accepted (a global digest would refuse it as seen)."""

    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        honest, attacker = ident(70), ident(66)
        honest_chunks = split(inner_delta(honest, 5000), 1000)
        digest = honest_chunks[0].inner_digest
        own = [
            dataclasses.replace(c, inner_digest=digest)
            for c in split(inner_delta(attacker, 10), 1000)
        ]
        await send_chunks(hostile, honest, honest_chunks[:1])
        await send_chunks(hostile, attacker, own)
        await send_chunks(hostile, honest, honest_chunks[1:], first_seq=101)
        received = await settle(b)
        assert [r.envelope.sender for r in received] == [attacker.peer_id, honest.peer_id]
        assert received[1].message.tensors == b"z" * 5000
        assert b.counters.dropped == {}

    run(main())


def test_inner_envelope_must_have_the_chunks_sender(swarm: Swarm) -> None:
    async def main() -> None:
        a = await swarm.node(1)
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        attacker = ident(66)
        # the attacker re-chunks an envelope a really signed, under its own chunk envelopes
        inner = inner_delta(a.identity, 3000, seq=77)
        await send_chunks(hostile, attacker, split(inner, 1000))
        assert await settle(b) == []
        assert b.counters.dropped == {"sender_mismatch": 1}
        assert b.counters.per_peer_drops[attacker.peer_id] == {"sender_mismatch": 1}

    run(main())


def test_nested_chunks_refused(swarm: Swarm) -> None:
    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        attacker = ident(66)
        innermost = split(inner_delta(attacker, 3000, seq=1), 1000)
        middle = hostile_seal(attacker, "chunk", encode_payload(innermost[0]), seq=2)
        await send_chunks(hostile, attacker, split(middle, 500))
        assert await settle(b) == []
        assert b.counters.dropped == {"nested_chunk": 1}

    run(main())


def test_chunked_message_over_max_envelope_bytes_refused(swarm: Swarm) -> None:
    async def main() -> None:
        b = await swarm.node(2, config=GossipConfig(max_envelope_bytes=64 * KIB))
        hostile = await swarm.raw("hostile")
        attacker = ident(66)
        chunks = split(inner_delta(attacker, 100 * KIB), 32 * KIB)
        await send_chunks(hostile, attacker, chunks)
        assert await settle(b) == []
        assert b.counters.dropped == {"oversize": len(chunks)}
        assert b.pending_reassembly_bytes == 0

    run(main())


def test_partial_chunk_set_expires(swarm: Swarm) -> None:
    async def main() -> None:
        timeout = 30.0
        a = await swarm.node(1, max_bytes=64 * KIB)
        config = GossipConfig(reassembly_timeout_s=timeout)
        b = await swarm.node(2, config=config, topics=(PEERS,))
        spy = await swarm.raw("spy", topics=(DELTAS,))
        hostile = await swarm.raw("relay")
        await a.publish(DELTAS, DeltaPacket("fam", 0, "raw", b"p" * 300 * KIB), 0)
        wires = await captured(spy)
        await b.subscribe(DELTAS)  # b missed the broadcast; a relay forwards it
        for wire in wires[:-1]:  # the last chunk is lost
            await hostile.publish(DELTAS, wire)
        assert await settle(b) == []
        held = b.pending_reassembly_bytes
        assert held > 250 * KIB
        swarm.clock.t += timeout / 2
        assert b.expire_partials() == 0
        swarm.clock.t += timeout
        # expiry happens inside receive(), before the next message is judged
        await a.publish(PEERS, HELLO, 0)
        received = await asyncio.wait_for(b.receive(), 2)
        assert received.message == HELLO
        assert b.counters.dropped == {"reassembly_expired": 1}
        assert b.pending_reassembly_bytes == 0
        assert b.counters.per_peer_drops == {}

    run(main())


def test_reassembly_memory_is_bounded(swarm: Swarm) -> None:
    async def main() -> None:
        config = GossipConfig(max_envelope_bytes=600 * KIB, max_reassembly_bytes=ONE_MIB)
        b = await swarm.node(2, config=config)
        hostile = await swarm.raw("hostile")
        attackers = [ident(60 + i) for i in range(4)]
        for n, attacker in enumerate(attackers):
            # every attacker sends all but the last chunk of a ~500 KiB message
            chunks = split(inner_delta(attacker, 500 * KIB, seq=n), 50 * KIB)
            await send_chunks(hostile, attacker, chunks[:-1])
        assert await settle(b) == []
        assert b.pending_reassembly_bytes <= ONE_MIB
        refused = b.counters.dropped["reassembly_full"]
        assert refused > 0
        assert b.counters.dropped == {"reassembly_full": refused}
        # an honest node's complete message still needs room: refused while full ...
        honest = await swarm.node(5, max_bytes=64 * KIB)
        await honest.publish(DELTAS, DeltaPacket("fam", 0, "raw", b"h" * 200 * KIB), 0)
        assert await settle(b) == []
        assert b.pending_reassembly_bytes <= ONE_MIB
        # ... and accepted once the stale partial sets expired
        swarm.clock.t += config.reassembly_timeout_s + 1
        assert b.expire_partials() >= 2
        assert b.pending_reassembly_bytes == 0
        await honest.publish(DELTAS, DeltaPacket("fam", 1, "raw", b"h" * 200 * KIB), 0)
        (received,) = await settle(b)
        assert received.envelope.sender == honest.peer_id

    run(main())


def test_snapshot_is_json(swarm: Swarm) -> None:
    async def main() -> None:
        a, b = await swarm.node(1), await swarm.node(2)
        a.penalize(b.peer_id, "bad_rollout")
        await a.publish(PEERS, HELLO, 0)
        await settle(b)
        snap = json.loads(json.dumps(b.snapshot()))
        assert snap["received"] == {"hello": 1}
        assert snap["bytes_in"] > 0 and snap["pending_reassembly_bytes"] == 0
        assert a.counters.per_peer_drops[b.peer_id] == {"bad_rollout": 1}
        assert a.snapshot()["top_blamed"] == {b.peer_id: {"bad_rollout": 1}}

    run(main())


def test_stop_stops_transport_and_forgets_partials(swarm: Swarm) -> None:
    async def main() -> None:
        b = await swarm.node(2)
        hostile = await swarm.raw("hostile")
        attacker = ident(66)
        await send_chunks(hostile, attacker, split(inner_delta(attacker, 3000), 1000)[:2])
        await settle(b)
        assert b.pending_reassembly_bytes == 2000
        await b.stop()
        assert not memory(b).running and not b.started
        assert b.pending_reassembly_bytes == 0

    run(main())


def test_envelope_type_is_the_swarm_one() -> None:
    assert Received.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert Envelope.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_message_with_more_chunks_than_the_seen_cache_holds(swarm: Swarm) -> None:
    """Forgetting early chunk seqs must not make the (older-seq) inner envelope a replay."""

    async def main() -> None:
        config = GossipConfig(seen_cache_size=128)
        a = await swarm.node(1, max_bytes=1024)
        b = await swarm.node(2, max_bytes=1024, config=config)
        packet = DeltaPacket("fam", 0, "raw", bytes(range(256)) * 800)
        await a.publish(DELTAS, packet, 0)
        assert a.counters.messages_out > 200
        received = await settle(b)
        assert [r.message for r in received] == [packet]
        assert sum(b.counters.dropped.values()) == 0

    run(main())
