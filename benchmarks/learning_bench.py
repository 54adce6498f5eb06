"""Policy throughput on the tiny model: samples/s and train steps/s per sampler backend,
and the time split of one step (sample, score, prepare, old logprobs, update).

Usage: .venv/bin/python benchmarks/learning_bench.py [--steps 20] [--backend transformers]
       .venv-vllm/bin/python benchmarks/learning_bench.py --backend vllm
Prints one JSON line per backend. Rewards are random (a fixed-seed coin) so every group is
informative and the train step does its full work.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch

from policy.loading import load_policy_model
from policy.sampler import SamplingParams, make_sampler
from policy.trainer import Trainer, TrainGroup
from rewards.mixture import TaskStream
from rewards.registry import score_group
from rewards.tasks import make_task
from swarm.config.learning import (
    ModelConfig,
    RewardsConfig,
    SamplerConfig,
    TasksConfig,
    TaskSpec,
    TrainConfig,
)


def bench(
    backend: str, steps: int, batch: int, group: int, max_new_tokens: int, model: str
) -> dict:
    model_cfg = ModelConfig(name_or_path=model, device="cpu")
    sampler_cfg = SamplerConfig(backend=backend, group_size=group, max_new_tokens=max_new_tokens)
    net, tok = load_policy_model(model_cfg)
    sampler = make_sampler(sampler_cfg, net, tok, model_cfg)
    trainer = Trainer(net, tok, TrainConfig(learning_rate=1e-4), "cpu", sampler_cfg)
    stream = TaskStream(TasksConfig(mixture=[TaskSpec(source="add")]), node_seed=0)
    params = SamplingParams.from_config(sampler_cfg)
    coin = random.Random(0)
    totals = {"sample": 0.0, "score": 0.0, "prepare": 0.0, "old_logprobs": 0.0, "update": 0.0}
    n_samples = n_tokens = 0
    warmup = 2
    for step in range(steps + warmup):
        tasks = [make_task(r) for r in stream.next_refs(batch)]
        t0 = time.perf_counter()
        outs = sampler.generate([t.prompt for t in tasks], group, params)
        t1 = time.perf_counter()
        groups = []
        for t, comps in zip(tasks, outs, strict=True):
            texts = [c.text for c in comps]
            score_group(t, texts, RewardsConfig())
            rewards = [float(coin.random() < 0.5) for _ in texts]
            rewards[0], rewards[1] = 0.0, 1.0  # never degenerate
            groups.append(
                TrainGroup(
                    t.prompt,
                    texts,
                    rewards,
                    [c.token_ids for c in comps],
                    [c.logprobs for c in comps],
                )
            )
        t2 = time.perf_counter()
        stats = trainer.step(groups)
        sampler.update_weights(trainer.state_dict_for_sampler())
        if step < warmup:
            continue
        totals["sample"] += t1 - t0
        totals["score"] += t2 - t1
        for k, v in stats.timings.items():
            totals[k] += v
        n_samples += batch * group
        n_tokens += sum(len(c.token_ids) for g in outs for c in g)
    step_time = sum(totals.values()) / steps
    return {
        "backend": backend,
        "model": model,
        "batch": batch,
        "group": group,
        "max_new_tokens": max_new_tokens,
        "samples_per_s": round(n_samples / totals["sample"], 1),
        "sampled_tokens_per_s": round(n_tokens / totals["sample"], 1),
        "train_steps_per_s": round(
            steps / (totals["prepare"] + totals["old_logprobs"] + totals["update"]), 2
        ),
        "round_s": round(step_time, 4),
        "split_s": {k: round(v / steps, 4) for k, v in totals.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tiny ops: 1 is fastest)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps(bench(a.backend, a.steps, a.batch, a.group, a.max_new_tokens, a.model)))


if __name__ == "__main__":
    main()
