"""libp2p GossipSub transport: real OS processes on 127.0.0.1, plus in-process checks.

The line topology A <-> B <-> C (A and C bootstrap only to B) proves multi-hop relay:
A and C are never connected, yet each receives everything the other publishes, with
the true sender id, including an 8 MB payload (chunked by the gossip layer, since one
GossipSub message carries at most ~1 MiB).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

import pytest

from gossip.libp2p import RPC_OVERHEAD_BYTES, Libp2pTransport
from swarm.config.network import Libp2pTransportConfig
from swarm.errors import ConfigError
from swarm.identity import Identity

LOCAL = "/ip4/127.0.0.1/tcp/0"
MESH_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 45.0


PeerProcess = Any  # conftest.PeerProcess (conftest modules are not imported by tests)


def libp2p_peer(spawn: Any, name: str, *extra: str) -> PeerProcess:
    return spawn(name, "--transport", "libp2p", "--heartbeat", "0.5", *extra)


def wait_mesh(peer: PeerProcess, *expected: str) -> None:
    peer.wait_until(
        lambda _: set(expected) <= set(peer.mesh()),
        MESH_TIMEOUT_S,
        f"{peer.name}'s mesh to include {len(expected)} peers",
    )


def wait_received(receiver: PeerProcess, sender: PeerProcess, count: int) -> list[dict]:
    # The sender reports "sent" after its publish returns, which may be after delivery.
    sender.wait_until(
        lambda _: len(sender.sent()) >= count, DELIVERY_TIMEOUT_S, f"{sender.name} to send {count}"
    )
    receiver.wait_until(
        lambda _: len(receiver.received(sender.peer_id)) >= count,
        DELIVERY_TIMEOUT_S,
        f"{count} messages from {sender.name} at {receiver.name}",
    )
    return receiver.received(sender.peer_id)


def assert_same_payloads(sent: list[dict], received: list[dict]) -> None:
    want = {(e["index"], e["sha256"], e["size"]) for e in sent}
    got = {(e["index"], e["sha256"], e["size"]) for e in received}
    assert got == want
    assert len(received) == len(sent), "duplicates were delivered"


@pytest.mark.slow
def test_line_topology_delivers_multi_hop_both_ways_with_true_sender(spawn_peer: Any) -> None:
    # Peer exchange off: A and C would otherwise find each other through B.
    line = ("--listen", LOCAL, "--no-peer-exchange")
    b = libp2p_peer(spawn_peer, "B", *line).ready()
    assert b.addrs and b.addrs[0].endswith(f"/p2p/{b.peer_id}")
    assert "/tcp/0/" not in b.addrs[0], "listen_addrs must carry the real port"
    a = libp2p_peer(spawn_peer, "A", *line, "--bootstrap", b.addrs[0])
    c = libp2p_peer(spawn_peer, "C", *line, "--bootstrap", b.addrs[0])
    a.ready()
    c.ready()
    wait_mesh(b, a.peer_id, c.peer_id)
    wait_mesh(a, b.peer_id)
    wait_mesh(c, b.peer_id)
    assert a.request("peers", "peers")["connected"] == [b.peer_id]
    assert c.request("peers", "peers")["connected"] == [b.peer_id]

    a.command("send 30 2000 0")
    c.command("send 30 2000 1000")
    got_c = wait_received(c, a, 30)
    got_a = wait_received(a, c, 30)
    assert_same_payloads([e for e in a.sent() if e["index"] < 1000], got_c)
    assert_same_payloads([e for e in c.sent() if e["index"] >= 1000], got_a)
    assert all(e["sender"] == a.peer_id for e in got_c)
    assert len(wait_received(b, a, 30)) == 30  # the relay receives too

    # 8 MB each way: chunked by the gossip layer, relayed by B, reassembled at the end.
    a.command("send 1 8000000 500")
    c.command("send 1 8000000 1500")
    big_at_c = [e for e in wait_received(c, a, 31) if e["index"] == 500]
    big_at_a = [e for e in wait_received(a, c, 31) if e["index"] == 1500]
    assert [(e["size"], e["sha256"]) for e in big_at_c] == [
        (8_000_000, next(e["sha256"] for e in a.sent() if e["index"] == 500))
    ]
    assert [(e["size"], e["sha256"]) for e in big_at_a] == [
        (8_000_000, next(e["sha256"] for e in c.sent() if e["index"] == 1500))
    ]
    # Still not directly connected: everything above went through B. So A sees B, on
    # this machine, and cannot say where C is (`node.trust` counts C as unlocated).
    peers = a.request(f"peers {c.peer_id}", "peers")
    assert peers["connected"] == [b.peer_id]
    assert peers["networks"] == {b.peer_id: "127.0.0.0/8", c.peer_id: None}
    stats = c.request("stats", "stats")
    assert stats["transport"]["dropped_incoming"] == 0
    assert stats["transport"]["outbound_refused"] == 0
    assert stats["gossip"]["dropped"].get("own", 0) == 0, "own publishes came back"
    # Both ends offer meshsub 1.2 (IDONTWANT) first: that is what C and B agreed on.
    assert stats["transport"]["meshsub_peers"] == {"/meshsub/1.2.0": 1}


@pytest.mark.slow
def test_bootstrap_peer_down_at_start_is_retried(spawn_peer: Any, free_tcp_port: int) -> None:
    """A node whose bootstrap peer is not up yet keeps running and connects once it is."""
    seed = Identity.generate().seed.hex()
    later = Identity.from_seed(bytes.fromhex(seed))
    port = free_tcp_port
    addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{later.peer_id}"
    early = libp2p_peer(spawn_peer, "early", "--listen", LOCAL, "--bootstrap", addr).ready()
    time.sleep(1.5)  # several failed dials (and the swarm's negative dial cache)
    assert early.proc.poll() is None
    late = libp2p_peer(
        spawn_peer, "late", "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--seed", seed
    ).ready()
    assert late.peer_id == later.peer_id
    wait_mesh(early, late.peer_id)
    late.command("send 3 100 0")
    assert len(wait_received(early, late, 3)) == 3


def test_a_bootstrap_address_naming_another_peer_id_says_who_answers(spawn_peer: Any) -> None:
    """Found by hand: a bootstrap peer that got a new key (or a mistyped /p2p/ part) was
    logged as "unreachable (SwarmDialAllFailedError: unable to connect ...)", which sends
    its user looking at firewalls. The node there answers, with another id: say so."""
    listener = libp2p_peer(spawn_peer, "listener", "--listen", LOCAL).ready()
    stale = listener.addrs[0].replace(listener.peer_id, Identity.generate().peer_id)
    dialer = libp2p_peer(spawn_peer, "dialer", "--bootstrap", stale).ready()
    said = f"the node at that address is {listener.peer_id}, not this peer: it has a new key"
    deadline = time.monotonic() + 20
    while said not in dialer.stderr_tail():
        assert time.monotonic() < deadline, dialer.stderr_tail()
        time.sleep(0.2)
    assert "SwarmDialAllFailedError" not in dialer.stderr_tail()


def test_a_restarted_sender_is_heard_at_once_after_publishing_faster_than_a_second(
    spawn_peer: Any,
) -> None:
    """py-libp2p numbers a host's pubsub messages from the wall clock in *seconds*, one
    per message, and peers drop as already seen (silently, for 120 s) any (sender, seqno)
    they saw. A node that published more messages than seconds passed, then restarted,
    re-used its own recent seqnos: its next messages were lost (found by hand: a peer used
    none of a restarted tiny-model node's groups for 40 s). Numbered from nanoseconds, as
    go-libp2p does, the new run's seqnos are fresh."""
    seed = Identity.generate().seed.hex()
    receiver = libp2p_peer(spawn_peer, "receiver", "--listen", LOCAL).ready()
    first = libp2p_peer(spawn_peer, "first", "--seed", seed, "--bootstrap", receiver.addrs[0])
    first.ready()
    wait_mesh(first, receiver.peer_id)
    first.command("send 300 100 0")  # in about a second: 300 seqnos ahead of the clock
    assert len(wait_received(receiver, first, 300)) == 300
    first.stop()
    again = libp2p_peer(spawn_peer, "again", "--seed", seed, "--bootstrap", receiver.addrs[0])
    again.ready()
    wait_mesh(again, receiver.peer_id)
    again.command("send 20 100 1000")
    again.wait_until(lambda _: len(again.sent()) >= 20, DELIVERY_TIMEOUT_S, "again to send")
    receiver.wait_until(
        lambda _: {e["index"] for e in receiver.received(again.peer_id)} >= set(range(1000, 1020)),
        DELIVERY_TIMEOUT_S,
        "the restarted sender's 20 messages at the receiver",
    )


# ---- in-process checks -------------------------------------------------------------


def test_limits_publish_errors_listen_addrs_and_fast_stop() -> None:
    async def main() -> None:
        identity = Identity.generate()
        config = Libp2pTransportConfig(listen=LOCAL, max_message_bytes=256 * 1024)
        transport = Libp2pTransport(config, identity)
        assert transport.max_message_bytes == 256 * 1024 - RPC_OVERHEAD_BYTES
        await transport.start()
        try:
            addrs = transport.listen_addrs()
            assert len(addrs) == 1 and addrs[0].startswith("/ip4/127.0.0.1/tcp/")
            assert addrs[0].endswith(f"/p2p/{identity.peer_id}")
            assert int(addrs[0].split("/")[4]) > 0
            assert transport.connected_peers() == []
            await transport.subscribe("swarm/x/peers")
            with pytest.raises(ValueError, match="max_message_bytes"):
                await transport.publish("swarm/x/peers", b"x" * (transport.max_message_bytes + 1))
            # Publishing with no peers is not an error (a node may run alone).
            await transport.publish("swarm/x/peers", b"alone")
        finally:
            t0 = time.monotonic()
            await transport.stop()
            assert time.monotonic() - t0 < 5.0
        with pytest.raises(ConnectionError):
            await transport.publish("swarm/x/peers", b"after stop")
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(transport.receive(), 1.0)

    asyncio.run(main())


def test_listen_failure_fails_start(free_tcp_port: int) -> None:
    async def main() -> None:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", free_tcp_port))
            busy.listen()
            listen = f"/ip4/127.0.0.1/tcp/{free_tcp_port}"
            transport = Libp2pTransport(Libp2pTransportConfig(listen=listen), Identity.generate())
            with pytest.raises(ConfigError, match="could not listen"):
                await transport.start()
            assert transport.connected_peers() == []

    asyncio.run(main())


def test_an_address_not_on_this_machine_is_a_config_error(free_tcp_port: int) -> None:
    """A typo'd or another machine's IP (203.0.113.0/24 is reserved for documentation)."""

    async def main() -> None:
        listen = f"/ip4/203.0.113.7/tcp/{free_tcp_port}"
        transport = Libp2pTransport(Libp2pTransportConfig(listen=listen), Identity.generate())
        with pytest.raises(ConfigError, match=r"not one of this machine's.*0\.0\.0\.0"):
            await transport.start()

    asyncio.run(main())


def test_a_second_node_on_a_taken_port_fails_start(free_tcp_port: int) -> None:
    """py-libp2p listens with SO_REUSEPORT, so without our probe a second node on the
    same address would listen too and take half of the first one's incoming dials."""

    async def main() -> None:
        listen = f"/ip4/127.0.0.1/tcp/{free_tcp_port}"
        first = Libp2pTransport(Libp2pTransportConfig(listen=listen), Identity.generate())
        await first.start()
        try:
            second = Libp2pTransport(Libp2pTransportConfig(listen=listen), Identity.generate())
            with pytest.raises(ConfigError, match="another process listens on that port") as e:
                await second.start()
            assert f"it is pid {os.getpid()} (" in str(e.value)  # the process holding it
        finally:
            await first.stop()
        again = Libp2pTransport(Libp2pTransportConfig(listen=listen), Identity.generate())
        await again.start()  # the port is free once its holder stopped
        await again.stop()

    asyncio.run(main())


def test_two_in_process_transports_exchange_max_size_and_bursts() -> None:
    """A burst beyond the library's 32-RPC queue and 10 msg/s limit arrives whole."""

    async def main() -> None:
        a_id, b_id = Identity.generate(), Identity.generate()
        a = Libp2pTransport(Libp2pTransportConfig(listen=LOCAL, heartbeat_interval_s=0.5), a_id)
        await a.start()
        b = Libp2pTransport(
            Libp2pTransportConfig(
                listen=LOCAL, bootstrap=a.listen_addrs(), heartbeat_interval_s=0.5
            ),
            b_id,
        )
        await b.start()
        try:
            topic = "swarm/x/rollouts"
            await a.subscribe(topic)
            await b.subscribe(topic)
            deadline = time.monotonic() + MESH_TIMEOUT_S
            while b_id.peer_id not in await a.mesh_peers(topic):
                assert time.monotonic() < deadline, "no mesh"
                await asyncio.sleep(0.05)
            assert a.connected_peers() == [b_id.peer_id]
            payloads = [bytes([i]) * 50_000 for i in range(100)]
            payloads.append(b"\xff" * a.max_message_bytes)
            for data in payloads:
                await a.publish(topic, data)
            got = []
            for _ in payloads:
                message = await asyncio.wait_for(b.receive(), DELIVERY_TIMEOUT_S)
                assert message.topic == topic
                assert message.via == a_id.peer_id
                got.append(message.data)
            assert sorted(got) == sorted(payloads)
            assert b.stats()["dropped_incoming"] == 0
            assert a.stats()["received"] == 0, "own publishes must not come back"
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(main())


def test_outbound_queue_bounds_bytes_and_reports_refusals_to_the_publisher() -> None:
    from libp2p.pubsub.pb import rpc_pb2

    from gossip import libp2p_queues as mod

    queue = mod.BoundedPriorityQueue(max_size=100, max_bytes=250_000, peer="peer-x")
    rpc = rpc_pb2.RPC(publish=[rpc_pb2.Message(data=b"x" * 100_000, topicIDs=["t"])])
    assert queue.push(rpc) and queue.push(rpc)
    assert queue.queued_bytes == 2 * rpc.ByteSize()
    assert not queue.has_room(100_000)
    refused: list[str] = []
    token = mod.refused_rpcs.set(refused)
    try:
        assert not queue.push(rpc)  # a third would exceed 250 kB
    finally:
        mod.refused_rpcs.reset(token)
    assert refused == ["peer-x"] and queue.refused == 1
    assert queue.pop() is rpc and queue.pop() is rpc and queue.pop() is None
    assert queue.queued_bytes == 0 and queue.has_room(100_000)


def test_equivocation_memory_is_bounded_and_still_detects() -> None:
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.pubsub.pb import rpc_pb2

    from gossip import libp2p_patches as mod

    router = mod.SwarmGossipSub(
        protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12
    )

    def msg(seq: int, data: bytes) -> rpc_pb2.Message:
        return rpc_pb2.Message(
            from_id=b"peer", seqno=seq.to_bytes(8, "big"), data=data, topicIDs=["t"]
        )

    assert router._check_equivocation(msg(1, b"a"))
    assert router._check_equivocation(msg(1, b"a"))  # the same message again is fine
    assert not router._check_equivocation(msg(1, b"b"))  # same seqno, other content
    for seq in range(2, mod._EQUIVOCATION_MEMORY + 100):
        router._check_equivocation(msg(seq, b"x" * 100))
    assert len(router._digests) == mod._EQUIVOCATION_MEMORY
    assert router.equivocation_detection == {}  # the library's whole-message store stays empty


def test_receive_queue_is_bounded_in_bytes_and_fair_between_origins() -> None:
    """A flooder fills a reader's 1 MiB queue alone; an honest origin still gets in."""

    async def main() -> None:
        topic = "swarm/x/rollouts"
        config = Libp2pTransportConfig(
            listen=LOCAL, heartbeat_interval_s=0.5, max_queued_bytes=1 << 20
        )
        reader = Libp2pTransport(config, Identity.generate())
        await reader.start()
        peers = [
            Libp2pTransport(
                Libp2pTransportConfig(
                    listen=LOCAL, bootstrap=reader.listen_addrs(), heartbeat_interval_s=0.5
                ),
                Identity.generate(),
            )
            for _ in range(2)
        ]
        flooder, honest = peers
        try:
            await reader.subscribe(topic)
            for peer in peers:
                await peer.start()
                await peer.subscribe(topic)
            deadline = time.monotonic() + MESH_TIMEOUT_S
            for peer in peers:
                while reader.peer_id not in await peer.mesh_peers(topic):
                    assert time.monotonic() < deadline, "no mesh"
                    await asyncio.sleep(0.05)
            for i in range(40):  # 4 MB at a reader that does not read
                await flooder.publish(topic, bytes([i]) * 100_000)
            deadline = time.monotonic() + DELIVERY_TIMEOUT_S  # each wait its own
            while reader.received + reader.dropped_incoming < 40:
                assert time.monotonic() < deadline, reader.stats()
                await asyncio.sleep(0.05)
            stats = reader.stats()
            assert stats["dropped_incoming_by_reason"] == {"bytes_full": 30}
            assert 10 * 100_000 <= stats["queued_bytes"] <= 1 << 20
            for i in range(3):
                await honest.publish(topic, bytes([200 + i]) * 50_000)
            deadline = time.monotonic() + DELIVERY_TIMEOUT_S
            while reader.received < 13:
                assert time.monotonic() < deadline, reader.stats()
                await asyncio.sleep(0.05)
            stats = reader.stats()
            # The honest messages evicted the flooder's newest, never the other way round.
            dropped = stats["dropped_incoming_by_reason"]
            assert dropped.keys() == {"bytes_full", "evicted"} and dropped["bytes_full"] == 30
            kept = 10 - dropped["evicted"]
            assert stats["peak_queued_bytes"] <= 1 << 20
            got = [await asyncio.wait_for(reader.receive(), 5) for _ in range(kept + 3)]
            assert [m.data[:1] for m in got[:kept]] == [bytes([i]) for i in range(kept)]
            assert [m.data[:1] for m in got[kept:]] == [bytes([200 + i]) for i in range(3)]
            assert {m.via for m in got[kept:]} == {honest.peer_id}
            assert reader.stats()["queued_bytes"] == 0
        finally:
            for transport in (*peers, reader):
                await transport.stop()

    asyncio.run(main())


def test_sender_records_are_reused_per_host_for_their_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pubsub asks for our signed peer record once per RPC; the patch builds it once per
    host and `SENDER_RECORD_TTL_S`, and replaces the library's function everywhere."""
    import weakref

    import libp2p.pubsub.gossipsub as gossipsub_module
    import libp2p.pubsub.pubsub as pubsub_module

    from gossip import libp2p_records as mod

    mod.cache_sender_records()
    mod.cache_sender_records()  # idempotent
    assert pubsub_module.env_to_send_in_RPC is mod._cached_sender_record
    assert gossipsub_module.env_to_send_in_RPC is mod._cached_sender_record
    built: list[object] = []

    def build(host: object) -> tuple[bytes, bool]:
        built.append(host)
        return b"record-%d" % len(built), True

    now = [100.0]
    monkeypatch.setattr(mod, "_uncached_sender_record", build)
    monkeypatch.setattr(mod, "_clock", lambda: now[0])
    monkeypatch.setattr(mod, "_sender_records", weakref.WeakKeyDictionary())

    class Host:
        pass

    a, b = Host(), Host()
    assert mod._cached_sender_record(a) == (b"record-1", True)
    assert mod._cached_sender_record(a) == (b"record-1", False)  # reused
    assert mod._cached_sender_record(b) == (b"record-2", True)  # each host its own
    now[0] += mod.SENDER_RECORD_TTL_S
    assert mod._cached_sender_record(a) == (b"record-3", True)  # rebuilt after the TTL
    assert built == [a, b, a]


def test_library_error_lines_we_count_are_quieted_and_others_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gossip.libp2p_dialer import quiet_dial_failures

    quiet_dial_failures()
    quiet_dial_failures()  # idempotent
    host_log = logging.getLogger("libp2p.host.basic_host")
    with caplog.at_level(logging.ERROR):
        host_log.error("Failed to open stream to peer %s:\n  Error: %s", "12D3Koo", "reset")
        logging.getLogger("libp2p.transport.tcp.tcp").error("Failed to open TCP stream: x")
        muxer_log = logging.getLogger("libp2p.protocol_muxer.multiselect_client")
        muxer_log.error("MultiselectClient handshake: write failed: %s", "fail to write")
        muxer_log.error("MultiselectClient handshake: read failed: %s", "fail to read")
        host_log.error("something else broke")
    assert [r.getMessage() for r in caplog.records] == ["something else broke"]
    assert sum(type(f).__name__ == "_DialFailureFilter" for f in host_log.filters) == 1


def test_a_sender_record_sent_again_is_checked_once_per_reconsume_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every RPC carries its sender's signed peer record; verifying it each time was the
    costliest step of reading RPCs. The same bytes from the same peer are taken without a
    second check until `RECONSUME_EVERY_S` passes; other bytes, another peer or a record
    that was refused are checked every time."""
    import weakref

    from libp2p.peer.id import ID
    from libp2p.pubsub.pb import rpc_pb2

    from gossip import libp2p_records as mod

    checked: list[tuple[bytes, str]] = []
    refuse = {b"forged"}

    def check(msg: rpc_pb2.RPC, host: object, peer: ID) -> bool:
        checked.append((msg.senderRecord, peer.to_base58()))
        return msg.senderRecord not in refuse

    now = [100.0]
    monkeypatch.setattr(mod, "_record_accepted", check)
    monkeypatch.setattr(mod, "_clock", lambda: now[0])
    monkeypatch.setattr(mod, "_accepted", weakref.WeakKeyDictionary())

    class Host:
        pass

    host = Host()
    p, q = ID(b"\x00\x01p"), ID(b"\x00\x01q")

    def rpc(record: bytes | None) -> rpc_pb2.RPC:
        return rpc_pb2.RPC(senderRecord=record) if record is not None else rpc_pb2.RPC()

    assert mod.consume_sender_record(rpc(None), host, p)  # no record: nothing to check
    assert mod.consume_sender_record(rpc(b"r1"), host, p)
    assert mod.consume_sender_record(rpc(b"r1"), host, p)  # the same bytes: no check
    assert mod.consume_sender_record(rpc(b"r1"), host, q)  # another peer: checked
    assert mod.consume_sender_record(rpc(b"r2"), host, p)  # new bytes: checked
    assert not mod.consume_sender_record(rpc(b"forged"), host, p)
    assert not mod.consume_sender_record(rpc(b"forged"), host, p)  # refused: never kept
    assert mod.consume_sender_record(rpc(b"r2"), host, p)
    now[0] += mod.RECONSUME_EVERY_S
    assert mod.consume_sender_record(rpc(b"r2"), host, p)  # checked (and stored) again
    assert checked == [
        (b"r1", p.to_base58()), (b"r1", q.to_base58()), (b"r2", p.to_base58()),
        (b"forged", p.to_base58()), (b"forged", p.to_base58()), (b"r2", p.to_base58()),
    ]  # fmt: skip


def test_a_forwarder_over_its_rate_is_refused_counted_and_blamed_and_we_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GossipSub's per-forwarder limit is a token bucket per (peer, topic): a burst, then
    the sustained rate; refusals are counted and blamed; each topic has its own bucket."""
    from libp2p.peer.id import ID
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.pubsub.pb import rpc_pb2

    from gossip import libp2p_patches as mod

    monkeypatch.setattr(mod, "FORWARDER_BURST", 5.0)
    monkeypatch.setattr(mod, "FORWARDER_RATE_PER_S", 10.0)
    now = [1000.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: now[0])
    router = mod.SwarmGossipSub(protocols=[PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12)
    blamed: list[tuple[str, str]] = []
    router.forward_gate_blame = lambda peer, reason: blamed.append((peer, reason))
    peer = ID(b"\x00\x01p")

    def message(topic: str) -> rpc_pb2.Message:
        return rpc_pb2.Message(data=b"x", topicIDs=[topic])

    burst = [router._check_spam_protection(peer, message("t")) for _ in range(6)]
    assert burst == [True] * 5 + [False]
    assert router._check_spam_protection(peer, message("u"))  # another topic, its own bucket
    now[0] += 0.1  # one token back at 10/s
    assert router._check_spam_protection(peer, message("t"))
    assert not router._check_spam_protection(peer, message("t"))
    assert router.refusals.counts["forwarder_rate_limited"] == 2
    assert blamed == [(peer.to_base58(), "rate_limited")] * 2
