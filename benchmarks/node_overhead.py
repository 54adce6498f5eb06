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
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from node.build import apply_overrides, build_node
from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from simnet.stats import paired_ratio_interval
from swarm.config import load_config

MODEL_CALLS = ("sample", "train", "evaluate")


@contextlib.contextmanager
def model_busy() -> Iterator[list[tuple[str, float, float]]]:
    """Record (call, start, end) of every `PolicyLearner` sample / train / evaluate call
    in this process (the model's work, in whichever thread runs it)."""
    from node.policy_learner import PolicyLearner

    calls: list[tuple[str, float, float]] = []
    originals = {name: getattr(PolicyLearner, name) for name in MODEL_CALLS}

    def timed(name: str, original: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                calls.append((name, start, time.perf_counter()))

        return call

    for name, original in originals.items():
        setattr(PolicyLearner, name, timed(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(PolicyLearner, name, original)


def model_idle(calls: list[tuple[str, float, float]], warmup: int = 2) -> dict[str, float]:
    """The model's idle time between the end of train call `warmup` and the end of the last
    one: `idle_fraction` of that span and `idle_ms` per round."""
    ends = sorted(end for name, _, end in calls if name == "train")
    start, stop = ends[warmup - 1], ends[-1]
    busy, covered = 0.0, start
    for _, a, b in sorted(calls, key=lambda c: c[1]):
        a, b = max(a, covered), min(b, stop)
        if b > a:
            busy += b - a
            covered = b
    span = stop - start
    rounds = len(ends) - warmup
    return {"idle_fraction": 1 - busy / span, "idle_ms": 1000 * (span - busy) / rounds}


def run_silo(
    root: Path, rounds: int, background: bool = True, every: int = 5
) -> tuple[list[dict], dict[str, float]]:
    """A silo node's metrics records and its model's idle time (`model_idle`)."""
    config_path = write_configs(1, rounds, root / f"silo-{background}")[0]
    overrides = {
        "transport": {"type": "memory"},
        "sapo": {"external_groups": 0},
        "node": {"checkpoint_every": every, "background_checkpoints": background},
    }
    config = apply_overrides(load_config(config_path), overrides, str(config_path))
    with model_busy() as calls:
        asyncio.run(build_node(config).run(rounds))
    return read_metrics(Path(config.node.data_dir) / "metrics.jsonl"), model_idle(calls)


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
           "outside sample+train+eval", "model idle (measured)")  # fmt: skip


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
        "-" if "idle_ms" not in s else f"{100 * s['idle_fraction']:.2f}% ({s['idle_ms']:.2f} ms)",
    ]


def silo_in(tree: Path, root: Path, rounds: int) -> tuple[list[dict], dict[str, float]]:
    """`run_silo` (background checkpoints) in a fresh process running the node code of the
    checkout `tree` (this file's measuring code, loaded by path)."""
    out = root / "records.json"
    code = (
        "import importlib.util, json, sys; from pathlib import Path; "
        f"spec = importlib.util.spec_from_file_location('overhead', {__file__!r}); "
        "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench); "
        f"json.dump(bench.run_silo(Path({str(root)!r}), {rounds}), open({str(out)!r}, 'w'))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, check=True)
    records, idle = json.loads(out.read_text())
    return records, idle


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
                records, idle = silo_in(trees[name], root, rounds)
                runs[name].append({**phases(records), **idle})
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
    for key, unit in (("wall", "wall per round, ms"), ("idle_ms", "model idle per round, ms")):
        scale = 1000 if key == "wall" else 1
        values = {name: [r[key] * scale for r in results] for name, results in runs.items()}
        ratio = paired_ratio_interval(
            [a / b for a, b in zip(values["this tree"], values["baseline"], strict=True)]
        )
        interval = "" if ratio.low is None else f" [{ratio.low:.3f}, {ratio.high:.3f}]"
        console.print(
            f"{unit}: "
            + "; ".join(f"{n}: " + ", ".join(f"{v:.2f}" for v in vs) for n, vs in values.items())
            + f"\n  this tree / baseline, paired: {ratio.mean:.3f}{interval}"
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
        silo_foreground, idle_foreground = run_silo(root, args.rounds, background=False)
        console.print(f"silo node, {args.rounds} rounds, checkpoints in the background ...")
        silo, idle = run_silo(root, args.rounds)
        console.print(f"3-node swarm over libp2p, {args.rounds} rounds ...")
        swarm = run_swarm(root, args.rounds)
    table = Table(title="node overhead per round (ms; means after 2 warm-up rounds)")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    table.add_row(*row("silo, ckpt in round", {**phases(silo_foreground), **idle_foreground}))
    table.add_row(*row("silo, ckpt background", {**phases(silo), **idle}))
    for index, records in enumerate(swarm):
        table.add_row(*row(f"swarm node-{index} (4/4)", phases(records)))
    console.print(table)


if __name__ == "__main__":
    main()
