"""The compression / quality frontier of weight-delta sharing, measured in one run.

Four nodes of the built-in tiny model with the SAME initial weights (one model family)
run the production `Node` round loop in one process over the memory transport (sequential
and seeded; `PolicyLearner` with real GRPO steps), learning the `digit` task from scratch
with the demo's settings, SAPO 4 local / 4 external. For each setting, and several seeds:
cumulative reward (sum over rounds of the mean reward of a node's own samples, averaged
over honest nodes) and payload bytes per delta share relative to dense fp32.

Settings: rollout sharing only (no deltas), dense fp16 deltas, three top-k settings, and
the default top-k with one extra hostile node publishing its deltas scaled by -1000.

    .venv/bin/python benchmarks/delta_frontier.py --rounds 60 --seeds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from gossip.layer import Gossip
from gossip.memory import MemoryNetwork, MemoryTransport
from node.metrics import read_metrics
from node.policy_learner import PolicyLearner
from node.runner import Node
from simnet.hostile import PoisonLearner
from swarm.clock import WallClock
from swarm.config import NodeConfig, parse_config
from swarm.identity import Identity

SETTINGS: dict[str, dict[str, Any] | None] = {
    "no deltas": None,
    "dense fp16": {"encoding": "dense_fp16"},
    "top-k 1/16, 8 bit": {"density": 1 / 16, "bits": 8},
    "top-k 1/32, 4 bit": {"density": 1 / 32, "bits": 4},
    "top-k 1/64, 2 bit (default)": {},
    "default + 1 poisoner": {},
    "undefended (mean, no clip) + 1 poisoner": {"aggregator": "mean", "clip_multiple": None},
}
POISONED = "default + 1 poisoner"


def node_config(
    root: Path, name: str, seed: int, index: int, deltas: dict[str, Any] | None
) -> NodeConfig:
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


def run_one(root: Path, setting: str, seed: int, rounds: int, nodes: int) -> dict[str, float]:
    network = MemoryNetwork(f"{setting}-{seed}")
    deltas = SETTINGS[setting]
    members = []
    count = nodes + (1 if "poisoner" in setting else 0)
    for index in range(count):
        name = f"n{index}"
        config = node_config(root, name, seed, index, deltas)
        identity = Identity.from_seed(bytes([seed + 1, index + 1]) * 16)
        clock = WallClock()
        transport = MemoryTransport(config.transport, identity, network=network)
        gossip = Gossip(transport, identity, config.node.swarm_id, config.gossip, clock)
        learner_cls = PoisonLearner if index == nodes else PolicyLearner
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--only", nargs="*", default=None, help="Run only these settings.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console(width=150)
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.only or SETTINGS:
            for seed in range(args.seeds):
                start = time.perf_counter()
                out = run_one(
                    Path(tmp) / f"{len(results)}-{seed}", setting, seed, args.rounds, args.nodes
                )
                results.setdefault(setting, []).append(out)
                console.print(
                    f"{setting:<30} seed {seed}: cumulative {out['cumulative']:.2f}, "
                    f"{out['bytes_per_share']:.0f} B/share ({time.perf_counter() - start:.0f}s)",
                    highlight=False,
                )
    shape = f"{args.nodes} honest nodes, {args.rounds} rounds, {args.seeds} seeds"
    table = Table(title=f"delta sharing frontier ({shape})")
    for col in (
        "setting",
        "bytes/share",
        "x smaller than fp32",
        "cumulative reward",
        "seed std",
        "vs no deltas",
    ):
        table.add_column(col, justify="right")
    baseline = statistics.fmean(
        r["cumulative"] for r in results.get("no deltas", [{"cumulative": 1.0}])
    )
    for setting, runs in results.items():
        cum = [r["cumulative"] for r in runs]
        per_share = statistics.fmean(r["bytes_per_share"] for r in runs)
        ratio = runs[0]["fp32"] / per_share if per_share else float("nan")
        table.add_row(
            setting,
            f"{per_share:,.0f}" if per_share else "-",
            f"{ratio:.0f}x" if per_share else "-",
            f"{statistics.fmean(cum):.2f}",
            f"{statistics.pstdev(cum):.2f}",
            f"{statistics.fmean(cum) / baseline:.2f}x",
        )
    console.print(table)


if __name__ == "__main__":
    main()
