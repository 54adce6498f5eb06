"""A single silo node learning on CPU: built-in tiny model, built-in task, GRPO.

Usage: .venv/bin/python benchmarks/learning_curve.py [--steps 300] [--task add] [--lr 3e-4]

Prints one JSON line per `--every` steps and a summary line (first-k vs last-k mean
correctness). Deterministic for `--seed` on one machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from policy.loading import load_policy_model  # noqa: E402
from policy.sampler import SamplingParams, TransformersSampler  # noqa: E402
from policy.trainer import Trainer, TrainGroup  # noqa: E402
from policy.warmstart import supervised_warmup  # noqa: E402
from rewards.mixture import TaskStream  # noqa: E402
from rewards.registry import correctness, score_group  # noqa: E402
from rewards.tasks import make_task  # noqa: E402
from swarm.config.learning import (  # noqa: E402
    ModelConfig,
    RewardsConfig,
    SamplerConfig,
    TasksConfig,
    TaskSpec,
    TrainConfig,
)


@dataclass
class CurveResult:
    correct: list[float]
    """Mean correctness of the node's own samples, per step."""
    seconds: float
    first: float
    last: float


def run_curve(
    steps: int = 300, task: str = "add", lr: float = 3e-4, batch: int = 8, group: int = 8,
    max_new_tokens: int = 3, seed: int = 0, format_weight: float = 0.0, loss_type: str = "dapo",
    window: int = 20, every: int = 0, model: str = "builtin:tiny", temperature: float = 1.0,
    mixture: tuple[tuple[str, float], ...] | None = None, warmup_task: str | None = None,
    warmup_steps: int = 0, warmup_lr: float = 1e-3, reward: str = "source",
    **train_kwargs: float,
) -> CurveResult:
    """Train one node for `steps` steps; `window` is the first/last averaging window."""
    torch.manual_seed(seed)
    model_cfg = ModelConfig(name_or_path=model, device="cpu", seed=seed)
    sampler_cfg = SamplerConfig(
        group_size=group, max_new_tokens=max_new_tokens, temperature=temperature
    )
    train_cfg = TrainConfig(learning_rate=lr, loss_type=loss_type, **train_kwargs)
    rewards_cfg = RewardsConfig(format_weight=format_weight, correctness=reward)
    exact_cfg = RewardsConfig(correctness="exact")
    net, tok = load_policy_model(model_cfg)
    if warmup_task is not None and warmup_steps > 0:
        warm = TaskStream(
            TasksConfig(mixture=[TaskSpec(source=s) for s in warmup_task.split(",")], seed=seed),
            node_seed=seed + 1,
        )

        def pairs(step: int) -> list[tuple[str, str]]:
            return [(t.prompt, t.answer) for t in map(make_task, warm.next_refs(batch * group))]

        supervised_warmup(net, tok, pairs, warmup_steps, warmup_lr)
    sampler = TransformersSampler(net, tok, seed=seed)
    trainer = Trainer(net, tok, train_cfg, "cpu", sampler_config=sampler_cfg)
    specs = [TaskSpec(source=s, weight=w) for s, w in (mixture or ((task, 1.0),))]
    stream = TaskStream(TasksConfig(mixture=specs, seed=seed), node_seed=seed)
    params = SamplingParams.from_config(sampler_cfg)
    correct: list[float] = []
    started = time.perf_counter()
    for step in range(steps):
        tasks = [make_task(ref) for ref in stream.next_refs(batch)]
        outs = sampler.generate([t.prompt for t in tasks], group, params)
        groups = []
        c_sum = 0.0
        for t, comps in zip(tasks, outs, strict=True):
            texts = [c.text for c in comps]
            if t.ref.source == task:
                c_sum += sum(correctness(t, x, exact_cfg) for x in texts)
            groups.append(TrainGroup(
                t.prompt, texts, score_group(t, texts, rewards_cfg),
                [c.token_ids for c in comps], [c.logprobs for c in comps],
            ))
        stats = trainer.step(groups)
        n_main = sum(t.ref.source == task for t in tasks)
        correct.append(c_sum / max(1, n_main * group))
        if every and (step + 1) % every == 0:
            recent = correct[-every:]
            print(json.dumps({
                "step": step + 1, "correct": round(sum(recent) / len(recent), 3),
                "trained_groups": stats.n_groups, "loss": round(stats.loss, 4),
                "sample": [c.text for c in outs[0][:4]],
                "s": round(time.perf_counter() - started, 1),
            }), flush=True)
    seconds = time.perf_counter() - started
    first = sum(correct[:window]) / window
    last = sum(correct[-window:]) / window
    return CurveResult(correct, seconds, first, last)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--task", default="add")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=3)
    ap.add_argument("--format-weight", type=float, default=0.0)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--model", default="builtin:tiny")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = run_curve(
        args.steps, args.task, args.lr, args.batch, args.group, args.max_new_tokens, args.seed,
        args.format_weight, args.loss_type, every=args.every, model=args.model,
    )
    print(json.dumps({"first20": round(res.first, 3), "last20": round(res.last, 3),
                      "steps": args.steps, "seconds": round(res.seconds, 1)}))


if __name__ == "__main__":
    main()
