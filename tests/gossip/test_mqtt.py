"""MQTT transport: three real OS processes through a real mosquitto broker.

Every message from each peer reaches the two others with the true (signature-verified)
sender id, an 8 MB payload travels as gossip-layer chunks, a node never gets its own
publishes back (MQTT v5 no_local), and the peers survive a broker restart.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gossip.mqtt import MqttTransport
from swarm.config.network import ONE_MIB, MqttTransportConfig
from swarm.identity import Identity
from tests.gossip.tcp_proxy import DelayProxy

PeerProcess = Any  # conftest.PeerProcess (conftest modules are not imported by tests)
TIMEOUT_S = 30.0


def mqtt_peer(spawn: Any, broker: Any, name: str, *extra: str) -> PeerProcess:
    return spawn(
        name,
        "--transport",
        "mqtt",
        "--mqtt-host",
        broker.host,
        "--mqtt-port",
        str(broker.port),
        *extra,
    )


def wait_received(receiver: PeerProcess, sender: PeerProcess, count: int) -> list[dict]:
    # The sender reports "sent" after its publish returns, which may be after delivery.
    sender.wait_until(
        lambda _: len(sender.sent()) >= count, TIMEOUT_S, f"{sender.name} to send {count}"
    )
    receiver.wait_until(
        lambda _: len(receiver.received(sender.peer_id)) >= count,
        TIMEOUT_S,
        f"{count} messages from {sender.name} at {receiver.name}",
    )
    return receiver.received(sender.peer_id)


def wait_mesh_event(peer: PeerProcess, after: int, *, connected: bool) -> None:
    """Wait for a broker (dis)connection reported after event number `after`."""
    peer.wait_until(
        lambda events: any(
            e["event"] == "mesh" and bool(e["peers"]) == connected for e in events[after:]
        ),
        TIMEOUT_S,
        "reconnection" if connected else "disconnection",
    )


def payload_keys(events: list[dict]) -> set[tuple[int, str, int]]:
    return {(e["index"], e["sha256"], e["size"]) for e in events}


@pytest.mark.slow
def test_three_peers_through_broker_with_true_sender_and_8mb(
    spawn_peer: Any, mosquitto_broker: Any
) -> None:
    peers = [mqtt_peer(spawn_peer, mosquitto_broker, name) for name in "ABC"]
    for peer in peers:
        peer.ready()
        peer.wait_until(lambda _, p=peer: bool(p.mesh()), TIMEOUT_S, "broker connection")
    a, b, c = peers
    for i, peer in enumerate(peers):
        peer.command(f"send 20 2000 {i * 1000}")
    for receiver in peers:
        for sender in peers:
            if sender is receiver:
                continue
            got = wait_received(receiver, sender, 20)
            assert payload_keys(got) == payload_keys(sender.sent())
            assert len(got) == 20
            assert {e["sender"] for e in got} == {sender.peer_id}

    a.command("send 1 8000000 500")
    for receiver in (b, c):
        big = [e for e in wait_received(receiver, a, 21) if e["index"] == 500]
        sent = next(e for e in a.sent() if e["index"] == 500)
        assert [(e["size"], e["sha256"]) for e in big] == [(8_000_000, sent["sha256"])]

    stats = a.request("stats", "stats")
    assert stats["gossip"]["dropped"].get("own", 0) == 0, "own publishes came back"
    assert stats["transport"]["dropped_incoming"] == 0
    # A received only what B and C sent: 20 messages each, no echo of its own.
    assert stats["transport"]["received"] == 40


@pytest.mark.slow
def test_peers_reconnect_after_broker_restart(spawn_peer: Any, mosquitto_broker: Any) -> None:
    a = mqtt_peer(spawn_peer, mosquitto_broker, "A").ready()
    b = mqtt_peer(spawn_peer, mosquitto_broker, "B").ready()
    for peer in (a, b):
        peer.wait_until(lambda _, p=peer: bool(p.mesh()), TIMEOUT_S, "broker connection")
    a.command("send 2 100 0")
    wait_received(b, a, 2)

    marks = {peer.name: len(peer.events) for peer in (a, b)}
    mosquitto_broker.stop()
    for peer in (a, b):
        wait_mesh_event(peer, marks[peer.name], connected=False)
    marks = {peer.name: len(peer.events) for peer in (a, b)}
    mosquitto_broker.start()
    for peer in (a, b):
        wait_mesh_event(peer, marks[peer.name], connected=True)
    a.command("send 2 100 10")
    got = wait_received(b, a, 4)
    assert {e["index"] for e in got} == {0, 1, 10, 11}
    assert b.proc.poll() is None and a.proc.poll() is None


# ---- in-process checks -------------------------------------------------------------


def test_a_broker_not_up_yet_is_waited_for_and_oversize_is_refused(
    mosquitto_broker: Any, free_tcp_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        config = MqttTransportConfig(port=free_tcp_port)
        required = MqttTransport(config, Identity.generate())
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="Connection refused"):
            await required.start(wait_connected_s=1.0, require_connection=True)
        assert time.monotonic() - t0 < 5.0
        # A node's transport: no broker yet is a warning, and publishes are counted out.
        down = MqttTransport(config, Identity.generate())
        with caplog.at_level(logging.WARNING, logger="gossip.mqtt"):
            await down.start(wait_connected_s=0.5)
        assert "training alone meanwhile" in caplog.text
        await down.publish("swarm/x/peers", b"lost")
        assert down.stats()["dropped_outgoing_by_reason"]["disconnected"] == 1
        assert down.stats()["connect_failures_by_cause"]["unreachable"] >= 1
        await down.stop()

        config = MqttTransportConfig(
            host=mosquitto_broker.host, port=mosquitto_broker.port, max_message_bytes=64 * 1024
        )
        identity = Identity.generate()
        up = MqttTransport(config, identity)
        assert up.client_id.startswith(f"swarm-{identity.peer_id}-")
        await up.start()
        try:
            assert up.connected_peers()
            with pytest.raises(ValueError, match="max_message_bytes"):
                await up.publish("swarm/x/peers", b"x" * (64 * 1024 + 1))
            await up.subscribe("swarm/x/peers")
            await up.publish("swarm/x/peers", b"mine")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(up.receive(), 0.5)  # no_local: never our own
        finally:
            await up.stop()
        assert up.connected_peers() == []
        with pytest.raises(ConnectionError):
            await up.publish("swarm/x/peers", b"after stop")
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(up.receive(), 1.0)

    asyncio.run(main())


def test_receive_queue_is_bounded_and_counts_drops(mosquitto_broker: Any) -> None:
    async def main() -> None:
        config = MqttTransportConfig(
            host=mosquitto_broker.host, port=mosquitto_broker.port, max_queued_messages=5
        )
        sender = MqttTransport(config, Identity.generate())
        reader = MqttTransport(config, Identity.generate())
        await sender.start()
        await reader.start()
        try:
            await reader.subscribe("swarm/x/rollouts")
            for i in range(20):
                await sender.publish("swarm/x/rollouts", bytes([i]))
            deadline = time.monotonic() + TIMEOUT_S
            while reader.received + reader.dropped_incoming < 20:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert reader.received == 5 and reader.dropped_incoming == 15
            first = await reader.receive()
            assert first.data == b"\x00" and first.via is None
        finally:
            await sender.stop()
            await reader.stop()

    asyncio.run(main())


def test_receive_queue_is_bounded_in_bytes_and_oversize_stays_at_the_broker(
    mosquitto_broker: Any,
) -> None:
    async def main() -> None:
        broker = {"host": mosquitto_broker.host, "port": mosquitto_broker.port}
        sender = MqttTransport(
            MqttTransportConfig(**broker, max_message_bytes=4 * ONE_MIB), Identity.generate()
        )
        reader = MqttTransport(
            MqttTransportConfig(**broker, max_message_bytes=256 * 1024, max_queued_bytes=ONE_MIB),
            Identity.generate(),
        )
        await sender.start()
        await reader.start()
        try:
            topic = "swarm/x/rollouts"
            await reader.subscribe(topic)
            # Over the reader's packet limit: the broker never sends it (paho would buffer
            # all 3 MB before anything could refuse it).
            await sender.publish(topic, b"\x01" * (3 * ONE_MIB))
            for i in range(10):
                await sender.publish(topic, bytes([i]) * 200_000)
            deadline = time.monotonic() + TIMEOUT_S
            while reader.received + reader.dropped_incoming < 10:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            stats = reader.stats()
            # 1 MiB holds five 200 kB messages (plus 512 B each), not six.
            assert (stats["received"], stats["dropped_incoming"]) == (5, 5)
            assert stats["dropped_incoming_by_reason"] == {"bytes_full": 5}
            assert 5 * 200_000 <= stats["queued_bytes"] <= ONE_MIB
            got = [await reader.receive() for _ in range(5)]
            assert [m.data[0] for m in got] == [0, 1, 2, 3, 4]
            assert reader.stats()["queued_bytes"] == 0
            assert reader.connected and reader.reconnects == 0
            await sender.publish(topic, b"after")
            message = await asyncio.wait_for(reader.receive(), TIMEOUT_S)
            assert message.data == b"after"
        finally:
            await sender.stop()
            await reader.stop()

    asyncio.run(main())


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_publishes_do_not_wait_for_each_puback_and_the_window_bounds_them(
    mosquitto_broker: Any,
) -> None:
    """With the broker's PUBACKs held back, `max_inflight_publishes` publishes still go
    out and return; the next one waits for a slot until the acknowledgements come."""
    topic = "swarm/x/rollouts"

    async def main() -> None:
        with DelayProxy(mosquitto_broker.host, mosquitto_broker.port) as proxy:
            config = MqttTransportConfig(
                host=proxy.host, port=proxy.port, max_inflight_publishes=4
            )
            sender = MqttTransport(config, Identity.generate())
            reader = MqttTransport(
                MqttTransportConfig(host=mosquitto_broker.host, port=mosquitto_broker.port),
                Identity.generate(),
            )
            await reader.start()
            await sender.start()
            try:
                await reader.subscribe(topic)
                proxy.pause_downstream()  # nothing from the broker reaches the sender
                for i in range(4):
                    await asyncio.wait_for(sender.publish(topic, b"%d" % i), TIMEOUT_S)
                fifth = asyncio.create_task(sender.publish(topic, b"4"))
                got = [await asyncio.wait_for(reader.receive(), TIMEOUT_S) for _ in range(4)]
                assert [m.data for m in got] == [b"0", b"1", b"2", b"3"]  # in call order
                await asyncio.sleep(0.3)
                assert not fifth.done()  # no slot: four publishes await their PUBACK
                assert sender.published == 0
                proxy.resume_downstream()
                await asyncio.wait_for(fifth, TIMEOUT_S)
                assert (await asyncio.wait_for(reader.receive(), TIMEOUT_S)).data == b"4"
                await _until(lambda: sender.published == 5, "5 PUBACKs")
                assert sender.stats()["dropped_outgoing"] == 0
            finally:
                await sender.stop()
                await reader.stop()

    asyncio.run(main())


def test_unacknowledged_publishes_are_counted_lost_on_a_cut_and_awaited_on_stop(
    mosquitto_broker: Any,
) -> None:
    """Publishes awaiting a PUBACK when the connection is cut are counted
    `connection_lost` (never raised, never hanging); the transport reconnects and
    publishes again; `stop` gives the PUBACKs still due a grace period."""
    topic = "swarm/x/rollouts"

    async def main() -> None:
        with DelayProxy(mosquitto_broker.host, mosquitto_broker.port) as proxy:
            config = MqttTransportConfig(host=proxy.host, port=proxy.port)
            sender = MqttTransport(config, Identity.generate())
            await sender.start()
            try:
                proxy.pause_downstream()
                for i in range(3):
                    await asyncio.wait_for(sender.publish(topic, b"%d" % i), TIMEOUT_S)
                proxy.drop_all()
                lost = sender.dropped_outgoing
                await _until(lambda: lost["connection_lost"] == 3, "3 publishes counted lost")
                proxy.resume_downstream()
                await _until(lambda: sender.connected, "the reconnection")
                await sender.publish(topic, b"again")
                await _until(lambda: sender.published == 1, "the PUBACK after reconnecting")

                proxy.pause_downstream()
                await sender.publish(topic, b"last words")
                threading.Timer(0.3, proxy.resume_downstream).start()
            finally:
                await sender.stop()  # waits for the last PUBACK (resumed after 0.3 s)
            assert sender.published == 2
            assert sum(sender.dropped_outgoing.values()) == 3

    asyncio.run(main())
