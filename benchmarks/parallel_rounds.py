"""Round and training-step time of a node on 1 training rank against 2 (DDP, FSDP), on
this machine's CPUs (issue 36). One table.

    python benchmarks/parallel_rounds.py [--rounds 12] [--models tiny smollm2]

Each row is a real `swarm train` process (the node's whole loop, no network) from a fresh
data dir, the same config but `train.parallel` / `train.ranks`; times are medians over the
rounds after the first two (model loading and warm-up excluded) from its metrics.jsonl.
On a CPU the ranks share the cores, so this shows the cost of the engines (the command
broadcast, gradient all-reduce or reduce-scatter, FSDP's all-gathers and, on FSDP's rank
0, gathering the whole weights after each step), not a speed-up: on GPUs each rank has
its own device. `smollm2` needs `python -m policy.gguf_import .cache/smollm2-135m-instruct`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".cache" / "smollm2-135m-instruct"

MODELS = {
    "tiny": {"model": {"seed": 0}},
    "smollm2": {
        "model": {"name_or_path": str(SMOLLM2), "lora": {"enabled": True}},
        "sampler": {"max_new_tokens": 24, "group_size": 8},
        "tasks": {"mixture": [{"source": "rg:gcd"}]},
        "rewards": {"format_weight": 0.0},
        "train": {"learning_rate": 2e-4},
    },
}
ARMS = [("none", 1), ("ddp", 2), ("fsdp", 2)]


def run_arm(model: str, parallel: str, ranks: int, rounds: int, folder: Path) -> dict:
    config = json.loads(json.dumps(MODELS[model]))
    config["node"] = {"name": f"{model}-{parallel}", "data_dir": str(folder / "data")}
    config.setdefault("train", {}).update({"parallel": parallel, "ranks": ranks})
    path = folder / "node.toml"
    path.write_text(tomli_w.dumps(config))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "train", "-c", str(path), "--rounds", str(rounds)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{model} {parallel}: exit {done.returncode}\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (folder / "data" / "metrics.jsonl").open()]
    timed = records[2:] or records
    return {
        "round": statistics.median(r["seconds"]["total"] for r in timed),
        "train": statistics.median(r["seconds"]["train"] for r in timed),
        "wall": wall,
        "version": records[-1]["policy_version"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    print(
        "| model | parallel | ranks | round s (median) | train s (median) | train vs 1 rank "
        "| process wall s | optimizer steps |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models:
        if model == "smollm2" and not (SMOLLM2 / "config.json").exists():
            print(f"| {model} | skipped: build it with python -m policy.gguf_import {SMOLLM2} |")
            continue
        base = None
        for parallel, ranks in ARMS:
            with tempfile.TemporaryDirectory() as tmp:
                result = run_arm(model, parallel, ranks, args.rounds, Path(tmp))
            base = base or result["train"]
            print(
                f"| {model} | {parallel} | {ranks} | {result['round']:.3f} | "
                f"{result['train']:.3f} | {result['train'] / base:.2f}x | "
                f"{result['wall']:.1f} | {result['version']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
