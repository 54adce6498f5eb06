"""Round and training-step time of a node on 1 training rank against 2 (DDP, FSDP), on
this machine's CPUs (issue 36). One table.

    python benchmarks/parallel_rounds.py [--rounds 12] [--models tiny smollm2]
        [--arms none ddp fsdp ddp-sampling fsdp-sampling]

Each row is a real `swarm train` process (the node's whole loop, no network) from a fresh
data dir, the same config but `train.parallel` / `train.ranks`; times are medians over the
rounds after the first two (model loading and warm-up excluded) from its metrics.jsonl.
On a CPU the ranks share the cores, so this shows the cost of the engines (the command
broadcast, gradient all-reduce or reduce-scatter, FSDP's all-gathers and, on FSDP's rank
0, gathering the whole weights after each step), not a speed-up: on GPUs each rank has
its own device. The `-sampling` arms sample on both ranks (`sampler.data_parallel`): each
rank's sampler takes half of the round's prompts. Train times are medians over the rounds
that took an optimizer step (the tiny model's all-zero groups give rounds without one).
`smollm2` needs `python -m policy.gguf_import .cache/smollm2-135m-instruct`.
"""

from __future__ import annotations

import argparse
import itertools
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
ARMS = {
    "none": ("none", 1, False),
    "ddp": ("ddp", 2, False),
    "fsdp": ("fsdp", 2, False),
    "ddp-sampling": ("ddp", 2, True),
    "fsdp-sampling": ("fsdp", 2, True),
}
"""name: (train.parallel, train.ranks, sampler.data_parallel: every rank samples a share)."""


def run_arm(model: str, arm: str, rounds: int, folder: Path) -> dict:
    parallel, ranks, on_ranks = ARMS[arm]
    config = json.loads(json.dumps(MODELS[model]))
    config["node"] = {"name": f"{model}-{arm}", "data_dir": str(folder / "data")}
    config.setdefault("train", {}).update({"parallel": parallel, "ranks": ranks})
    if on_ranks:
        config.setdefault("sampler", {})["data_parallel"] = True
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
    stepped = [
        r["seconds"]["train"]
        for before, r in itertools.pairwise(records[1:])
        if r["policy_version"] > before["policy_version"]
    ]
    return {
        "round": statistics.median(r["seconds"]["total"] for r in timed),
        "train": statistics.median(stepped or [0.0]),
        "sample": statistics.median(r["seconds"]["sample"] for r in timed),
        "wall": wall,
        "version": records[-1]["policy_version"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--arms", nargs="+", default=["none", "ddp", "fsdp"], choices=list(ARMS),
        help="the first is the baseline of the 'vs 1 rank' columns",
    )  # fmt: skip
    args = parser.parse_args()
    print(
        "| model | arm | ranks | round s (median) | sample s | train s | sample vs first "
        "| train vs first | process wall s | optimizer steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        if model == "smollm2" and not (SMOLLM2 / "config.json").exists():
            print(f"| {model} | skipped: build it with python -m policy.gguf_import {SMOLLM2} |")
            continue
        base: dict | None = None
        for arm in args.arms:
            with tempfile.TemporaryDirectory() as tmp:
                result = run_arm(model, arm, args.rounds, Path(tmp))
            base = base or result
            print(
                f"| {model} | {arm} | {ARMS[arm][1]} | {result['round']:.3f} | "
                f"{result['sample']:.3f} | {result['train']:.3f} | "
                f"{result['sample'] / base['sample']:.2f}x | "
                f"{result['train'] / base['train']:.2f}x | "
                f"{result['wall']:.1f} | {result['version']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
