"""GPU smoke test for a real model: vLLM sampling, a bf16 GRPO step over fp32 master
weights, the in-place weight reload into vLLM, LoRA, and tokens/s. One table.

Ready for a machine with a GPU (none is lent here; `device status` says when one is):

    pip install -e '.[vllm]' && python -m policy.gguf_import .cache/smollm2-135m-instruct
    VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/gpu_smoke.py

On a CPU it runs the same checks with the transformers sampler (`--backend transformers
--device cpu`), which is how this script itself is tested here.

Checks (each row says ok / FAILED and the number behind it):
- sampling: completions per second and generated tokens per second, EOS share;
- a GRPO step in bf16 autocast over fp32 masters changes > 50% of the weights;
- after `update_weights`, the sampler's logprobs of its own greedy tokens match the
  trainer's to 0.05 (bf16 noise); a stale engine would differ by the step's change;
- the shared-prefix step (each prompt once, the LM head at trained positions) against the
  plain forward: the same gradient to bf16 round-off, tokens computed, tokens/s;
- vLLM prefix caching is on;
- LoRA (transformers sampler): only adapters change, step time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from node.policy_learner import PolicyLearner
from policy.precision import share_changed
from policy.sampler import SamplingParams
from policy.trainer import TrainGroup
from rewards.mixture import TaskStream
from swarm.config import parse_config

Row = tuple[str, bool, str]


def config(model: str, device: str, backend: str, lora: bool, out: Path) -> Any:
    return parse_config(
        {
            "node": {"data_dir": str(out)},
            "model": {
                "name_or_path": model,
                "device": device,
                "dtype": "bfloat16",
                "lora": {"enabled": lora, "rank": 16},
                "seed": 0,
            },
            "sampler": {"backend": backend, "group_size": 8, "max_new_tokens": 64},
            "tasks": {"mixture": [{"source": "add"}]},
            "train": {"learning_rate": 1e-5 if not lora else 2e-4, "entropy_coef": 0.0},
        }
    )


def informative_group(learner: PolicyLearner, groups: list[Any]) -> TrainGroup:
    """A sampled group with reward variance, or a hand-made one if none has any."""
    for g in groups:
        if len(set(g.rewards)) > 1:
            return TrainGroup(
                g.prompt,
                list(g.completions),
                list(g.rewards),
                [list(t) for t in g.token_ids],
                [list(lp) for lp in g.sampler_logprobs],
                prompt_ids=learner.renderer.ids(g.prompt, g.ref.source),
            )
    g = groups[0]
    texts = ["<answer>0</answer>", "<answer>1</answer>"]
    return TrainGroup(
        g.prompt,
        texts,
        [1.0, 0.0],
        local=False,
        finished=[True, True],  # a peer's completions are trained only where they ended
        prompt_ids=learner.renderer.ids(g.prompt, g.ref.source),
    )


def full_checks(args: argparse.Namespace, out: Path) -> list[Row]:
    rows: list[Row] = []
    learner = PolicyLearner(config(args.model, args.device, args.backend, False, out / "full"))
    refs = TaskStream(learner_tasks(), 0).next_refs(args.groups)
    learner.sample(refs[:1], seed=0)  # warm-up (CUDA graphs, caches)
    start = time.perf_counter()
    result = learner.sample(refs, seed=1)
    seconds = time.perf_counter() - start
    tokens = sum(len(t) for g in result.groups for t in g.token_ids or ())
    completions = sum(len(g.completions) for g in result.groups)
    eos = sum(f for g in result.groups for f in g.finished) / max(completions, 1)
    rows.append(
        (
            f"sampling ({args.backend})",
            tokens > 0,
            f"{completions / seconds:.1f} completions/s, {tokens / seconds:.0f} tokens/s, "
            f"EOS {eos:.0%}",
        )
    )
    before = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    group = informative_group(learner, result.groups)
    start = time.perf_counter()
    stats = learner.trainer.step([group])
    step_s = time.perf_counter() - start
    share = share_changed(before, learner.model)
    rows.append(
        ("bf16 step over fp32 masters", share > 0.5, f"{share:.1%} of weights, {step_s:.2f} s")
    )
    learner.sampler.update_weights(learner.trainer.state_dict_for_sampler())
    rows.append(reload_check(learner, group))
    rows.append(packed_check(learner, group))
    if args.backend == "vllm":
        cache = learner.sampler.llm.llm_engine.vllm_config.cache_config  # type: ignore[attr-defined]
        rows.append(("vLLM prefix caching", bool(cache.enable_prefix_caching), "on"))
    del stats
    return rows


def packed_check(learner: PolicyLearner, group: TrainGroup) -> Row:
    """The shared-prefix step (the default) against the plain forward on this model and
    dtype: the same gradient to the compute dtype's round-off, and fewer tokens."""
    trainer = learner.trainer
    if not trainer.token_logprobs.packed:
        return ("shared-prefix step", False, f"not used: {trainer.token_logprobs.fallback_reason}")
    runs = {}
    for packed in (True, False):
        trainer.token_logprobs.packed = packed
        start = time.perf_counter()
        stats, grads = trainer.loss_and_gradients([group, group])
        runs[packed] = (stats, grads, time.perf_counter() - start)
    trainer.token_logprobs.packed = True
    (fast, fast_grads, fast_s), (plain, plain_grads, plain_s) = runs[True], runs[False]
    if not plain_grads:
        return ("shared-prefix step vs plain", False, "nothing to train in the group")
    gap = max(
        float((fast_grads[k] - g).norm()) / max(float(g.norm()), 1e-30)
        for k, g in plain_grads.items()
    )
    unique = fast.n_tokens + 2 * len(group.prompt_ids or ())
    return (
        "shared-prefix step vs plain",
        gap < 0.25,
        f"max gradient gap {gap:.2e} of its norm; {fast.tokens_computed} vs "
        f"{plain.tokens_computed} tokens computed; {unique / fast_s:.0f} vs "
        f"{unique / plain_s:.0f} unique tokens/s (fwd+bwd)",
    )


def reload_check(learner: PolicyLearner, group: TrainGroup) -> Row:
    """The sampler's logprobs of its own sampled tokens vs the trainer's, after the step."""
    ids = group.prompt_ids or learner.renderer.ids(group.prompt)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=1.0)
    [[completion]] = learner.sampler.generate([ids], 1, params, seed=3)
    check = TrainGroup(
        group.prompt, [completion.text, "x"], [1.0, 0.0],
        [completion.token_ids, [0]], [completion.logprobs, [0.0]], prompt_ids=ids,
    )  # fmt: skip
    rows = learner.trainer._rows(check)
    with torch.no_grad():
        trainer_lp, mask, _ = learner.trainer._logprobs(learner.model, rows[:1])
    n = int(mask[0].sum())
    diff = (trainer_lp[0, :n].cpu() - torch.tensor(completion.logprobs[:n])).abs().max()
    return (
        "sampler weights reloaded in place",
        float(diff) < 0.05,
        f"max |dlogp| {float(diff):.4f}",
    )


def lora_checks(args: argparse.Namespace, out: Path) -> list[Row]:
    learner = PolicyLearner(config(args.model, args.device, "transformers", True, out / "lora"))
    refs = TaskStream(learner_tasks(), 0).next_refs(2)
    result = learner.sample(refs, seed=1)
    frozen = {
        k: v.detach().clone() for k, v in learner.model.state_dict().items() if "lora_" not in k
    }
    adapters = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    start = time.perf_counter()
    learner.trainer.step([informative_group(learner, result.groups)])
    step_s = time.perf_counter() - start
    unchanged = all(torch.equal(learner.model.state_dict()[k], v) for k, v in frozen.items())
    return [
        (
            "LoRA: only adapters train",
            unchanged,
            f"{adapters:,} adapter params, step {step_s:.2f} s",
        )
    ]


def learner_tasks() -> Any:
    return parse_config({"tasks": {"mixture": [{"source": "add"}], "seed": 0}}).tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".cache/smollm2-135m-instruct")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_smoke"))
    args = parser.parse_args()
    if args.backend == "vllm":
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rows = full_checks(args, args.out) + lora_checks(args, args.out)
    width = max(len(r[0]) for r in rows)
    for name, ok, detail in rows:
        print(f"{name:<{width}}  {'ok' if ok else 'FAILED':6}  {detail}")
    raise SystemExit(0 if all(ok for _, ok, _ in rows) else 1)


if __name__ == "__main__":
    main()
