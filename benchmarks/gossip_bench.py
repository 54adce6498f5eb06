"""Gossip throughput: messages/s and MB/s per transport and payload size, as one table.

    .venv/bin/python benchmarks/gossip_bench.py [--quick] [--transports libp2p,mqtt,memory]
        [--mqtt-delay-ms D]

- libp2p: two OS processes (`tests/gossip/peer_process.py`) on 127.0.0.1, directly
  connected, GossipSub mesh formed before measuring;
- mqtt: the same two processes through a mosquitto broker this script starts (skipped
  with a note when mosquitto is not installed);
- memory: two `MemoryTransport`s in this process; then the same again ("memory, 2nd"):
  a node runs for hours, and the first pass in a fresh process also pays for its
  first touches of memory (page faults: ~13-30% of the 4 MB figure here).

`--mqtt-delay-ms D` puts a link with a round trip of 2 x D ms between every MQTT client
(ours and the bare ones) and the broker (`tests/gossip/tcp_proxy.py`, in a process of its
own): a broker across the internet rather than on this machine.

Every message goes through the gossip layer (signed envelope, verification,
deduplication; payloads over the transport's message size are chunked and reassembled),
with rate limits loosened so that nothing is dropped. Time runs from the publish
command to the receiver's accepting the last message, so it includes signing,
chunking, transport, verification and reassembly. Payloads are random bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bare_mqtt import bare_rows  # noqa: E402
from gossip.layer import Gossip  # noqa: E402
from gossip.memory import MemoryTransport, remove_network  # noqa: E402
from swarm.clock import WallClock  # noqa: E402
from swarm.config.network import GossipConfig, MemoryTransportConfig  # noqa: E402
from swarm.identity import Identity  # noqa: E402
from swarm.messages import DeltaPacket  # noqa: E402
from swarm.transport import deltas_topic  # noqa: E402
from tests.gossip.conftest import Broker, PeerProcess, mosquitto_path  # noqa: E402

KB = 1000
BARE: list[tuple[str, int, int]] = [
    ("bare qos0", 0, 1),  # fire and forget: the broker's ceiling
    ("bare qos1", 1, 1),  # each publish awaits its PUBACK
    # What gossip.mqtt puts on the wire: QoS 1, up to transport.max_inflight_publishes
    # (default 16) awaiting their PUBACK at once. Our overhead is the gap to this row.
    ("bare qos1 x16", 1, 16),
]
SIZES: list[tuple[str, int, int, int]] = [
    # label, bytes, messages (full run), messages (--quick)
    ("1 KB", 1 * KB, 2000, 300),
    ("100 KB", 100 * KB, 300, 50),
    ("4 MB", 4 * 1000 * KB, 12, 4),
]
TIMEOUT_S = 120.0

Row = tuple[str, str, int, float, float, float]  # transport, size, n, seconds, msg/s, MB/s


def row(transport: str, label: str, count: int, size: int, seconds: float) -> Row:
    return (transport, label, count, seconds, count / seconds, count * size / 1e6 / seconds)


def bench_processes(
    transport: str, spawn: Callable[[str, list[str]], PeerProcess], quick: bool
) -> list[Row]:
    common = ["--transport", transport, "--wait-mesh", "1", "--light"]
    receiver = spawn("recv", [*common, "--mode", "relay"]).ready()
    extra = ["--bootstrap", receiver.addrs[0]] if transport == "libp2p" else []
    sender = spawn("send", [*common, "--mode", "relay", *extra]).ready()
    for peer in (receiver, sender):
        peer.wait_until(lambda _, p=peer: bool(p.mesh()), 30.0, "mesh")
    # Warm-up: a few messages through the freshly formed mesh.
    arrival_time(receiver, sender, 0, 5, 1000)
    rows: list[Row] = []
    start_index = 1000
    for label, size, full, small in SIZES:
        count = small if quick else full
        first = start_index
        t0 = time.time()
        t_end = arrival_time(receiver, sender, first, count, size)
        rows.append(row(transport, label, count, size, t_end - t0))
        start_index += 100_000
    stats = receiver.request("stats", "stats")
    dropped = stats["gossip"].get("dropped", {})
    if dropped or stats["transport"].get("dropped_incoming"):
        print(f"  note: {transport} receiver dropped {dropped} {stats['transport']}")
    return rows


def arrival_time(
    receiver: PeerProcess, sender: PeerProcess, first: int, count: int, size: int
) -> float:
    """Have `sender` publish `count` messages; the wall time the last one reached `receiver`.

    Both peers run `--light`: no JSON line per message, the receiver reports once per
    burst (`expect`), like the bare receiver it is compared with.
    """
    last = first + count
    receiver.command(f"expect {first} {last}")
    sender.command(f"send {count} {size} {first}")
    event = receiver.wait_for(
        lambda e: e["event"] == "arrived" and e["first"] == first, TIMEOUT_S, f"{count} x {size} B"
    )
    return float(event["t"])


async def bench_memory(quick: bool, transport: str = "memory") -> list[Row]:
    name = "gossip-bench"
    remove_network(name)
    config = MemoryTransportConfig(network=name)
    gossip_config = GossipConfig(rate_limit_per_s=1e6, rate_burst=1_000_000)
    topic = deltas_topic("bench", "test")
    ids = [Identity.generate(), Identity.generate()]
    nodes = [
        Gossip(
            MemoryTransport(config, i, queue_size=100_000), i, "bench", gossip_config, WallClock()
        )
        for i in ids
    ]
    for node in nodes:
        await node.start()
        await node.subscribe(topic)
    sender, receiver = nodes
    rows: list[Row] = []
    try:
        for label, size, full, small in SIZES:
            count = small if quick else full
            payloads = [
                DeltaPacket("test", i, "raw", bytes([i % 256]) * size) for i in range(count)
            ]

            async def drain(count: int = count) -> None:
                for _ in range(count):
                    await receiver.receive()

            t0 = time.perf_counter()
            reader = asyncio.create_task(drain())
            for packet in payloads:
                await sender.publish(topic, packet, 0)
                await asyncio.sleep(0)  # let the reader run, as a real node would
            await asyncio.wait_for(reader, TIMEOUT_S)
            rows.append(row(transport, label, count, size, time.perf_counter() - t0))
    finally:
        for node in nodes:
            await node.stop()
        remove_network(name)
    return rows


def print_table(rows: list[Row]) -> None:
    header = f"| {'transport':<11} | {'payload':>7} | {'msgs':>5} | {'seconds':>7} | "
    header += f"{'msgs/s':>8} | {'MB/s':>7} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for transport, label, count, seconds, rate, mbps in rows:
        print(
            f"| {transport:<11} | {label:>7} | {count:>5} | {seconds:>7.2f} | "
            f"{rate:>8.0f} | {mbps:>7.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages per size")
    parser.add_argument("--transports", default="libp2p,mqtt,memory")
    parser.add_argument(
        "--mqtt-delay-ms",
        type=float,
        default=0.0,
        help="one-way delay between each MQTT client and the broker (default 0)",
    )
    args = parser.parse_args()
    wanted = args.transports.split(",")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gossip-bench-") as tmp:
        workdir = Path(tmp)
        for transport in ("libp2p", "mqtt"):
            if transport not in wanted:
                continue
            extra: list[str] = []
            broker: Broker | None = None
            proxy: subprocess.Popen[str] | None = None
            host, port = "", 0
            if transport == "mqtt":
                binary = mosquitto_path()
                if binary is None:
                    print("  note: mosquitto not installed; mqtt skipped")
                    continue
                broker = Broker(binary, workdir)
                broker.start()
                host, port = broker.host, broker.port
                if args.mqtt_delay_ms > 0:
                    proxy = subprocess.Popen(
                        [sys.executable, "-m", "tests.gossip.tcp_proxy", broker.host,
                         str(broker.port), str(args.mqtt_delay_ms)],
                        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    )  # fmt: skip
                    assert proxy.stdout is not None
                    host, port = "127.0.0.1", int(proxy.stdout.readline())
                    print(f"  note: MQTT clients reach the broker over a "
                          f"{2 * args.mqtt_delay_ms:g} ms round trip")  # fmt: skip
                extra = ["--mqtt-host", host, "--mqtt-port", str(port)]
            peers: list[PeerProcess] = []

            def spawn(
                name: str,
                argv: list[str],
                extra: list[str] = extra,
                prefix: str = transport,
                peers: list[PeerProcess] = peers,
            ) -> PeerProcess:
                peer = PeerProcess(f"{prefix}-{name}", [*argv, *extra], workdir)
                peers.append(peer)
                return peer

            try:
                rows += bench_processes(transport, spawn, args.quick)
                if broker is not None:  # the same broker, raw publishes: the baseline
                    sizes = [(lab, size, small if args.quick else full)
                             for lab, size, full, small in SIZES]  # fmt: skip
                    for kind, qos, window in BARE:
                        bare = bare_rows(host, port, sizes, qos, window)
                        for label, count, size, seconds in bare:
                            rows.append(row(kind, label, count, size, seconds))
            finally:
                for peer in peers:
                    peer.stop()
                if proxy is not None:
                    proxy.communicate(timeout=10)  # stdin closed: the proxy exits
                if broker is not None:
                    broker.stop()
        if "memory" in wanted:
            rows += asyncio.run(bench_memory(args.quick))
            rows += asyncio.run(bench_memory(args.quick, "memory, 2nd"))
    print_table(rows)
    ours = {label: mbps for t, label, _, _, _, mbps in rows if t == "mqtt"}
    for kind, qos, window in BARE:
        bare = {label: mbps for t, label, _, _, _, mbps in rows if t == kind}
        how = f"QoS {qos}" + (f", {window} awaiting PUBACK at once" if window > 1 else "")
        for label, _, _, _ in SIZES:
            if label in ours and label in bare:
                print(f"mqtt goodput / bare aiomqtt {how} at {label}: "
                      f"{ours[label] / bare[label]:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
