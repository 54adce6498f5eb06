"""Memory per training rank of a node under `train.parallel` none / ddp / fsdp (issue 36),
computed from the code's own settings, for Qwen2.5-0.5B, 1.5B and 7B shapes. One table.

    python benchmarks/parallel_memory.py [--ranks 2 8] [--tokens 768] [--dtype bfloat16]

Parameter counts are exact: each model is built on torch's meta device from its published
shape (no weights, no download), LoRA adapters applied by the node's own `apply_lora`
with `[model.lora]`'s defaults. What the trainer keeps, as the code does it:
- parameters in float32 (`model.master_weights`, on by default) or in `model.dtype`;
- gradients of trainable parameters in the parameters' dtype; AdamW's two moments too;
- DDP: a full replica per rank, plus its gradient buckets (a copy of every gradient:
  `gradient_as_bucket_view` is off);
- FSDP (`policy.parallel`: FSDP2 per decoder block, the rest in the root unit, no mixed
  precision policy): parameters, gradients and moments divided by the ranks, plus the
  gathered units in compute (two blocks, with prefetch, and the root unit: embeddings and
  head) and their whole gradients before each reduce-scatter (the trainer reduce-scatters
  every micro-batch's backward, so accumulated gradients stay sharded);
- rank 0 of an FSDP node also keeps a whole copy of the model (it samples, shares deltas
  and writes one-folder checkpoints from it): listed apart;
- activations of one micro-batch (`train.micro_batch_size` sequences of `--tokens`
  tokens), an estimate: per layer and token 34*h + 5*a*s bytes in 16-bit compute without
  recomputation (Korthikanti et al. 2022, "Reducing activation recomputation"), 2*h with
  `model.gradient_checkpointing`; plus float32 log-softmax rows at completion positions
  (the packed path computes the head only there). The sampler (vLLM's own memory,
  `sampler.vllm_gpu_memory_utilization`) is not counted.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from policy.lora import apply_lora
from swarm.config.learning import LoraConfig, TrainConfig

GiB = 1024**3

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings
    "0.5B": (896, 24, 14, 2, 4864, 151936, True),
    "1.5B": (1536, 28, 12, 2, 8960, 151936, True),
    "7B": (3584, 28, 28, 4, 18944, 152064, False),
}


@dataclass(frozen=True)
class Counts:
    total: int
    trainable: int
    block: int
    """Parameters of one decoder block."""
    root: int
    """Parameters outside the blocks (embeddings, final norm, head)."""
    hidden: int
    heads: int
    layers: int
    vocab: int


def counts(shape: str, lora: bool) -> Counts:
    hidden, layers, heads, kv, inter, vocab, tied = SHAPES[shape]
    config = Qwen2Config(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tied,
    )
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
        if lora:
            model = apply_lora(model, LoraConfig(enabled=True))
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    block_modules = [m for m in model.modules() if type(m).__name__ == "Qwen2DecoderLayer"]
    block = sum(p.numel() for p in block_modules[0].parameters())
    return Counts(total, trainable, block, total - block * layers, hidden, heads, layers, vocab)


def activations(c: Counts, sequences: int, tokens: int, checkpointing: bool) -> float:
    per_token_layer = 2 * c.hidden if checkpointing else 34 * c.hidden + 5 * c.heads * tokens
    body = per_token_layer * c.layers * sequences * tokens
    if checkpointing:  # one block recomputed at a time, whole
        body += (34 * c.hidden + 5 * c.heads * tokens) * sequences * tokens
    completion_tokens = sequences * tokens * 2 // 3
    head = completion_tokens * c.vocab * 4 * 2  # log-softmax rows and their gradient
    return body + head


def per_rank(c: Counts, kind: str, ranks: int, param_bytes: int, act: float) -> dict[str, float]:
    full = {
        "weights": c.total * param_bytes,
        "gradients": c.trainable * param_bytes,
        "adam": 2 * c.trainable * param_bytes,
        "activations": act,
    }
    if kind == "none":
        return full
    if kind == "ddp":
        return {**full, "ddp buckets": c.trainable * param_bytes}
    shard = {k: v / ranks for k, v in full.items() if k != "activations"}
    gathered = (2 * c.block + c.root) * param_bytes
    trainable_share = c.trainable / c.total
    return {
        **shard,
        "gathered units": gathered,
        "unsharded grads (one unit)": (c.block + c.root) * param_bytes * trainable_share,
        "activations": act,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--tokens", type=int, default=768, help="prompt + completion")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--no-master-weights", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    sequences = TrainConfig().micro_batch_size
    param_bytes = 2 if (args.dtype != "float32" and args.no_master_weights) else 4
    print(
        f"per-rank GiB; micro-batch {sequences} x {args.tokens} tokens, parameters "
        f"{'float32' if param_bytes == 4 else args.dtype}, compute {args.dtype}, gradient "
        f"checkpointing {'on' if args.gradient_checkpointing else 'off'}\n"
    )
    print(
        "| model | training | parallel | ranks | params (trainable) | weights | grads | "
        "Adam | engine extra | activations | total per rank | FSDP rank 0 whole copy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for lora in (False, True):
            c = counts(shape, lora)
            act = activations(c, sequences, args.tokens, args.gradient_checkpointing)
            for kind, n in [("none", 1)] + [(k, r) for k in ("ddp", "fsdp") for r in args.ranks]:
                parts = per_rank(c, kind, n, param_bytes, act)
                extra = sum(
                    v
                    for k, v in parts.items()
                    if k not in ("weights", "gradients", "adam", "activations")
                )
                copy = c.total * param_bytes if kind == "fsdp" else 0
                print(
                    f"| {shape} | {'LoRA' if lora else 'full'} | {kind} | {n} | "
                    f"{c.total / 1e9:.2f}B ({c.trainable / 1e6:.1f}M) | "
                    f"{parts['weights'] / GiB:.2f} | {parts['gradients'] / GiB:.2f} | "
                    f"{parts['adam'] / GiB:.2f} | {extra / GiB:.2f} | "
                    f"{parts['activations'] / GiB:.2f} | {sum(parts.values()) / GiB:.1f} | "
                    f"{copy / GiB:.2f} |"
                )


if __name__ == "__main__":
    main()
