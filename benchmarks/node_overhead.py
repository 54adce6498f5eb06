"""How much of a round the node's model spends idle: time outside sampling and training.

Runs, in one go: a silo node (in-process, memory transport, J = 0, a checkpoint every 5
rounds, written in the round and then in the background) and a 3-node swarm
(three `swarm join` OS processes over libp2p on 127.0.0.1, I = 4 / J = 4), all with the
built-in tiny model, and prints one table from their metrics.jsonl files.

    .venv/bin/python benchmarks/node_overhead.py --rounds 30
    .venv/bin/python benchmarks/node_overhead.py --rounds 30 --baseline-tree /tmp/base --pairs 5

Overhead = 1 - (sample + train) / wall time per round, where sample and train are the
worker's own seconds (`seconds.sample`, `seconds.train`) and the wall time runs from one
round's metrics record to the next: scoring, publishing, pool selection, checkpointing,
held-out evaluation, hand-offs between threads and writing the round's outputs are all
overhead (target < 2%). A round sampled ahead of itself (prefetch, `node.own_samples`)
hides work behind sampling; its `seconds.sample_wait` is the part the round still waited.
"outside sample+train+eval" counts the held-out evaluation (greedy sampling every
`eval.every` rounds, the loop's whole wait for it) as model work too.

`--baseline-tree DIR` also runs the silo from another checkout of this project (e.g. `git
worktree add /tmp/base <commit>`), alternating with this tree `--pairs` times in fresh
processes, and prints the two trees' silo rows side by side with the mean wall per round.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
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


def phases(records: list[dict]) -> dict[str, float]:
    """Mean seconds per round after 2 warm-up rounds (first allocations, mesh forming):
    the record's phases, plus `wall` (record r-1 to record r spans round r) and `wait`
    (the round's wait for its samples; before `sample_wait` existed: sample + score)."""
    records = records[2:]
    keys = ("total", "sample", "score", "train", "publish", "checkpoint", "eval", "other")
    s = {k: statistics.fmean(r["seconds"].get(k, 0.0) for r in records) for k in keys}
    s["wait"] = statistics.fmean(
        r["seconds"].get("sample_wait", r["seconds"]["sample"] + r["seconds"]["score"])
        for r in records
    )
    s["wall"] = statistics.fmean(b["time"] - a["time"] for a, b in itertools.pairwise(records))
    later = records[1:]
    s["busy"] = statistics.fmean(r["seconds"]["sample"] + r["seconds"]["train"] for r in later)
    s["busy_eval"] = s["busy"] + statistics.fmean(r["seconds"]["eval"] for r in later)
    s["external"] = statistics.fmean(r["external_groups"] for r in records)
    return s


COLUMNS = ("setup", "round", "wall", "sample", "waited", "train", "score", "publish", "ckpt",
           "eval", "other", "ext groups", "outside sample+train",
           "outside sample+train+eval")  # fmt: skip


def row(name: str, s: dict[str, float]) -> list[str]:
    ms = [s[k] * 1000 for k in ("total", "wall", "sample", "wait", "train")]
    small = [s[k] * 1000 for k in ("score", "publish", "checkpoint", "eval", "other")]
    return [
        name,
        *(f"{v:.1f}" for v in ms),
        *(f"{v:.2f}" for v in small),
        f"{s['external']:.1f}",
        f"{100 * (1 - s['busy'] / s['wall']):.2f}%",
        f"{100 * (1 - s['busy_eval'] / s['wall']):.2f}%",
    ]


def silo_in(tree: Path, root: Path, rounds: int) -> list[dict]:
    """`run_silo` (background checkpoints) in a fresh process from the checkout `tree`."""
    out = root / "records.json"
    code = (
        "import json, sys; from pathlib import Path; "
        "from benchmarks.node_overhead import run_silo; "
        f"json.dump(run_silo(Path({str(root)!r}), {rounds}), open({str(out)!r}, 'w'))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=tree, check=True)
    return json.loads(out.read_text())


def compare_trees(baseline: Path, rounds: int, pairs: int, console: Console) -> None:
    here = Path(__file__).resolve().parents[1]
    trees = {"baseline": baseline.resolve(), "this tree": here}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(pairs):
            order = list(trees) if pair % 2 == 0 else list(reversed(trees))  # ABBA
            for name in order:
                console.print(f"pair {pair + 1}/{pairs}: silo from {name} ({trees[name]}) ...")
                root = Path(tmp) / f"{name.replace(' ', '-')}-{pair}"
                runs[name].append(phases(silo_in(trees[name], root, rounds)))
    table = Table(title=f"silo, background checkpoints, {pairs} runs per tree, alternated "
                        "(ms; means over runs)")  # fmt: skip
    for col in COLUMNS:
        table.add_column(col, justify="right")
    means = {}
    for name, results in runs.items():
        mean = {k: statistics.fmean(r[k] for r in results) for k in results[0]}
        means[name] = mean
        table.add_row(*row(name, mean))
    console.print(table)
    walls = {name: [r["wall"] for r in results] for name, results in runs.items()}
    ratio = statistics.fmean(walls["this tree"]) / statistics.fmean(walls["baseline"])
    console.print(
        "wall per round, per run (ms): "
        + "; ".join(f"{n}: " + ", ".join(f"{w * 1000:.1f}" for w in ws) for n, ws in walls.items())
        + f"\nthis tree / baseline: {ratio:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--baseline-tree", type=Path, default=None)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    console = Console(width=220)
    if args.baseline_tree is not None:
        compare_trees(args.baseline_tree, args.rounds, args.pairs, console)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        console.print(f"silo node, {args.rounds} rounds, checkpoints written in the round ...")
        silo_foreground = run_silo(root, args.rounds, background=False)
        console.print(f"silo node, {args.rounds} rounds, checkpoints in the background ...")
        silo = run_silo(root, args.rounds)
        console.print(f"3-node swarm over libp2p, {args.rounds} rounds ...")
        swarm = run_swarm(root, args.rounds)
    table = Table(title="node overhead per round (ms; means after 2 warm-up rounds)")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    table.add_row(*row("silo, ckpt in round", phases(silo_foreground)))
    table.add_row(*row("silo, ckpt background", phases(silo)))
    for index, records in enumerate(swarm):
        table.add_row(*row(f"swarm node-{index} (4/4)", phases(records)))
    console.print(table)


if __name__ == "__main__":
    main()
