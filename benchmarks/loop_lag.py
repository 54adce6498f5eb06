"""Event-loop lag while 4 MB messages are verified and reassembled on the receiving side.

    .venv/bin/python benchmarks/loop_lag.py [--messages 16] [--size 4000000]

A sender `Gossip` publishes `--messages` DeltaPackets of `--size` random bytes over the
memory transport (chunked at its 1 MiB message size) before anything is timed, so the
receiver's inbox holds the whole backlog, as after a burst from the network. Then the
receiver drains it while a probe task asks the loop for a 1 ms sleep over and over; the
lag is how late each wake-up comes (p50, p99, max), which is how long the other tasks of
a node (its round loop, the dashboard, hellos) would wait.

Two readers, same messages, same process:
- `Gossip.receive` (what a node runs): yields to the loop before each message;
- `tight accept loop` (the baseline, how `receive` behaved before): takes queued
  messages back to back, as an inbox that has them hands them over without suspending.

Target (issue "Performance"): p99 < 20 ms with a 4 MB message in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gossip.layer import Gossip
from gossip.memory import MemoryTransport, remove_network
from swarm.clock import WallClock
from swarm.config.network import GossipConfig, MemoryTransportConfig
from swarm.identity import Identity
from swarm.messages import DeltaPacket
from swarm.transport import deltas_topic

PROBE_S = 0.001


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def probe(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(PROBE_S)
        lags.append(time.perf_counter() - t0 - PROBE_S)


async def tight_reader(gossip: Gossip, count: int) -> None:
    got = 0
    while got < count:
        message = await gossip.transport.receive()
        if gossip.accept(message) is not None:
            got += 1


async def product_reader(gossip: Gossip, count: int) -> None:
    for _ in range(count):
        await gossip.receive()


async def one_run(
    name: str, reader: Callable[[Gossip, int], Awaitable[None]], messages: int, size: int
) -> dict[str, float]:
    remove_network(name)
    config = MemoryTransportConfig(network=name, max_queued_bytes=(messages + 2) * size * 2)
    gossip_config = GossipConfig(rate_limit_per_s=1e6, rate_burst=1_000_000)
    topic = deltas_topic("bench", "test")
    nodes = [
        Gossip(MemoryTransport(config, i, queue_size=100_000), i, "bench", gossip_config,
               WallClock())
        for i in (Identity.generate(), Identity.generate())
    ]  # fmt: skip
    for node in nodes:
        await node.start()
        await node.subscribe(topic)
    sender, receiver = nodes
    payload = os.urandom(size)
    try:
        for i in range(messages):
            await sender.publish(topic, DeltaPacket("test", i, "raw", payload), 0)
        lags: list[float] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(probe(lags, stop))
        await asyncio.sleep(0.05)  # the probe's own baseline, loop idle
        t0 = time.perf_counter()
        await reader(receiver, messages)
        seconds = time.perf_counter() - t0
        stop.set()
        await watcher
    finally:
        for node in nodes:
            await node.stop()
        remove_network(name)
    return {
        "p50_ms": percentile(lags, 0.5) * 1e3,
        "p99_ms": percentile(lags, 0.99) * 1e3,
        "max_ms": max(lags) * 1e3,
        "mean_ms": statistics.fmean(lags) * 1e3,
        "mb_s": messages * size / 1e6 / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=16)
    parser.add_argument("--size", type=int, default=4_000_000)
    args = parser.parse_args()
    print(
        f"receiver event-loop lag, {args.messages} x {args.size / 1e6:g} MB queued "
        f"(chunked at 1 MiB), 1 ms probe"
    )
    print(f"| {'reader':<26} | {'p50 ms':>7} | {'p99 ms':>7} | {'max ms':>7} | {'MB/s':>6} |")
    print(f"|{'-' * 28}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 8}|")
    for label, reader in (
        ("tight accept loop (before)", tight_reader),
        ("Gossip.receive (node)", product_reader),
    ):
        row = asyncio.run(one_run("loop-lag", reader, args.messages, args.size))
        print(
            f"| {label:<26} | {row['p50_ms']:>7.2f} | {row['p99_ms']:>7.2f} | "
            f"{row['max_ms']:>7.2f} | {row['mb_s']:>6.1f} |"
        )


if __name__ == "__main__":
    main()
