"""In-process swarms of tiny-model nodes sharing weight deltas (tests and the delta
benchmarks, `benchmarks/delta_frontier.py` and `benchmarks/choco_consensus.py`).

Nodes of the built-in tiny model with the SAME initial weights (one model family) run the
production `Node` round loop in one process over the memory transport, on the wall
clock, every learner call run inline (sequential and seeded: a run repeats exactly):
`PolicyLearner` with real GRPO steps, learning the `digit` task from scratch with the
demo's settings, SAPO 4 local / 4 external, each node its own task seed. Poisoners are
`simnet.hostile.PoisonLearner`s (their deltas scaled by -1000) beside the honest nodes.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import Any

from gossip.layer import Gossip
from gossip.memory import MemoryNetwork, MemoryTransport
from node.metrics import read_metrics
from node.policy_learner import PolicyLearner
from node.runner import Node
from simnet.hostile import PoisonLearner
from swarm.clock import WallClock
from swarm.config import NodeConfig, parse_config
from swarm.identity import Identity


def node_config(
    root: Path, name: str, seed: int, index: int, deltas: dict[str, Any] | None
) -> NodeConfig:
    """Node `index` of a run with `seed`; `deltas`: the `[deltas]` section's settings
    (None: delta sharing off)."""
    return parse_config(
        {
            "node": {"name": name, "data_dir": str(root / name), "checkpoint_every": 10_000},
            "transport": {"type": "memory"},
            "model": {"name_or_path": "builtin:tiny", "seed": seed},  # one family per run
            "sampler": {"group_size": 8, "max_new_tokens": 2},
            "train": {"learning_rate": 3e-4, "entropy_coef": 0.0},  # as measured (issue 34)
            "rewards": {"format_weight": 0.5},
            "tasks": {"seed": 100 * seed + index, "mixture": [{"source": "digit"}]},
            "sapo": {"local_groups": 4, "external_groups": 4, "max_staleness": 4},
            "deltas": {"enabled": deltas is not None, **(deltas or {})},
        }
    )


async def _inline(fn: Any, *args: Any) -> Any:
    await asyncio.sleep(0)
    return fn(*args)


def run_swarm(
    root: Path,
    deltas: dict[str, Any] | None,
    seed: int,
    rounds: int,
    nodes: int,
    poisoners: int = 0,
) -> dict[str, float]:
    """Run `nodes` honest nodes and `poisoners` poisoners for `rounds` rounds; what the
    honest nodes did: mean cumulative reward (sum over rounds of the mean reward of a
    node's own samples), mean payload bytes per delta share, dense fp32 bytes of the
    model, merges that took at least one peer's delta, the most peers one merge took, and
    drops."""
    network = MemoryNetwork(f"deltas-{seed}")
    members = []
    for index in range(nodes + poisoners):
        name = f"n{index}"
        config = node_config(root, name, seed, index, deltas)
        identity = Identity.from_seed(bytes([seed + 1, index + 1]) * 16)
        clock = WallClock()
        transport = MemoryTransport(config.transport, identity, network=network)
        gossip = Gossip(transport, identity, config.node.swarm_id, config.gossip, clock)
        learner_cls = PoisonLearner if index >= nodes else PolicyLearner
        learner = learner_cls(config)  # sampling seeds differ per node via tasks.seed
        members.append(Node(config, gossip, learner, clock, offload=_inline))

    async def main() -> None:
        await asyncio.gather(*(m.run(rounds) for m in members))

    asyncio.run(main())
    honest = members[:nodes]
    cumulative, share_bytes, fp32 = [], [], 0
    merges = most_peers = 0
    for member in honest:
        records = read_metrics(member.data_dir / "metrics.jsonl")
        cumulative.append(sum(r["mean_local_reward"] or 0.0 for r in records))
        share_bytes += [
            r["deltas"]["bytes_out"]
            for r in records
            if r.get("deltas") and r["deltas"].get("bytes_out")
        ]
        fp32 = 4 * sum(p.numel() for p in member.learner.model.parameters())
        aggregates = [
            r["deltas"]["aggregate"]
            for r in records
            if r.get("deltas") and r["deltas"].get("aggregate")
        ]
        merges += sum(1 for a in aggregates if a.get("peers", 0) > 0)
        most_peers = max([most_peers, *(a.get("peers", 0) for a in aggregates)])
    return {
        "cumulative": statistics.fmean(cumulative),
        "bytes_per_share": statistics.fmean(share_bytes) if share_bytes else 0.0,
        "fp32": fp32,
        "merges": merges,
        "most_peers_merged": most_peers,
        "drops": sum(
            sum(read_metrics(m.data_dir / "metrics.jsonl")[-1]["drops"].values()) for m in honest
        ),
    }
