"""Bare MQTT: raw aiomqtt publishes through a broker, no envelope pipeline (the baseline
`gossip_bench.py` compares the gossip layer's MQTT goodput against, same broker).

As a receiver process (`python benchmarks/bare_mqtt.py recv HOST PORT TOPIC COUNT QOS`)
it subscribes, prints `ready`, then prints the wall time when COUNT messages have
arrived. `bare_rows` runs one such receiver per payload size and publishes from this
process, as the gossip benchmark's two processes do, at QoS 0 (fire and forget: the
broker's ceiling) or QoS 1 (each publish awaits its PUBACK; with `window` > 1, up to that
many await theirs at once, as `gossip.mqtt` publishes: the bare equivalent of our
transport on the wire).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import aiomqtt


async def _receive(host: str, port: int, topic: str, count: int, qos: int) -> None:
    async with aiomqtt.Client(host, port, max_queued_incoming_messages=0) as client:
        await client.subscribe(topic, qos=qos)
        print("ready", flush=True)
        got = 0
        async for _ in client.messages:
            got += 1
            if got >= count:
                print(f"{time.time():.6f}", flush=True)
                return


async def _publish(
    host: str, port: int, topic: str, count: int, size: int, qos: int, window: int
) -> float:
    payload = bytes(size)
    async with aiomqtt.Client(host, port, max_inflight_messages=max(window, 20)) as client:
        t0 = time.time()
        if window <= 1:
            for _ in range(count):
                await client.publish(topic, payload, qos=qos)
            return t0
        slots = asyncio.Semaphore(window)
        pending = set()
        for _ in range(count):
            await slots.acquire()
            task = asyncio.ensure_future(client.publish(topic, payload, qos=qos))
            task.add_done_callback(lambda _: slots.release())
            pending.add(task)
            await asyncio.sleep(0)  # hand it to the connection now, in call order
        await asyncio.gather(*pending)
        return t0


def bare_rows(
    host: str, port: int, sizes: list[tuple[str, int, int]], qos: int = 0, window: int = 1
) -> list[tuple]:
    """(label, count, size, seconds) per size: first publish to the last arrival."""
    rows = []
    for label, size, count in sizes:
        topic = f"bare/{qos}/{window}/{size}"
        receiver = subprocess.Popen(
            [sys.executable, __file__, "recv", host, str(port), topic, str(count), str(qos)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert receiver.stdout is not None
        if receiver.stdout.readline().strip() != "ready":
            raise RuntimeError("bare MQTT receiver did not start")
        t0 = asyncio.run(_publish(host, port, topic, count, size, qos, window))
        done = receiver.stdout.readline().strip()
        receiver.wait(timeout=60)
        rows.append((label, count, size, float(done) - t0))
    return rows


if __name__ == "__main__" and sys.argv[1:2] == ["recv"]:
    host, port, topic, count = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    asyncio.run(_receive(host, port, topic, count, int(sys.argv[6])))
