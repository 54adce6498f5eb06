"""One swarm peer in its own OS process, driven by tests and benchmarks over stdin/stdout.

    python tests/gossip/peer_process.py --transport libp2p|mqtt --mode send|recv|relay
        [--listen MULTIADDR] [--bootstrap MULTIADDR ...] [--mqtt-host H --mqtt-port P]
        [--seed HEX] [--count N --size BYTES --wait-mesh K] [--expect N] [--raw] [--light]
        [--no-peer-exchange] [--target-peers N] [--exchange-interval S]
        [--peer-book PATH] [--hostile-exchange oversize|garbage] [--topic deltas|rollouts]

It starts a transport and, unless `--raw`, the gossip layer on top (signed envelopes,
chunking above the transport's message size), subscribes to one topic, and speaks JSON
lines on stdout:

    {"event": "ready", "peer_id": ..., "addrs": [...], "layer": "gossip"|"raw"}
    {"event": "mesh", "peers": [...]}            whenever its mesh/broker view changes
    {"event": "sent", "index": i, "sha256": ..., "size": n}
    {"event": "recv", "topic": ..., "sender": ..., "via": ..., "index": i,
     "sha256": ..., "size": n}
    {"event": "burst", "count": n, "size": s, "seconds": t}   after a `send` command
    {"event": "arrived", "first": i, "last": j, "t": t}  after `expect` (below)
    {"event": "peers", "connected": [...], "networks": {peer: network or null}}
    {"event": "stats", ...} / {"event": "done"}

Commands on stdin, one per line: `send COUNT SIZE [START]`, `forge COUNT SIZE [PER_S]`
(raw mode: COUNT envelopes whose signature is random bytes, as fast as the transport
takes them or at PER_S a second; answers `forged`), `expect FIRST LAST`, `peers
[PEER ...]` (the connected peers, and the network each of them and of PEER is seen at),
`stats`, `quit`. EOF on stdin ends the process (so an orphan never outlives its test).
`expect FIRST LAST` emits one `arrived` event, with the wall time of the last arrival,
once every index in [FIRST, LAST) was received (at once if they already were).

`--light` (benchmarks): one random payload per burst, and no per-message `sent`/`recv`
lines (a JSON line per message, parsed by the driver, costs about what a bare MQTT
receiver spends per message): the driver learns arrivals from `expect` instead, as a
bare receiver that counts and prints once.

Modes: `send` publishes `--count` messages of `--size` bytes once `--wait-mesh` peers
are in its mesh; `recv` exits after `--expect` messages (0: never); `relay` only runs.
Every mode prints what it receives and obeys commands.

Payloads are `DeltaPacket`s of random bytes (index in `base_version`) on the topic
`swarm/<swarm id>/deltas/test`, or with `--topic rollouts` on the swarm's rollouts topic
(where a node's gossip refuses them as the wrong kind: only `forge` makes sense there).
In `--raw` mode each is one signed envelope sent directly over the transport (at most
its `max_message_bytes`); `sender` is the envelope's verified signer either way.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gossip.layer import Gossip, envelope_limits, payload_limits
from swarm.clock import WallClock
from swarm.config.network import (
    GossipConfig,
    Libp2pTransportConfig,
    MqttTransportConfig,
)
from swarm.envelope import Envelope, decode_envelope, seal
from swarm.identity import Identity
from swarm.messages import DeltaPacket, decode_payload, encode_payload
from swarm.transport import Transport, deltas_topic, rollouts_topic

FAMILY = "test"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def mesh_of(transport: Transport, topic: str) -> list[str]:
    """The peers this transport meshes with on `topic` (its connections if no mesh)."""
    mesh_peers = getattr(transport, "mesh_peers", None)
    if mesh_peers is not None:
        return sorted(await mesh_peers(topic))
    return sorted(transport.connected_peers())


async def report_mesh(transport: Transport, topic: str) -> None:
    """Emit a `mesh` event whenever the mesh on `topic` changes (forever)."""
    last: list[str] | None = None
    while True:
        peers = await mesh_of(transport, topic)
        if peers != last:
            emit("mesh", peers=peers)
            last = peers
        await asyncio.sleep(0.1)


async def run_until_done(tasks: list[asyncio.Task[Any]], done: asyncio.Event) -> None:
    """Wait until `done` is set or a task ends (re-raising its error); cancel the rest."""
    done_wait = asyncio.create_task(done.wait(), name="done")
    try:
        finished, _ = await asyncio.wait([*tasks, done_wait], return_when=asyncio.FIRST_COMPLETED)
        for task in finished:
            if task is not done_wait and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in [*tasks, done_wait]:
            task.cancel()
        await asyncio.gather(*tasks, done_wait, return_exceptions=True)


def play_hostile_exchange(kind: str) -> None:
    """Make this process answer `/swarm/peers/1` with junk (it is its own process)."""
    import gossip.peer_exchange as px

    junk = {
        "oversize": lambda peers: b"\x91" + b"\xa1x" * (px.MAX_REPLY_BYTES // 2 + 100),
        "garbage": lambda peers: b"\xc1not msgpack at all",
    }[kind]
    px.encode_reply = junk  # type: ignore[assignment]


def bench_gossip_config() -> GossipConfig:
    """Gossip limits loose enough for bulk tests and benchmarks (no rate-limit drops)."""
    return GossipConfig(rate_limit_per_s=1e6, rate_burst=1_000_000)


class Peer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.identity = (
            Identity.from_seed(bytes.fromhex(args.seed)) if args.seed else Identity.generate()
        )
        self.topic = (
            rollouts_topic(args.swarm_id)
            if args.topic == "rollouts"
            else deltas_topic(args.swarm_id, FAMILY)
        )
        self.transport = self._make_transport()
        self.gossip: Gossip | None = None
        if not args.raw:
            self.gossip = Gossip(
                self.transport, self.identity, args.swarm_id, bench_gossip_config(), WallClock()
            )
        self.received = 0
        self.arrivals: dict[int, float] = {}
        """Index -> wall time of arrival (every index, in every mode; for `expect`)."""
        self._expected: list[tuple[int, int, set[int]]] = []
        self.round = 0
        self.done = asyncio.Event()
        self._send_lock = asyncio.Lock()

    def _make_transport(self) -> Transport:
        args = self.args
        if args.transport == "libp2p":
            from gossip.libp2p import Libp2pTransport

            config = Libp2pTransportConfig(
                listen=args.listen,
                bootstrap=args.bootstrap,
                heartbeat_interval_s=args.heartbeat,
                max_message_bytes=args.max_message_bytes,
                peer_exchange=not args.no_peer_exchange,
                target_peers=args.target_peers,
                exchange_interval_s=args.exchange_interval,
            )
            if args.hostile_exchange:
                play_hostile_exchange(args.hostile_exchange)
            book = Path(args.peer_book) if args.peer_book else None
            return Libp2pTransport(config, self.identity, peer_book_path=book)
        from gossip.mqtt import MqttTransport

        return MqttTransport(
            MqttTransportConfig(host=args.mqtt_host, port=args.mqtt_port), self.identity
        )

    async def run(self) -> None:
        if self.gossip is not None:
            await self.gossip.start()
            await self.gossip.subscribe(self.topic)
        else:
            await self.transport.start()
            await self.transport.subscribe(self.topic)
        addrs = self.transport.listen_addrs() if hasattr(self.transport, "listen_addrs") else []
        emit(
            "ready",
            peer_id=self.identity.peer_id,
            addrs=addrs,
            layer="gossip" if self.gossip is not None else "raw",
            max_message_bytes=self.transport.max_message_bytes,
        )
        tasks = [
            asyncio.create_task(self._receive_loop(), name="receive"),
            asyncio.create_task(report_mesh(self.transport, self.topic), name="mesh"),
            asyncio.create_task(self._command_loop(), name="commands"),
        ]
        if self.args.mode == "send":
            tasks.append(asyncio.create_task(self._auto_send(), name="auto-send"))
        try:
            await run_until_done(tasks, self.done)
        finally:
            if self.gossip is not None:
                await self.gossip.stop()
            else:
                await self.transport.stop()
            emit("done")

    async def _auto_send(self) -> None:
        deadline = time.monotonic() + self.args.wait_timeout
        while len(await mesh_of(self.transport, self.topic)) < self.args.wait_mesh:
            if time.monotonic() > deadline:
                raise TimeoutError(f"mesh did not reach {self.args.wait_mesh} peers")
            await asyncio.sleep(0.05)
        await self.send(self.args.count, self.args.size, 0)

    async def send(self, count: int, size: int, start: int) -> None:
        async with self._send_lock:
            t0 = time.perf_counter()
            # --light: one random payload per burst (the index still makes each packet
            # distinct), so a benchmark times the gossip layer, not os.urandom.
            shared = os.urandom(size) if self.args.light else b""
            for i in range(start, start + count):
                tensors = shared or os.urandom(size)
                packet = DeltaPacket(FAMILY, i, "raw", tensors)
                if self.gossip is not None:
                    await self.gossip.publish(self.topic, packet, self.round)
                else:
                    envelope = self._sealed(packet, i)
                    await self.transport.publish(self.topic, envelope.encode())
                if not self.args.light:
                    emit("sent", index=i, sha256=hashlib.sha256(tensors).hexdigest(), size=size)
            emit("burst", count=count, size=size, seconds=time.perf_counter() - t0)

    async def forge(self, count: int, size: int, per_s: float = 0.0) -> None:
        """Publish `count` envelopes of ours with a random signature (raw mode), as fast
        as the transport takes them or, with `per_s`, at that rate."""
        t0 = time.perf_counter()
        for i in range(count):
            if per_s > 0:
                await asyncio.sleep(max(0.0, t0 + i / per_s - time.perf_counter()))
            envelope = self._sealed(DeltaPacket(FAMILY, 10**9 + i, "raw", os.urandom(size)), i)
            forged = dataclasses.replace(envelope, signature=os.urandom(64))
            await self.transport.publish(self.topic, forged.encode())
        emit("forged", count=count, seconds=time.perf_counter() - t0)

    def _sealed(self, packet: DeltaPacket, i: int) -> Envelope:
        """`packet` as one signed envelope of ours (raw mode: no gossip layer)."""
        return seal(
            self.identity,
            kind=DeltaPacket.KIND,
            swarm_id=self.args.swarm_id,
            seq=time.time_ns() // 1000 + i,
            policy_version=self.round,
            payload=encode_payload(packet),
        )

    async def _receive_loop(self) -> None:
        limit = self.transport.max_message_bytes + 4096
        while True:
            if self.gossip is not None:
                got = await self.gossip.receive()
                topic, sender, via, packet = got.topic, got.envelope.sender, None, got.message
            else:
                message = await self.transport.receive()
                if self.args.topic == "rollouts":
                    self.received += 1  # a node's rollouts: counted, not read
                    continue
                envelope = decode_envelope(message.data, envelope_limits(limit), self.args.swarm_id)
                if message.via is not None and message.via != envelope.sender:
                    raise RuntimeError(f"via {message.via} != signer {envelope.sender}")
                packet = decode_payload(envelope.kind, envelope.payload, payload_limits(limit))
                topic, sender, via = message.topic, envelope.sender, message.via
            assert isinstance(packet, DeltaPacket)
            self.received += 1
            now = time.time()
            self.arrivals[packet.base_version] = now
            if not self.args.light:
                emit(
                    "recv",
                    topic=topic,
                    sender=sender,
                    via=via,
                    index=packet.base_version,
                    sha256=hashlib.sha256(packet.tensors).hexdigest(),
                    size=len(packet.tensors),
                    t=now,
                )
            if self._expected:
                self._check_expected(packet.base_version)
            if self.args.mode == "recv" and self.args.expect and self.received >= self.args.expect:
                self.done.set()

    def expect(self, first: int, last: int) -> None:
        missing = {i for i in range(first, last) if i not in self.arrivals}
        self._expected.append((first, last, missing))
        self._check_expected(None)

    def _check_expected(self, index: int | None) -> None:
        for expectation in list(self._expected):
            first, last, missing = expectation
            missing.discard(index)
            if not missing:
                self._expected.remove(expectation)
                emit(
                    "arrived",
                    first=first,
                    last=last,
                    t=max(self.arrivals[i] for i in range(first, last)),
                )

    async def _command_loop(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while True:
            line = await reader.readline()
            if not line:
                self.done.set()  # stdin closed: the driver is gone
                return
            words = line.decode().split()
            if not words:
                continue
            if words[0] == "send":
                count, size = int(words[1]), int(words[2])
                start = int(words[3]) if len(words) > 3 else 0
                await self.send(count, size, start)
            elif words[0] == "forge":
                per_s = float(words[3]) if len(words) > 3 else 0.0
                await self.forge(int(words[1]), int(words[2]), per_s)
            elif words[0] == "expect":
                self.expect(int(words[1]), int(words[2]))
            elif words[0] == "peers":
                connected = sorted(self.transport.connected_peers())
                asked = [*connected, *words[1:]]
                networks = {peer: self.transport.peer_network(peer) for peer in asked}
                emit("peers", connected=connected, networks=networks)
            elif words[0] == "stats":
                stats = getattr(self.transport, "stats", dict)()
                layer = self.gossip.snapshot() if self.gossip is not None else {}
                emit("stats", transport=stats, gossip=layer)
            elif words[0] == "quit":
                self.done.set()
                return


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transport", choices=("libp2p", "mqtt"), required=True)
    p.add_argument("--mode", choices=("send", "recv", "relay"), default="relay")
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--mqtt-host", default="127.0.0.1")
    p.add_argument("--mqtt-port", type=int, default=1883)
    p.add_argument("--swarm-id", default="test-swarm")
    p.add_argument("--seed", default="", help="hex Ed25519 seed (default: a new identity)")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--size", type=int, default=1000)
    p.add_argument("--wait-mesh", type=int, default=1)
    p.add_argument("--wait-timeout", type=float, default=30.0)
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--heartbeat", type=float, default=0.5)
    p.add_argument("--raw", action="store_true", help="bypass the gossip layer")
    p.add_argument(
        "--light",
        action="store_true",
        help="benchmarks: one random payload per burst, no per-message events (use expect)",
    )
    p.add_argument("--no-peer-exchange", action="store_true", help="libp2p: bootstrap only")
    p.add_argument("--target-peers", type=int, default=8)
    p.add_argument("--exchange-interval", type=float, default=10.0)
    p.add_argument("--peer-book", default="", help="libp2p: peer book file (default: none)")
    p.add_argument("--hostile-exchange", choices=("oversize", "garbage"), default="")
    p.add_argument("--topic", choices=("deltas", "rollouts"), default="deltas")
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=1 << 20,
        help="libp2p: largest GossipSub message sent (raise it to play an oversize sender)",
    )
    return p.parse_args(argv)


def main() -> None:
    logging.basicConfig(level=os.environ.get("PEER_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    asyncio.run(Peer(parse_args()).run())


if __name__ == "__main__":
    main()
