"""A round against the hardware's limit: the FLOPs a round must do, the machine's measured
matmul rate, the fraction achieved, padding, peak memory, and this tree against a
baseline checkout, alternated.

    git worktree add /tmp/base <commit>        # the tree to compare against
    .venv/bin/python benchmarks/round_flops.py --baseline-tree /tmp/base \\
        --real .cache/smollm2-135m-instruct --rounds 3 --pairs 1

Rows: the built-in tiny model, and with `--real` SmolLM2-135M-Instruct full fine-tune and
LoRA (rank 16), on `benchmarks/real_model_silo.py`'s settings: 4 groups x 8 completions
of up to 16 tokens, `add` rendered as a node renders it (chat template, system prompt,
two solved examples: ~217 prompt tokens), transformers sampler, DAPO loss. Every round
is sample -> train -> weight sync; rewards are a fixed-seed coin (never all equal), so
every group trains. Each (row, tree) runs in a fresh process (`--threads` torch threads),
the trees alternating within each pair; the first round is a warm-up, not timed.

What a round must do (attention FLOPs left out: ~2% at these lengths):
- train: 6 x P_body x unique tokens + 6 x P_head x trained tokens (full fine-tuning;
  forward 2, backward 4), 4 x ... for LoRA (no weight gradients for frozen weights);
  P_body the parameters a token passes through (all but the embedding table and the
  head), P_head the LM head's. Unique tokens: each group's prompt once plus its
  completions.
- sampling: 2 x P_body x (each prompt once + each sampled token) + 2 x P_head x sampled
  tokens.
The peak is a float32 matmul (2048 x 2048, the same threads) measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("SWARM_TREE", str(ROOT)))

ROWS: dict[str, dict[str, Any]] = {
    "tiny": {"model": "builtin:tiny", "lora": False, "lr": 1e-3},
    "smollm2 full": {"model": "REAL", "lora": False, "lr": 1e-5},
    "smollm2 lora": {"model": "REAL", "lora": True, "lr": 2e-4},
}


def matmul_peak_gflops(threads: int, size: int = 2048, seconds: float = 3.0) -> float:
    """float32 matmul throughput on this machine with `threads` torch threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    return 2 * size**3 * n / (time.perf_counter() - start) / 1e9


def _param_split(model: Any) -> tuple[int, int]:
    """(P_body, P_head) of a causal LM (PEFT wrappers unwrapped; adapters in the body)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = inner.get_output_embeddings().weight
    embed = inner.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    shared = head.data_ptr() == embed.data_ptr()
    body = total - embed.numel() - (0 if shared else head.numel())
    return body, head.numel()


def worker(
    row: str, real: str | None, rounds: int, threads: int, micro_batch_size: int, source: str
) -> dict[str, Any]:
    """One row's rounds in this process (which may import a baseline tree's code)."""
    import torch

    from policy.loading import load_policy_model
    from policy.lora import apply_lora
    from policy.prompts import PromptRenderer
    from policy.sampler import SamplingParams, make_sampler
    from policy.trainer import Trainer, TrainGroup
    from rewards.mixture import TaskStream
    from rewards.tasks import make_task, solved_examples
    from swarm.config.learning import (
        LoraConfig,
        ModelConfig,
        PromptConfig,
        SamplerConfig,
        TrainConfig,
    )
    from swarm.config.tasks import TasksConfig, TaskSpec

    torch.set_num_threads(threads)
    spec = ROWS[row]
    name = real if spec["model"] == "REAL" else spec["model"]
    model_cfg = ModelConfig(name_or_path=name, device="cpu", seed=1)
    sampler_cfg = SamplerConfig(group_size=8, max_new_tokens=16, temperature=1.0)
    net, tok = load_policy_model(model_cfg)
    if spec["lora"]:
        net = apply_lora(net, LoraConfig(enabled=True, rank=16, alpha=32.0))
    renderer = PromptRenderer(tok, PromptConfig(), solved_examples)
    sampler = make_sampler(sampler_cfg, net, tok, model_cfg, renderer)
    train_cfg = TrainConfig(  # no entropy bonus: as measured before issue 34's defaults
        learning_rate=spec["lr"],
        loss_type="dapo",
        warmup_steps=2,
        entropy_coef=0.0,
        micro_batch_size=micro_batch_size,
    )
    trainer = Trainer(net, tok, train_cfg, "cpu", sampler_cfg, renderer)
    body, head = _param_split(net)
    stream = TaskStream(TasksConfig(seed=7, mixture=[TaskSpec(source=source)]), node_seed=1)
    params = SamplingParams.from_config(sampler_cfg)
    coin = random.Random(0)
    timed: list[dict[str, float]] = []
    for index in range(rounds + 1):
        tasks = [make_task(r) for r in stream.next_refs(4)]
        prompts = [renderer.ids(t.prompt, t.ref.source) for t in tasks]
        t0 = time.perf_counter()
        outs = sampler.generate(prompts, sampler_cfg.group_size, params)
        t1 = time.perf_counter()
        groups = []
        for t, ids, comps in zip(tasks, prompts, outs, strict=True):
            rewards = [float(coin.random() < 0.5) for _ in comps]
            rewards[0], rewards[1] = 0.0, 1.0  # never degenerate
            groups.append(
                TrainGroup(
                    t.prompt,
                    [c.text for c in comps],
                    rewards,
                    [c.token_ids for c in comps],
                    [c.logprobs for c in comps],
                    prompt_ids=ids,
                )
            )
        stats = trainer.step(groups)
        sampler.update_weights(trainer.state_dict_for_sampler())
        t2 = time.perf_counter()
        if index == 0:
            continue
        prompt_tokens = sum(len(p) for p in prompts)
        sampled = sum(len(c.token_ids) for g in outs for c in g)
        mult = 4 if spec["lora"] else 6
        trained = stats.n_tokens
        timed.append(
            {
                "sample_s": t1 - t0,
                "train_s": t2 - t1,
                "round_s": t2 - t0,
                "train_flops": mult * (body * (prompt_tokens + trained) + head * trained),
                "sample_flops": 2 * (body * (prompt_tokens + sampled) + head * sampled),
                "prompt_tokens": prompt_tokens,
                "trained_tokens": stats.n_tokens,
                "tokens_computed": getattr(stats, "tokens_computed", float("nan")),
                "padding_share": getattr(stats, "padding_share", float("nan")),
            }
        )
    means = {k: statistics.fmean(r[k] for r in timed) for k in timed[0]}
    means["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    means["packed"] = bool(getattr(getattr(trainer, "token_logprobs", None), "packed", False))
    return means


def run(
    tree: Path,
    row: str,
    real: str | None,
    rounds: int,
    threads: int,
    micro_batch_size: int,
    source: str,
) -> dict[str, Any]:
    env = {
        **os.environ,
        "SWARM_TREE": str(tree),
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", row]
    command += ["--rounds", str(rounds), "--threads", str(threads)]
    command += ["--micro-batch-size", str(micro_batch_size), "--source", source]
    if real:
        command += ["--real", real]
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{row} in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict[tuple[str, str], list[dict[str, Any]]], peak: float) -> str:
    lines = [
        f"measured float32 matmul peak: {peak:.1f} GFLOP/s\n",
        "| row | tree | round s | sample s | train s | train GFLOP | train % of peak "
        "| sample % of peak | tokens computed / unique | padding | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (row, tree), runs in results.items():
        m = {k: statistics.fmean(r[k] for r in runs) for k in runs[0] if k != "packed"}
        unique = m["prompt_tokens"] + m["trained_tokens"]
        lines.append(
            f"| {row} | {tree} | {m['round_s']:.2f} | {m['sample_s']:.2f} | {m['train_s']:.2f} "
            f"| {m['train_flops'] / 1e9:.1f} "
            f"| {100 * m['train_flops'] / m['train_s'] / 1e9 / peak:.0f}% "
            f"| {100 * m['sample_flops'] / m['sample_s'] / 1e9 / peak:.0f}% "
            f"| {m['tokens_computed'] / unique:.2f} | {100 * m['padding_share']:.0f}% "
            f"| {m['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", help="a real model folder (adds the SmolLM2 rows)")
    ap.add_argument("--baseline-tree", type=Path, help="another checkout to compare against")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per process")
    ap.add_argument("--pairs", type=int, default=1, help="alternations of the two trees")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--micro-batch-size",
        type=int,
        default=8,
        help="train.micro_batch_size (8: the default; 32: the round's 4 groups in one pass)",
    )
    ap.add_argument("--source", default="add", help="the task source (rg:<dataset> too)")
    ap.add_argument("--rows", nargs="*", default=None, help=f"a subset of {list(ROWS)}")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        result = worker(a.worker, a.real, a.rounds, a.threads, a.micro_batch_size, a.source)
        print(json.dumps(result))
        return
    rows = a.rows or [r for r in ROWS if a.real or ROWS[r]["model"] != "REAL"]
    if a.real:
        a.real = str(Path(a.real).resolve())  # the workers run in each tree
    trees = {"this tree": ROOT}
    if a.baseline_tree:
        trees = {"baseline": a.baseline_tree.resolve(), **trees}
    peak = matmul_peak_gflops(a.threads)
    print(f"float32 matmul peak, {a.threads} threads: {peak:.1f} GFLOP/s", file=sys.stderr)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        for pair in range(a.pairs):
            order = list(trees.items()) if pair % 2 == 0 else list(reversed(trees.items()))
            for label, tree in order:
                started = time.monotonic()
                result = run(tree, row, a.real, a.rounds, a.threads, a.micro_batch_size, a.source)
                results.setdefault((row, label), []).append(result)
                print(
                    f"{row} / {label} (pair {pair + 1}/{a.pairs}): round "
                    f"{result['round_s']:.2f} s, train {result['train_s']:.2f} s "
                    f"({time.monotonic() - started:.0f} s)",
                    file=sys.stderr,
                )
    peak_after = matmul_peak_gflops(a.threads)
    print(f"train.micro_batch_size = {a.micro_batch_size}, task source {a.source}")
    print(table(dict(sorted(results.items())), max(peak, peak_after)))
    print(f"\n(matmul peak before / after the rows: {peak:.1f} / {peak_after:.1f} GFLOP/s)")


if __name__ == "__main__":
    main()
