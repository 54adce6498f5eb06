"""`swarm peers`: a gossip endpoint without a model, printing what the swarm says.

Useful to check connectivity before joining with a GPU: it shows listen addresses,
every message that arrives (kind, sender, policy version, size) and the drop counters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from node.build import build_gossip
from swarm.clock import WallClock
from swarm.config import NodeConfig
from swarm.identity import load_or_create_key_file
from swarm.messages import Hello, RolloutBatch
from swarm.transport import peers_topic, rollouts_topic

COUNTERS_EVERY_S = 5.0


async def listen_and_print(config: NodeConfig, seconds: float, emit: Callable[[str], None]) -> None:
    identity = load_or_create_key_file(config.node.resolved_key_file)
    gossip = build_gossip(config, identity)
    clock = WallClock()
    await gossip.start()
    try:
        for topic in (peers_topic(config.node.swarm_id), rollouts_topic(config.node.swarm_id)):
            await gossip.subscribe(topic)
        emit(
            json.dumps(
                {
                    "event": "started",
                    "peer_id": identity.peer_id,
                    "listen": list(getattr(gossip.transport, "listen_addrs", list)()),
                }
            )
        )
        deadline = clock.now() + seconds if seconds > 0 else None
        next_counters = clock.now() + COUNTERS_EVERY_S
        while deadline is None or clock.now() < deadline:
            timeout = min(next_counters, deadline or next_counters) - clock.now()
            try:
                received = await asyncio.wait_for(gossip.receive(), timeout=max(timeout, 0.01))
            except TimeoutError:
                received = None
            if received is not None:
                message = received.message
                line = {
                    "event": "message",
                    "kind": received.envelope.kind,
                    "sender": received.envelope.sender,
                    "policy_version": received.envelope.policy_version,
                    "bytes": received.size_bytes,
                }
                if isinstance(message, Hello):
                    line["model_id"] = message.model_id
                    line["policy_version"] = message.policy_version
                elif isinstance(message, RolloutBatch):
                    line["groups"] = len(message.groups)
                emit(json.dumps(line))
            if clock.now() >= next_counters:
                emit(
                    json.dumps(
                        {
                            "event": "counters",
                            "peers": gossip.transport.connected_peers(),
                            **gossip.counters.snapshot(),
                        }
                    )
                )
                next_counters = clock.now() + COUNTERS_EVERY_S
        emit(
            json.dumps(
                {
                    "event": "counters",
                    "peers": gossip.transport.connected_peers(),
                    **gossip.counters.snapshot(),
                }
            )
        )
    finally:
        await gossip.stop()
