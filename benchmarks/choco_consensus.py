"""Consensus distance, reward and bytes of the delta schemes: CHOCO vs merge vs none.

Four nodes of the built-in tiny model with the SAME initial weights (one model family)
run the production `Node` round loop in one process over the memory transport (the
setup of `tests/node/delta_swarm.py`: `PolicyLearner` with real GRPO steps, the
`digit` task from scratch, SAPO 4 local / 4 external, each node its own task seed). Per
round: the consensus distance `mean_i ||x_i - mean_k x_k||` over all trainable
parameters (each node's weights taken when it finishes that round) and the mean reward
of the nodes' own samples; per setting, payload bytes per share (keyframes included).

    .venv/bin/python benchmarks/choco_consensus.py --rounds 60 --seeds 2 --out docs/choco

writes `<out>.json` (every curve) and `<out>.png` (the plot) and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gossip.layer import Gossip
from gossip.memory import MemoryNetwork, MemoryTransport
from node.metrics import read_metrics
from node.policy_learner import PolicyLearner
from node.runner import Node, RoundReport
from policy.choco import consensus_distance
from swarm.clock import WallClock
from swarm.identity import Identity
from tests.node.delta_swarm import node_config

SETTINGS: dict[str, dict[str, Any] | None] = {
    "rollouts only": None,
    "merge, top-k 1/64 2 bit (default)": {},
    "choco, top-k 1/16 4 bit, gamma 0.1": {
        "scheme": "choco",
        "density": 1 / 16,
        "bits": 4,
        "consensus_step": 0.1,
    },
    "choco, top-k 1/64 2 bit, gamma 0.05": {
        "scheme": "choco",
        "consensus_step": 0.05,
    },
    "choco, top-k 1/16 4 bit, gamma 0.1, previous": {
        "scheme": "choco",
        "density": 1 / 16,
        "bits": 4,
        "consensus_step": 0.1,
        "consensus_reference": "previous",
    },
    "choco, dense fp16, gamma 0.5, previous": {
        "scheme": "choco",
        "encoding": "dense_fp16",
        "consensus_step": 0.5,
        "consensus_reference": "previous",
    },
    "choco, dense fp16, gamma 0.5": {
        "scheme": "choco",
        "encoding": "dense_fp16",
        "consensus_step": 0.5,
    },
    "merge, dense fp16": {"encoding": "dense_fp16"},
}


async def _inline(fn: Any, *args: Any) -> Any:
    await asyncio.sleep(0)
    return fn(*args)


class DistanceProbe:
    """Each node's flat weights at the end of each round; the distance once all are in."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.learners: list[PolicyLearner] = []
        self.held: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
        self.distance: dict[int, float] = {}

    def hook(self, index: int) -> Any:
        def on_round(report: RoundReport) -> None:
            model = self.learners[index].model
            snap = {n: p.detach().float().clone() for n, p in model.named_parameters()}
            row = self.held.setdefault(report.round, {})
            row[index] = snap
            if len(row) == self.nodes:
                self.distance[report.round] = consensus_distance(list(row.values()))
                del self.held[report.round]

        return on_round


def run_one(root: Path, setting: str, seed: int, rounds: int, nodes: int) -> dict[str, Any]:
    network = MemoryNetwork(f"{setting}-{seed}")
    deltas = SETTINGS[setting]
    probe = DistanceProbe(nodes)
    members = []
    for index in range(nodes):
        name = f"n{index}"
        config = node_config(root, name, seed, index, deltas)
        identity = Identity.from_seed(bytes([seed + 1, index + 1]) * 16)
        clock = WallClock()
        transport = MemoryTransport(config.transport, identity, network=network)
        gossip = Gossip(transport, identity, config.node.swarm_id, config.gossip, clock)
        learner = PolicyLearner(config)
        probe.learners.append(learner)
        members.append(
            Node(config, gossip, learner, clock, offload=_inline, on_round=probe.hook(index))
        )

    async def main() -> None:
        await asyncio.gather(*(m.run(rounds) for m in members))

    asyncio.run(main())
    reward = [0.0] * rounds
    share_bytes: list[int] = []
    keyframes = 0
    diff_bytes = diff_count = 0
    for member in members:
        records = read_metrics(member.data_dir / "metrics.jsonl")
        for i, r in enumerate(records[:rounds]):
            reward[i] += (r["mean_local_reward"] or 0.0) / nodes
        share_bytes += [
            r["deltas"]["bytes_out"]
            for r in records
            if r.get("deltas") and r["deltas"]["bytes_out"]
        ]
        keyframes += getattr(member.learner.deltas, "keyframes_sent", 0)
        diff_bytes += getattr(member.learner.deltas, "sent_bytes", {}).get("diff", 0)
        diff_count += getattr(member.learner.deltas, "sent_count", {}).get("diff", 0)
    return {
        "distance": [probe.distance.get(r, float("nan")) for r in range(1, rounds + 1)],
        "reward": reward,
        "cumulative": sum(reward),
        "bytes_per_share": statistics.fmean(share_bytes) if share_bytes else 0.0,
        "shares": len(share_bytes),
        "keyframes": keyframes,
        "bytes_per_diff": diff_bytes / diff_count if diff_count else 0.0,
        "fp32": 4 * sum(p.numel() for p in members[0].learner.model.parameters()),
    }


def plot(results: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for setting, runs in results.items():
        rounds = range(1, len(runs[0]["distance"]) + 1)
        dist = [statistics.fmean(r["distance"][i] for r in runs) for i in range(len(rounds))]
        rew = [statistics.fmean(r["reward"][i] for r in runs) for i in range(len(rounds))]
        left.plot(rounds, dist, label=setting)
        window = 5
        smooth = [statistics.fmean(rew[max(0, i - window + 1) : i + 1]) for i in range(len(rew))]
        right.plot(rounds, smooth, label=setting)
    left.set(xlabel="round", ylabel="mean ||x_i - mean x|| (all params)", title="consensus")
    right.set(xlabel="round", ylabel="mean own reward (5-round mean)", title="reward")
    left.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--only", nargs="*", default=None, help="Run only these settings.")
    parser.add_argument("--out", type=Path, default=None, help="Write <out>.json and .png.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console(width=160)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.only or SETTINGS:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                start = time.perf_counter()
                out = run_one(
                    Path(tmp) / f"{len(results)}-{seed}", setting, seed, args.rounds, args.nodes
                )
                results.setdefault(setting, []).append(out)
                if args.out is not None:  # after every run: a partial grid is still usable
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
                console.print(
                    f"{setting:<38} seed {seed}: cumulative {out['cumulative']:.2f}, final "
                    f"distance {out['distance'][-1]:.3f}, {out['bytes_per_share']:.0f} B/share "
                    f"({time.perf_counter() - start:.0f}s)",
                    highlight=False,
                )
    shape = f"{args.nodes} nodes, {args.rounds} rounds, {args.seeds} seeds"
    table = Table(title=f"delta schemes ({shape})")
    for col in (
        "setting",
        "bytes/share",
        "bytes/diff (choco)",
        "keyframes (all nodes)",
        "distance @1/4",
        "@1/2",
        "@end",
        "cumulative reward",
        "per seed",
    ):
        table.add_column(col, justify="right")
    for setting, runs in results.items():
        per_share = statistics.fmean(r["bytes_per_share"] for r in runs)
        n = len(runs[0]["distance"])

        def at(i: int, runs: list[dict[str, Any]] = runs) -> str:
            return f"{statistics.fmean(r['distance'][i] for r in runs):.3f}"

        table.add_row(
            setting,
            f"{per_share:,.0f}" if per_share else "-",
            f"{statistics.fmean(r['bytes_per_diff'] for r in runs):,.0f}",
            f"{statistics.fmean(r['keyframes'] for r in runs):.1f}",
            at(n // 4 - 1),
            at(n // 2 - 1),
            at(n - 1),
            f"{statistics.fmean(r['cumulative'] for r in runs):.2f}",
            " / ".join(f"{r['cumulative']:.2f}" for r in runs),
        )
    console.print(table)
    if args.out is not None:
        plot(results, args.out.with_suffix(".png"), f"delta schemes, builtin:tiny, {shape}")


if __name__ == "__main__":
    main()
