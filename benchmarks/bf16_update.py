"""How much of the model one GRPO step changes when training in bf16: parameters stored
in bf16 (AdamW updates rounded to bf16's 8-bit mantissa) vs fp32 master weights with bf16
autocast (`model.master_weights`, the default). One table row per model and setting.

    .venv/bin/python benchmarks/bf16_update.py                       # builtin:tiny
    .venv/bin/python benchmarks/bf16_update.py --model .cache/smollm2-135m-instruct --lr 1e-6
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from node.policy_learner import PolicyLearner
from policy.precision import share_changed
from policy.trainer import TrainGroup
from rewards.tasks import make_task
from swarm.config import parse_config
from swarm.messages import TaskRef


def shares_per_step(model: str, dtype: str, master: bool, lr: float, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        learner = PolicyLearner(
            parse_config(
                {
                    "node": {"data_dir": tmp},
                    "model": {
                        "name_or_path": model,
                        "dtype": dtype,
                        "master_weights": master,
                        "seed": 0,
                    },
                    "train": {"learning_rate": lr, "entropy_coef": 0.0},  # as measured
                }
            )
        )
        task = make_task(TaskRef("add", 5, 0))
        wrong = str(int(task.answer) + 1)
        group = TrainGroup(
            task.prompt, [f"<answer>{task.answer}</answer>", f"<answer>{wrong}</answer>"],
            [1.0, 0.0], local=False, prompt_ids=learner.renderer.ids(task.prompt, "add"),
        )  # fmt: skip
        shares = []
        for _ in range(steps):
            before = {k: v.clone() for k, v in learner.model.state_dict().items()}
            learner.trainer.step([group])
            shares.append(share_changed(before, learner.model))
        return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"model {args.model}, learning rate {args.lr}, AdamW, one group per step")
    print(f"{'parameters':<28} {'share of weights changed per step':>40}")
    for label, dtype, master in (
        ("float32", "float32", True),
        ("bfloat16 (no master)", "bfloat16", False),
        ("bf16 autocast, fp32 master", "bfloat16", True),
    ):
        shares = shares_per_step(args.model, dtype, master, args.lr, args.steps)
        print(f"{label:<28} {'  '.join(f'{s:8.2%}' for s in shares):>40}")


if __name__ == "__main__":
    main()
