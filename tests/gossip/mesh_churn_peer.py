"""Identities that join a GossipSub topic and leave, in waves, from one OS process.

    python tests/gossip/mesh_churn_peer.py --target MULTIADDR --topic TOPIC

Each identity is a real `gossip.libp2p.Libp2pTransport` (fresh key, its own trio
thread) bootstrapped to `--target` and subscribed to `--topic`, so it is grafted into the
target's mesh as any peer is; it publishes nothing. JSON lines on stdout, commands on
stdin (EOF or `quit` ends the process, stopping every identity):

    {"event": "ready"}
    `wave COUNT STAY`  COUNT identities start at once, stay STAY seconds, stop at once;
                       answers {"event": "wave", "started": n, "failed": n, "seconds": t}

Invariants: every transport this process starts is stopped before the next wave and at
exit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gossip.libp2p import Libp2pTransport
from swarm.config.network import Libp2pTransportConfig
from swarm.identity import Identity
from tests.gossip.peer_process import emit


async def _one(target: str, topic: str) -> Libp2pTransport:
    config = Libp2pTransportConfig(
        listen="/ip4/127.0.0.1/tcp/0",
        bootstrap=[target],
        heartbeat_interval_s=0.5,
        peer_exchange=False,
        nat_traversal=False,
    )
    transport = Libp2pTransport(config, Identity.generate())
    await transport.start()
    await transport.subscribe(topic)
    return transport


async def wave(target: str, topic: str, count: int, stay_s: float) -> None:
    t0 = time.monotonic()
    results = await asyncio.gather(
        *(_one(target, topic) for _ in range(count)), return_exceptions=True
    )
    started = [r for r in results if isinstance(r, Libp2pTransport)]
    try:
        await asyncio.sleep(stay_s)
    finally:
        await asyncio.gather(*(t.stop() for t in started), return_exceptions=True)
    emit(
        "wave",
        started=len(started),
        failed=count - len(started),
        seconds=round(time.monotonic() - t0, 3),
    )


async def main(args: argparse.Namespace) -> None:
    emit("ready")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        words = line.decode().split()
        if not line or words[:1] == ["quit"]:
            return
        if words[:1] == ["wave"]:
            await wave(args.target, args.topic, int(words[1]), float(words[2]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--topic", required=True)
    asyncio.run(main(parser.parse_args()))
