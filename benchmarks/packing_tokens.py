"""What one training pass computes for a batch of groups from several task sources: the
plain layout, one shared prefix for the whole batch, and a prefix per family of prompts.

    .venv/bin/python benchmarks/packing_tokens.py --model .cache/smollm2-135m-instruct \
        --sources rg:string_insertion,rg:time_intervals --groups-per-source 4

Prompts are the node's own (`[prompt]` defaults: chat template, system prompt, two
solved examples of the question's source), tokenized by the model's tokenizer; each
group has `--group-size` completions of `--completion-tokens` tokens (their content does
not change the layout). Counts come from `policy.packing.pack`, no model is run: tokens
computed (padding included), rows x width, and attention cells (rows x width^2, what
the attention's work and transient memory grow with). "one prefix" is the layout before
families (the longest prefix every prompt of the batch shares), kept here as the
baseline. `--time N` also times N interleaved training passes (loss and gradients, LoRA
r16, one micro-batch) of the mixed batch on the model under each of the two layouts.
"""

from __future__ import annotations

import argparse
from typing import Any

from policy import packing
from policy.prompts import PromptRenderer
from rewards.tasks import make_task, solved_examples
from swarm.config.learning import PromptConfig
from swarm.messages import TaskRef


def sequences(
    tokenizer: Any, sources: list[str], per_source: int, group_size: int, tokens: int
) -> list[tuple[list[int], list[int]]]:
    renderer = PromptRenderer(tokenizer, PromptConfig(), solved_examples)
    out = []
    for index in range(per_source):
        for source in sources:
            task = make_task(TaskRef(source, 12345, index))
            prompt = renderer.ids(task.prompt, source)
            out.extend((prompt, [7 + j for j in range(tokens)]) for _ in range(group_size))
    return out


def one_family(segments: list[Any]) -> list[tuple[int, list[Any]]]:
    return [(packing.common_prefix([s.prompt for s in segments]), segments)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".cache/smollm2-135m-instruct")
    parser.add_argument("--sources", default="rg:string_insertion,rg:time_intervals")
    parser.add_argument("--groups-per-source", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=24)
    parser.add_argument("--time", type=int, default=0, help="timed passes per layout")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--only",
        choices=["one prefix", "prefix per family"],
        help="time this layout alone (its peak memory is then the process's)",
    )
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = []
    cases = [[s] for s in args.sources.split(",")]
    if len(cases) > 1:
        cases.append(args.sources.split(","))
    for sources in cases:
        batch = sequences(
            tokenizer, sources, args.groups_per_source, args.group_size, args.completion_tokens
        )
        layouts = {
            "plain": packing.pack(batch, pad_id=0, share_prefix=False),
            "one prefix": _with(one_family, batch),
            "prefix per family": packing.pack(batch, pad_id=0),
        }
        for name, packed in layouts.items():
            r, w = packed.input_ids.shape
            rows.append(
                f"| {' + '.join(sources)} | {len(batch) // args.group_size} | {name} | "
                f"{packed.n_computed_tokens} | {r} x {w} | {r * w * w / 1e6:.2f} |"
            )
    print("| sources | groups | layout | tokens computed | rows x width | attention cells, M |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.time:
        time_passes(args, tokenizer, batch)


def time_passes(args: argparse.Namespace, tokenizer: Any, batch: list[Any]) -> None:
    """Seconds per training pass of the last (mixed) batch, one prefix against families,
    interleaved so that both see the same machine load."""
    import resource
    import statistics
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from policy.lora import apply_lora
    from policy.train_types import TrainGroup
    from policy.trainer import Trainer
    from swarm.config.learning import LoraConfig, SamplerConfig, TrainConfig

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model = apply_lora(model, LoraConfig(enabled=True, rank=16, alpha=32.0))
    g = args.group_size
    groups = []
    for start in range(0, len(batch), g):
        prompt_ids, completion = batch[start]
        rewards = [float(j % 2) for j in range(g)]
        groups.append(
            TrainGroup(
                "",
                ["x"] * g,
                rewards,
                completion_token_ids=[list(completion)] * g,
                sampler_logprobs=[[-1.0] * len(completion)] * g,
                prompt_ids=list(prompt_ids),
            )
        )
    trainer = Trainer(
        model,
        tokenizer,
        TrainConfig(micro_batch_size=len(batch), max_completion_tokens=args.completion_tokens),
        "cpu",
        sampler_config=SamplerConfig(max_new_tokens=args.completion_tokens, group_size=g),
        packed=True,
    )
    names = [args.only] if args.only else ["one prefix", "prefix per family"]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    original = packing._families
    for _ in range(args.time):
        for name in seconds:
            packing._families = one_family if name == "one prefix" else original
            start = time.perf_counter()
            trainer.loss_and_gradients(groups)
            seconds[name].append(time.perf_counter() - start)
    packing._families = original
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\n{len(groups)} groups of {g}, {torch.get_num_threads()} threads, "
        f"{args.time} passes each; peak RSS of the process {peak:.0f} MB"
    )
    print("| layout | seconds per pass (median) | all |")
    print("|---|---|---|")
    for name, values in seconds.items():
        listed = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {statistics.median(values):.2f} | {listed} |")


def _with(families: Any, batch: list[tuple[list[int], list[int]]]) -> packing.PackedBatch:
    original = packing._families
    packing._families = families
    try:
        return packing.pack(batch, pad_id=0)
    finally:
        packing._families = original


if __name__ == "__main__":
    main()
