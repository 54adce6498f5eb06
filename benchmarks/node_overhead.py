"""How much of a round the node spends outside sampling and training.

Runs, in one go: a silo node (in-process, memory transport, J = 0, a checkpoint every 5
rounds, written in the round and then in the background) and a 3-node swarm
(three `swarm join` OS processes over libp2p on 127.0.0.1, I = 4 / J = 4), all with the
built-in tiny model, and prints one table from their metrics.jsonl files.

    .venv/bin/python benchmarks/node_overhead.py --rounds 30

Overhead = 1 - (sample + train) / round time; scoring, publishing, pool selection and
checkpointing are all counted as overhead (target < 5%). The round time is the round's
own `seconds.total`, which ends before the round's outputs are written (the metrics line
on the event loop; samples, `peers.json` and logger backends handed to a writer thread,
`node.round_outputs`); the last column uses the wall time from one round's record to the
next instead, so it counts those writes and the gap between rounds too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from node.build import apply_overrides, build_node
from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from swarm.config import load_config


def run_silo(root: Path, rounds: int, background: bool = True, every: int = 5) -> list[dict]:
    config_path = write_configs(1, rounds, root / f"silo-{background}")[0]
    overrides = {
        "transport": {"type": "memory"},
        "sapo": {"external_groups": 0},
        "node": {"checkpoint_every": every, "background_checkpoints": background},
    }
    config = apply_overrides(load_config(config_path), overrides, str(config_path))
    asyncio.run(build_node(config).run(rounds))
    return read_metrics(Path(config.node.data_dir) / "metrics.jsonl")


def run_swarm(root: Path, rounds: int, nodes: int = 3) -> list[list[dict]]:
    configs = write_configs(nodes, rounds, root / "swarm")
    procs = []
    for config in configs:
        procs.append(
            spawn_join(config, rounds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        time.sleep(0.3)
    for proc in procs:
        if proc.wait(timeout=900) != 0:
            raise SystemExit(f"a swarm node failed (exit {proc.returncode})")
    return [read_metrics(root / "swarm" / f"node-{i}" / "metrics.jsonl") for i in range(nodes)]


def row(name: str, records: list[dict]) -> list[str]:
    records = records[2:]  # skip warm-up rounds (first allocations, mesh forming)
    s = {k: statistics.fmean(r["seconds"][k] for r in records) for k in records[0]["seconds"]}
    outside = 1 - (s["sample"] + s["train"]) / s["total"]
    outside_scored = 1 - (s["sample"] + s["train"] + s["score"]) / s["total"]
    outside_no_ckpt = 1 - (s["sample"] + s["train"] + s["checkpoint"]) / s["total"]
    # Record r-1 to record r spans round r: compare with rounds 1.. of the kept records.
    wall = statistics.fmean(b["time"] - a["time"] for a, b in itertools.pairwise(records))
    busy = statistics.fmean(r["seconds"]["sample"] + r["seconds"]["train"] for r in records[1:])
    outside_wall = 1 - busy / wall
    external = statistics.fmean(r["external_groups"] for r in records)
    return [
        name,
        f"{s['total'] * 1000:.0f}",
        f"{s['sample'] * 1000:.0f}",
        f"{s['train'] * 1000:.0f}",
        f"{s['score'] * 1000:.1f}",
        f"{s['publish'] * 1000:.1f}",
        f"{s['checkpoint'] * 1000:.1f}",
        f"{s['other'] * 1000:.1f}",
        f"{external:.1f}",
        f"{100 * outside:.2f}%",
        f"{100 * outside_scored:.2f}%",
        f"{100 * outside_no_ckpt:.2f}%",
        f"{wall * 1000:.0f}",
        f"{100 * outside_wall:.2f}%",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        console.print(f"silo node, {args.rounds} rounds, checkpoints written in the round ...")
        silo_foreground = run_silo(root, args.rounds, background=False)
        console.print(f"silo node, {args.rounds} rounds, checkpoints in the background ...")
        silo = run_silo(root, args.rounds)
        console.print(f"3-node swarm over libp2p, {args.rounds} rounds ...")
        swarm = run_swarm(root, args.rounds)
    table = Table(title="node overhead per round (ms; means after 2 warm-up rounds)")
    for col in (
        "setup",
        "round",
        "sample",
        "train",
        "score",
        "publish",
        "ckpt",
        "other",
        "ext groups",
        "outside sample+train",
        "outside sample+train+score",
        "outside sample+train+ckpt",
        "wall per round",
        "outside sample+train (wall)",
    ):
        table.add_column(col, justify="right")
    table.add_row(*row("silo, ckpt in round", silo_foreground))
    table.add_row(*row("silo, ckpt background", silo))
    for index, records in enumerate(swarm):
        table.add_row(*row(f"swarm node-{index} (4/4)", records))
    console.print(table)


if __name__ == "__main__":
    main()
