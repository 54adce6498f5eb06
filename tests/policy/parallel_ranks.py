"""A training rank for `tests/policy/test_parallel.py`: joins a gloo process group, runs
one `Trainer` under DDP or FSDP on the shared test batch, and (rank 0) saves what it
computed for the test to compare with the one-process step.

Each rank is its own OS process (torch.multiprocessing's spawn); the rendezvous is a
file, and gloo's own connections stay on the loopback interface.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from policy.lora import apply_lora
from policy.parallel import RankInfo, optimizer_state_by_index
from policy.tiny import build_tiny
from policy.trainer import Trainer
from swarm.config.learning import LoraConfig, SamplerConfig, TrainConfig
from tests.policy import packed_exactness

TRAIN = {
    "foreign_stop": "all",
    "max_completion_tokens": 7,
    "micro_batch_size": 2,
    "learning_rate": 1e-3,
}
PROMPTS = ("3+4=", "12+5=")


def model(lora: bool, seed: int = 0) -> tuple[Any, Any]:
    """The model of seed 0 in every process that passes no seed (LoRA adapters seeded too);
    another seed builds other initial weights, as a node's training ranks may load."""
    torch.manual_seed(seed)
    net, tok = build_tiny("builtin:tiny", seed=seed)
    if lora:
        net = apply_lora(net, LoraConfig(enabled=True, rank=4, alpha=8.0))
    return net, tok


def trained_weights(net: Any) -> dict[str, torch.Tensor]:
    """The trainable weights moved by seeded noise: a policy unlike its KL reference (the
    base, or the model as the trainer got it), as after a resume from a checkpoint. LoRA's
    zero-initialized B matrices become nonzero."""
    generator = torch.Generator().manual_seed(1)
    return {
        name: p.detach() + 0.05 * torch.randn(p.shape, generator=generator)
        for name, p in net.named_parameters()
        if p.requires_grad
    }


def trainer(net: Any, tok: Any, ranks: RankInfo | None, **train: Any) -> Trainer:
    return Trainer(
        net,
        tok,
        TrainConfig(**{**TRAIN, **train}),
        "cpu",
        sampler_config=SamplerConfig(max_new_tokens=12, group_size=4),
        ranks=ranks,
    )


def run_rank(rank: int, world: int, kind: str, store: str, out: str, case: dict[str, Any]) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        # Rank 1 starts from other weights, which rank 0's replace (its KL reference too).
        net, tok = model(case["lora"], seed=rank)
        t = trainer(net, tok, RankInfo(kind, rank, world), **case["train"])  # type: ignore[arg-type]
        if case.get("resumed"):
            assert t.parallel is not None
            trained = trained_weights(model(case["lora"])[0]) if rank == 0 else None
            t.parallel.load_full_state_dict(trained)
        groups = packed_exactness.batch(tok, PROMPTS)
        stats, grads = t.loss_and_gradients(groups)
        step = t.step(groups)
        assert t.parallel is not None
        params = t.parallel.gathered_state_dict()  # whole, on rank 0
        names = [n for n, p in net.named_parameters() if p.requires_grad]
        optimizer = t.parallel.gathered_optimizer_state(t.optimizer)  # what checkpoints hold
        if rank == 0:
            torch.save(
                {
                    "stats": stats.as_dict(),
                    "grads": grads,
                    "step": step.as_dict(),
                    "params": {k: v.clone() for k, v in params.items()},
                    "optimizer": optimizer_state_by_index(optimizer, names),
                },
                Path(out),
            )
    finally:
        dist.destroy_process_group()
