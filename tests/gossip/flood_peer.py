"""A flooder or a slow, RSS-sampling receiver in its own OS process, for the flood tests.

    python tests/gossip/flood_peer.py --role recv|flood --transport libp2p|mqtt
        [--listen MULTIADDR] [--bootstrap MULTIADDR] [--mqtt-host H --mqtt-port P]
        [--max-queued-bytes B] [--queue-messages N] [--max-reassembly-bytes R]
        [--max-envelope-bytes E] [--delay S]

Both run a real `gossip.layer.Gossip` over a real transport on one topic and speak JSON
lines on stdout (commands on stdin, one per line; EOF or `quit` ends the process):

- `recv`: reads with `Gossip.receive` and sleeps `--delay` seconds after every accepted
  message (a deliberately slow consumer). A sampler thread reads `/proc/self/status`
  every 5 ms. Events: `ready` (peer id, addrs), `mesh` (peers, on change), `recv`
  (index, size) per accepted message. Commands: `baseline` (record VmRSS now, reset the
  kernel's VmHWM and the sampled peak; answers `baseline`), `report` (answers `report`
  with baseline, peak (max of sampled VmRSS and VmHWM) and current RSS in bytes, the
  transport's `stats()` and the gossip counters).
- `flood`: command `flood COUNT SIZE [START]` publishes COUNT `DeltaPacket`s of SIZE
  bytes as fast as `Gossip.publish` returns (chunked by the gossip layer), then answers
  `flooded` (count, bytes, seconds, and `wire_messages`: transport messages published
  since start). Packets differ in their first 8 bytes (the index),
  so none is a duplicate of another.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gossip.layer import Gossip
from swarm.clock import WallClock
from swarm.config.network import (
    GossipConfig,
    Libp2pTransportConfig,
    MqttTransportConfig,
)
from swarm.identity import Identity
from swarm.messages import DeltaPacket
from swarm.transport import Transport, deltas_topic
from tests.gossip.peer_process import emit, report_mesh, run_until_done

FAMILY = "flood"
MIB = 1 << 20


def read_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class RssSampler:
    """Samples VmRSS every `period_s` in a daemon thread (independent of the event loop)."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.peak = 0
        self.samples = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            rss = read_status()["VmRSS"]
            with self._lock:
                self.peak = max(self.peak, rss)
                self.samples += 1
            time.sleep(self.period_s)

    def reset(self) -> int:
        rss = read_status()["VmRSS"]
        with self._lock:
            self.peak = rss
            self.samples = 0
        return rss


class FloodPeer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.identity = Identity.generate()
        self.topic = deltas_topic(args.swarm_id, FAMILY)
        self.transport = self._make_transport()
        config = GossipConfig(
            max_envelope_bytes=args.max_envelope_bytes,
            max_reassembly_bytes=args.max_reassembly_bytes,
            rate_limit_per_s=1e6,  # the flood must reach the queues, not the rate limiter
            rate_burst=1_000_000,
        )
        self.gossip = Gossip(self.transport, self.identity, args.swarm_id, config, WallClock())
        self.sampler = RssSampler() if args.role == "recv" else None
        self.baseline = 0
        self.hwm_reset = False
        self.accepted = 0
        self.done = asyncio.Event()

    def _make_transport(self) -> Transport:
        args = self.args
        if args.transport == "libp2p":
            from gossip.libp2p import Libp2pTransport

            config = Libp2pTransportConfig(
                listen=args.listen,
                bootstrap=args.bootstrap,
                heartbeat_interval_s=args.heartbeat,
                max_queued_bytes=args.max_queued_bytes,
            )
            return Libp2pTransport(
                config, self.identity, receive_queue_size=args.queue_messages
            )
        from gossip.mqtt import MqttTransport

        mqtt = MqttTransportConfig(
            host=args.mqtt_host,
            port=args.mqtt_port,
            max_queued_messages=args.queue_messages,
            max_queued_bytes=args.max_queued_bytes,
        )
        return MqttTransport(mqtt, self.identity)

    async def run(self) -> None:
        await self.gossip.start()
        await self.gossip.subscribe(self.topic)
        addrs = self.transport.listen_addrs() if hasattr(self.transport, "listen_addrs") else []
        emit("ready", peer_id=self.identity.peer_id, addrs=addrs, rss=read_status()["VmRSS"])
        tasks = [
            asyncio.create_task(report_mesh(self.transport, self.topic), name="mesh"),
            asyncio.create_task(self._command_loop(), name="commands"),
        ]
        if self.args.role == "recv":
            tasks.append(asyncio.create_task(self._consume(), name="consume"))
        try:
            await run_until_done(tasks, self.done)
        finally:
            await self.gossip.stop()
            emit("done")

    async def _consume(self) -> None:
        while True:
            got = await self.gossip.receive()
            packet = got.message
            assert isinstance(packet, DeltaPacket)
            self.accepted += 1
            emit("recv", index=packet.base_version, size=len(packet.tensors))
            del got, packet
            await asyncio.sleep(self.args.delay)

    async def flood(self, count: int, size: int, start: int) -> None:
        body = os.urandom(size)
        t0 = time.perf_counter()
        for i in range(start, start + count):
            tensors = i.to_bytes(8, "big") + body[8:]
            await self.gossip.publish(self.topic, DeltaPacket(FAMILY, i, "raw", tensors), 0)
        emit(
            "flooded",
            count=count,
            bytes=count * size,
            seconds=time.perf_counter() - t0,
            wire_messages=self.gossip.counters.messages_out,
            skipped_slow_peer=getattr(self.transport, "stats", dict)().get("skipped_slow_peer", 0),
        )

    def report(self) -> dict[str, Any]:
        assert self.sampler is not None
        status = read_status()
        peak = max(self.sampler.peak, status["VmHWM"] if self.hwm_reset else 0)
        stats = getattr(self.transport, "stats", dict)()
        return {
            "baseline": self.baseline,
            "peak": peak,
            "sampled_peak": self.sampler.peak,
            "hwm": status["VmHWM"],
            "hwm_reset": self.hwm_reset,
            "rss": status["VmRSS"],
            "samples": self.sampler.samples,
            "accepted": self.accepted,
            "transport": stats,
            "gossip": self.gossip.snapshot(),
        }

    async def _command_loop(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while True:
            line = await reader.readline()
            if not line:
                self.done.set()
                return
            words = line.decode().split()
            if not words:
                continue
            if words[0] == "flood":
                start = int(words[3]) if len(words) > 3 else 0
                await self.flood(int(words[1]), int(words[2]), start)
            elif words[0] == "baseline" and self.sampler is not None:
                self.hwm_reset = reset_hwm()
                self.baseline = self.sampler.reset()
                emit("baseline", rss=self.baseline, hwm_reset=self.hwm_reset)
            elif words[0] == "report" and self.sampler is not None:
                emit("report", **self.report())
            elif words[0] == "quit":
                self.done.set()
                return


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("recv", "flood"), required=True)
    p.add_argument("--transport", choices=("libp2p", "mqtt"), required=True)
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--mqtt-host", default="127.0.0.1")
    p.add_argument("--mqtt-port", type=int, default=1883)
    p.add_argument("--swarm-id", default="flood-swarm")
    p.add_argument("--max-queued-bytes", type=int, default=64 * MIB)
    p.add_argument("--queue-messages", type=int, default=1024)
    p.add_argument("--max-reassembly-bytes", type=int, default=256 * MIB)
    p.add_argument("--max-envelope-bytes", type=int, default=64 * MIB)
    p.add_argument("--delay", type=float, default=0.0, help="seconds slept per accepted message")
    return p.parse_args(argv)


def main() -> None:
    logging.basicConfig(level=os.environ.get("PEER_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    asyncio.run(FloodPeer(parse_args()).run())


if __name__ == "__main__":
    main()
