"""The in-process transport: routing, bounds, registry and the delivery-policy hook."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from gossip.inbox import MESSAGE_OVERHEAD_BYTES
from gossip.memory import (
    MemoryMessage,
    MemoryNetwork,
    MemoryTransport,
    get_network,
    remove_network,
)
from swarm.config.network import MemoryTransportConfig
from swarm.identity import Identity
from swarm.transport import Transport


@pytest.fixture
def net_name(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"test-memory-{request.node.name}"
    remove_network(name)
    yield name
    remove_network(name)


def make(name: str, peer: str, max_bytes: int = 4096, queue_size: int = 16) -> MemoryTransport:
    config = MemoryTransportConfig(network=name, max_message_bytes=max_bytes)
    return MemoryTransport(config, peer, queue_size=queue_size)


async def started(*transports: MemoryTransport, topic: str | None = "t") -> None:
    for transport in transports:
        await transport.start()
        if topic is not None:
            await transport.subscribe(topic)


def test_is_a_transport(net_name: str) -> None:
    transport: Transport = make(net_name, "a")
    assert transport.max_message_bytes == 4096


def test_delivers_to_other_subscribers_only(net_name: str) -> None:
    async def main() -> None:
        a, b, c, d = (make(net_name, p) for p in "abcd")
        await started(a, b, c)
        await started(d, topic="other")
        await a.publish("t", b"hello")
        assert a.pending() == 0  # never back to the publisher
        assert d.pending() == 0  # not subscribed to "t"
        for receiver in (b, c):
            message = await asyncio.wait_for(receiver.receive(), 1)
            assert isinstance(message, MemoryMessage)
            assert (message.topic, message.data, message.via, message.source) == (
                "t",
                b"hello",
                None,
                "a",
            )
        assert a.network.published == 1
        assert a.network.routed == 2

    asyncio.run(main())


def test_order_is_preserved(net_name: str) -> None:
    async def main() -> None:
        a, b = make(net_name, "a"), make(net_name, "b")
        await started(a, b)
        for i in range(10):
            await a.publish("t", bytes([i]))
        assert [(await b.receive()).data for _ in range(10)] == [bytes([i]) for i in range(10)]

    asyncio.run(main())


def test_identity_gives_peer_id(net_name: str) -> None:
    identity = Identity.from_seed(b"\x07" * 32)
    config = MemoryTransportConfig(network=net_name)
    assert MemoryTransport(config, identity).peer_id == identity.peer_id


def test_publish_bounds(net_name: str) -> None:
    async def main() -> None:
        a = make(net_name, "a", max_bytes=1024)
        with pytest.raises(RuntimeError):
            await a.publish("t", b"x")  # not started
        await a.start()
        await a.publish("t", b"x" * 1024)
        with pytest.raises(ValueError):
            await a.publish("t", b"x" * 1025)
        with pytest.raises(TypeError):
            await a.publish("t", "text")  # type: ignore[arg-type]

    asyncio.run(main())


def test_full_queue_drops_and_counts(net_name: str) -> None:
    async def main() -> None:
        a, b = make(net_name, "a"), make(net_name, "b", queue_size=3)
        await started(a, b)
        for i in range(5):
            await a.publish("t", bytes([i]))
        assert b.pending() == 3
        assert b.drops["queue_full"] == 2
        assert b.delivered == 3
        assert [(await b.receive()).data for _ in range(3)] == [b"\x00", b"\x01", b"\x02"]

    asyncio.run(main())


def test_stop_detaches_and_clears(net_name: str) -> None:
    async def main() -> None:
        a, b = make(net_name, "a"), make(net_name, "b")
        await started(a, b)
        assert a.connected_peers() == ["b"]
        await a.publish("t", b"1")
        await b.stop()
        assert b.pending() == 0
        assert a.connected_peers() == []
        assert b.connected_peers() == []
        await a.publish("t", b"2")
        await b.start()  # restart: subscriptions kept, old messages gone
        await a.publish("t", b"3")
        assert (await b.receive()).data == b"3"
        assert b.pending() == 0

    asyncio.run(main())


def test_duplicate_peer_id_refused(net_name: str) -> None:
    async def main() -> None:
        await make(net_name, "a").start()
        with pytest.raises(ValueError, match="already"):
            await make(net_name, "a").start()

    asyncio.run(main())


def test_registry_by_name(net_name: str) -> None:
    network = get_network(net_name)
    assert get_network(net_name) is network
    assert make(net_name, "a").network is network
    remove_network(net_name)
    assert get_network(net_name) is not network


def test_explicit_network_object() -> None:
    async def main() -> None:
        network = MemoryNetwork("private")
        config = MemoryTransportConfig(network="ignored-name")
        a = MemoryTransport(config, "a", network=network)
        b = MemoryTransport(config, "b", network=network)
        await started(a, b)
        await a.publish("t", b"x")
        assert (await b.receive()).data == b"x"
        assert [t.peer_id for t in network.transports()] == ["a", "b"]

    asyncio.run(main())


def test_injected_policy_can_delay_and_drop(net_name: str) -> None:
    """The link-model hook: the policy decides if and when `dst.enqueue` happens."""
    held: list[tuple[MemoryTransport, MemoryTransport, str, bytes]] = []

    def policy(src: MemoryTransport, dst: MemoryTransport, topic: str, data: bytes) -> None:
        if data.startswith(b"drop"):
            return
        held.append((src, dst, topic, data))

    async def main() -> None:
        network = get_network(net_name)
        network.set_policy(policy)
        a, b = make(net_name, "a"), make(net_name, "b")
        await started(a, b)
        await a.publish("t", b"drop me")
        await a.publish("t", b"later")
        assert b.pending() == 0
        assert [h[3] for h in held] == [b"later"]
        src, dst, topic, data = held.pop()
        assert dst.enqueue(topic, data, source=src.peer_id)
        message = await b.receive()
        assert (message.data, message.source) == (b"later", "a")
        network.set_policy(None)
        await a.publish("t", b"now")
        assert (await b.receive()).data == b"now"

    asyncio.run(main())


def test_subclass_can_override_deliver(net_name: str) -> None:
    class Reversing(MemoryNetwork):
        def deliver(
            self, src: MemoryTransport, dst: MemoryTransport, topic: str, data: bytes
        ) -> None:
            dst.enqueue(topic, data[::-1], source=src.peer_id)

    async def main() -> None:
        network = Reversing("rev")
        config = MemoryTransportConfig(network="rev")
        a = MemoryTransport(config, "a", network=network)
        b = MemoryTransport(config, "b", network=network)
        await started(a, b)
        await a.publish("t", b"abc")
        assert (await b.receive()).data == b"cba"

    asyncio.run(main())


def test_enqueue_refuses_stopped_or_unsubscribed(net_name: str) -> None:
    async def main() -> None:
        b = make(net_name, "b")
        assert not b.enqueue("t", b"x", source="a")
        assert b.drops["not_running"] == 1
        await b.start()
        assert not b.enqueue("t", b"x", source="a")
        assert b.drops["not_subscribed"] == 1
        await b.subscribe("t")
        assert b.enqueue("t", b"x", source="a")

    asyncio.run(main())


def test_queue_is_bounded_in_bytes_too(net_name: str) -> None:
    async def main() -> None:
        a = make(net_name, "a", max_bytes=4096)
        config = MemoryTransportConfig(
            network=net_name, max_message_bytes=4096, max_queued_bytes=10_000
        )
        b = MemoryTransport(config, "b", queue_size=100)
        await started(a, b)
        for i in range(5):
            await a.publish("t", bytes([i]) * 3000)  # 3512 bytes charged each
        assert b.pending() == 2 and b.drops["queue_full"] == 3
        assert b.queued_bytes == 2 * (3000 + MESSAGE_OVERHEAD_BYTES)
        assert (await b.receive()).data[0] == 0
        await a.publish("t", b"\x09" * 3000)
        assert [(await b.receive()).data[0] for _ in range(2)] == [1, 9]
        assert b.queued_bytes == 0
        # A message larger than the byte bound still gets through an empty queue.
        big = MemoryTransportConfig(
            network=net_name, max_message_bytes=50_000, max_queued_bytes=10_000
        )
        c = MemoryTransport(big, "c")
        await started(c)
        await c.publish("t", b"x" * 20_000)
        assert b.pending() == 1 and (await b.receive()).data == b"x" * 20_000

    asyncio.run(main())


def test_deliver_now_is_enqueue_then_receive(net_name: str) -> None:
    """Same messages, drops, delivered count and queue state as `enqueue` followed by
    `receive`, whether the queue is empty (the shortcut) or not (the queue is used)."""

    async def main() -> None:
        config = MemoryTransportConfig(
            network=net_name, max_message_bytes=50_000, max_queued_bytes=10_000
        )
        plain, quick = (MemoryTransport(config, peer, queue_size=2) for peer in ("p", "q"))

        def run_now(coro: Any) -> Any:
            with pytest.raises(StopIteration) as stop:
                coro.send(None)  # a receive from a non-empty queue never suspends
            return stop.value.value

        offers = [("t", b"early", "a")]  # before start: not_running
        results: dict[str, list[object]] = {"p": [], "q": []}

        def offer_all(items: list[tuple[str, bytes, str]]) -> None:
            for topic, data, source in items:
                if plain.enqueue(topic, data, source=source):
                    results["p"].append(run_now(plain.receive()))  # returns at once
                else:
                    results["p"].append(None)
                results["q"].append(quick.deliver_now(topic, data, source=source))

        offer_all(offers)
        for transport in (plain, quick):
            await transport.start()
            await transport.subscribe("t")
        offer_all([("u", b"other topic", "a"), ("t", b"x" * 20_000, "b"), ("t", b"y", "c")])
        # A backlog (queued by enqueue): deliver_now goes through the queue, oldest first.
        for transport in (plain, quick):
            assert transport.enqueue("t", b"backlog", source="d")
        offer_all([("t", b"z" * 9_000, "e"), ("t", b"w", "f")])
        assert results["p"] == results["q"]
        # z does not fit behind the backlog (queue_full); w does, and the backlog comes out.
        assert [m.data[:1] if m else None for m in results["q"]] == [
            None, None, b"x", b"y", None, b"b"
        ]  # fmt: skip
        assert isinstance(results["q"][2], MemoryMessage) and results["q"][2].source == "b"
        for attr in ("drops", "delivered", "queued_bytes"):
            assert getattr(plain, attr) == getattr(quick, attr), attr
        assert plain.pending() == quick.pending() == 1
        assert quick.drops == {"not_running": 1, "not_subscribed": 1, "queue_full": 1}

    asyncio.run(main())


def test_a_memory_transport_sees_peers_where_its_network_locates_them() -> None:
    network = MemoryNetwork("located")
    a = MemoryTransport(
        MemoryTransportConfig(network="located"), Identity.generate(), network=network
    )
    network.locate("peer-b", "sim-1")
    assert a.peer_network("peer-b") == "sim-1"
    assert a.peer_network("peer-c") is None  # never located: nobody can say where it is
    network.locate("peer-b", None)
    assert a.peer_network("peer-b") is None
