"""The compression / quality frontier of weight-delta sharing, measured in one run.

Four nodes of the built-in tiny model with the SAME initial weights (one model family)
run the production `Node` round loop in one process over the memory transport (sequential
and seeded; `PolicyLearner` with real GRPO steps), learning the `digit` task from scratch
with the demo's settings, SAPO 4 local / 4 external. For each setting, and several seeds:
cumulative reward (sum over rounds of the mean reward of a node's own samples, averaged
over honest nodes) and payload bytes per delta share relative to dense fp32.

Settings: rollout sharing only (no deltas), dense fp16 deltas, three top-k settings, and
the default top-k with one extra hostile node publishing its deltas scaled by -1000. The
swarm itself is `tests/node/delta_swarm.py` (so its test runs the same code).

    .venv/bin/python benchmarks/delta_frontier.py --rounds 60 --seeds 3
"""

from __future__ import annotations

import argparse
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

from tests.node.delta_swarm import run_swarm

SETTINGS: dict[str, dict[str, Any] | None] = {
    "no deltas": None,
    "dense fp16": {"encoding": "dense_fp16"},
    "top-k 1/16, 8 bit": {"density": 1 / 16, "bits": 8},
    "top-k 1/32, 4 bit": {"density": 1 / 32, "bits": 4},
    "top-k 1/64, 2 bit (default)": {},
    "default + 1 poisoner": {},
    "undefended (mean, no clip) + 1 poisoner": {"aggregator": "mean", "clip_multiple": None},
}


def run_one(root: Path, setting: str, seed: int, rounds: int, nodes: int) -> dict[str, float]:
    poisoners = 1 if "poisoner" in setting else 0
    return run_swarm(root, SETTINGS[setting], seed, rounds, nodes, poisoners)


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
