"""The process behind `tests/node/test_ranked_sampler.py`: a node's learner on 2 training
ranks that both sample (its rank 1 a real `node.rank_worker` process) beside a one-process
learner of the same model, both driven through `PolicyLearner` as a node drives them; what
they generated is saved for the test to compare."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from node.evaluation import HeldOut
from node.policy_learner import PolicyLearner
from node.ranked_sampler import RankedSampler
from policy.sampler import Completion, SamplingParams
from rewards.tasks import make_task
from swarm.config import parse_config

GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0)


def _config(folder: Path, kind: str | None, backend: str = "transformers") -> Any:
    data: dict[str, Any] = {
        "model": {"seed": 0},
        "tasks": {"seed": 3},
        "node": {"data_dir": str(folder)},
        "sampler": {"group_size": 4, "max_new_tokens": 3},
        "train": {"learning_rate": 3e-2},  # large, so that one step changes greedy answers
    }
    if kind is not None:
        data["train"].update({"parallel": kind, "ranks": 2})
        data["sampler"].update({"data_parallel": True, "backend": backend})
    return parse_config(data)


def _plain(groups: list[list[Completion]]) -> list[list[tuple[list[int], list[float]]]]:
    return [[(c.token_ids, c.logprobs) for c in g] for g in groups]


def compare(kind: str, folder: str, out: str, backend: str = "transformers") -> None:
    """`backend`: the 2-rank learner's; the one-process learner's is always transformers
    (a vLLM engine in this process would take torch.distributed's one default group)."""
    root = Path(folder)
    one = PolicyLearner(_config(root / "one", None))
    two = PolicyLearner(_config(root / "two", kind, backend))
    try:
        assert isinstance(two.sampler, RankedSampler)
        refs = HeldOut(_config(root / "one", None)).refs[:5]
        prompts = [one.renderer.ids(make_task(r).prompt, r.source) for r in refs]
        one.save(root / "start", {"round": 0})
        result: dict[str, Any] = {
            "two_start": _plain(two.sampler.generate(prompts, 1, GREEDY)),
            "counts": list(two.sampler.last_counts),
            "one_start": _plain(one.sampler.generate(prompts, 1, GREEDY)),
        }
        sampled = two.sample(refs, seed=7)
        again = two.sample(refs, seed=7)
        result["sampled"] = [g.token_ids for g in sampled.groups]
        result["sampled_again"] = [g.token_ids for g in again.groups]
        result["sampled_counts"] = list(two.sampler.last_counts)
        # Rewards with a spread (the tiny untrained model's own are all 0: no step).
        groups = [replace(g, rewards=(1.0, 0.0, 0.5, 0.0)) for g in sampled.groups]
        for learner in (one, two):
            learner.train(groups, [])
        result["versions"] = [one.policy_version, two.policy_version]
        result["two_trained"] = _plain(two.sampler.generate(prompts, 1, GREEDY))
        result["one_trained"] = _plain(one.sampler.generate(prompts, 1, GREEDY))
        two.load(root / "start")  # a resume: every rank's sampler back at the start
        result["two_loaded"] = _plain(two.sampler.generate(prompts, 1, GREEDY))
        torch.save(result, out)
    finally:
        two.close()
