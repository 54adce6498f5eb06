"""Building small in-process swarms of real `Node`s with the stub learner."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gossip.layer import Gossip
from gossip.memory import MemoryNetwork, MemoryTransport
from node.runner import Node
from simnet.stub import StubLearner
from swarm.clock import WallClock
from swarm.config import NodeConfig, parse_config
from swarm.identity import Identity


async def run_inline(fn: Any, *args: Any) -> Any:
    """Offload for the stub learner: run inline, but yield so gossip tasks get turns."""
    for _ in range(3):
        await asyncio.sleep(0)
    return fn(*args)


def stub_config(tmp: Path, name: str, **sapo: Any) -> NodeConfig:
    """Fixed seeds (a node would derive unset ones from its key): every stub node of a
    test samples the same task stream, as the tests were written for; `add` tasks, which
    the tests' hand-made peer groups are (`tests/node/test_version_claims.batch`)."""
    return parse_config(
        {
            "node": {"name": name, "data_dir": str(tmp / name), "checkpoint_every": 5},
            "transport": {"type": "memory"},
            "sapo": {"local_groups": 4, "external_groups": 4, **sapo},
            "sampler": {"group_size": 8},
            "model": {"seed": 0},
            "tasks": {"seed": 0, "mixture": [{"source": "add"}]},
        }
    )


def stub_node(config: NodeConfig, network: MemoryNetwork, seed: int = 0, **node: Any) -> Node:
    """A `Node` with the stub learner; `node` overrides its keyword arguments (by default
    every call is offloaded with `run_inline`)."""
    identity = Identity.from_seed(bytes([seed + 1]) * 32)
    transport = MemoryTransport(config.transport, identity, network=network)
    clock = WallClock()
    gossip = Gossip(transport, identity, config.node.swarm_id, config.gossip, clock)
    learner = StubLearner(config.sampler.group_size, config.rewards, skill=0.3)
    return Node(config, gossip, learner, clock, **{"offload": run_inline, **node})
