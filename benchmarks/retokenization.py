"""How often a real model writes a completion with another token split than its tokenizer
gives the same text, and what re-tokenizing costs in likelihood (issue 33).

A peer's completion travels as text; a receiver that re-tokenizes it trains the
tokenizer's split, not the one the peer sampled. Where the two differ, the re-tokenized
path is one the sender never took and its policy finds less likely. This samples one
round with SmolLM2-135M-Instruct (built offline, `policy.gguf_import`) on a task source
and prints, over all completions and over the correct ones: the share whose sampled ids
differ from their text re-tokenized (and the share with another token count), and the
mean summed logprob under the same model of the sampled ids against the re-tokenized ones
(for those that differ). `train.peer_tokens = "as_sampled"` trains the sampled ids.

    .venv/bin/python benchmarks/retokenization.py --task rg:string_insertion --tasks 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from node.policy_learner import PolicyLearner
from policy.gguf_import import convert_gguf_to_hf, smollm2_gguf_path
from policy.sampler import encode_completion
from rewards.mixture import TaskStream
from swarm.config import parse_config

MODEL_DIR = Path(".cache/smollm2-135m-instruct")


def summed_logprob(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> float:
    """log p(completion | prompt) under `model` at temperature 1."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
    return float(logits.gather(1, torch.tensor(completion)[:, None]).sum())


def measure(model_dir: Path, task: str, tasks: int, max_new_tokens: int, data_dir: str) -> list:
    """One row per completion: (correct, same ids, same count, sampled lp, re-tokenized lp)."""
    config = parse_config(
        {
            "node": {"data_dir": data_dir},
            "model": {"name_or_path": str(model_dir), "threads": 1, "seed": 0},
            "tasks": {"mixture": [{"source": task}], "seed": 0},
            "rewards": {"format_weight": 0.0},
            "sampler": {"group_size": 8, "max_new_tokens": max_new_tokens},
        }
    )
    learner = PolicyLearner(config)
    groups = learner.sample(TaskStream(config.tasks, 3).next_refs(tasks), seed=0).groups
    rows = []
    for group in groups:
        prompt = learner.renderer.ids(group.prompt, group.ref.source)
        sampled_ids = group.token_ids or ()
        for text, ids, reward in zip(group.completions, sampled_ids, group.rewards, strict=True):
            sampled = list(ids[:-1] if ids and ids[-1] in learner.stop_ids else ids)
            again = encode_completion(learner.tokenizer, text)
            same = again == sampled
            lps = (None, None)
            if not same and sampled and again:
                lps = (summed_logprob(learner.model, prompt, sampled),
                       summed_logprob(learner.model, prompt, again))  # fmt: skip
            rows.append((reward >= 1.0, same, len(again) == len(sampled), *lps))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="rg:string_insertion")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    folder, name = smollm2_gguf_path()
    model_dir = convert_gguf_to_hf(folder, name, MODEL_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(model_dir, args.task, args.tasks, args.max_new_tokens, tmp)
    table = Table(title=f"SmolLM2-135M-Instruct, {args.task}, G = 8, one round")
    for column in ("completions", "n", "re-tokenize to other ids", "to another count",
                   "summed logprob: sampled / re-tokenized (those that differ)"):  # fmt: skip
        table.add_column(column)
    for label, subset in (("all", rows), ("correct", [r for r in rows if r[0]])):
        differ = [r for r in subset if not r[1] and r[3] is not None]
        gap = (
            f"{statistics.fmean(r[3] for r in differ):.2f} / "
            f"{statistics.fmean(r[4] for r in differ):.2f}"
            if differ
            else "-"
        )
        n = max(len(subset), 1)
        table.add_row(
            label,
            str(len(subset)),
            f"{sum(not r[1] for r in subset) / n:.2f}",
            f"{sum(not r[2] for r in subset) / n:.2f}",
            gap,
        )
    Console().print(table)


if __name__ == "__main__":
    main()
