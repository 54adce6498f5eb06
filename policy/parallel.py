"""One policy trained by several processes through torch.distributed: DDP or FSDP2.

A node's ranks each hold the policy (DDP: a full replica; FSDP: a shard of every
parameter, gathered unit by unit for compute) and run `Trainer.step` on the same batch
of groups. The step's micro-batches are divided among the ranks (`assign_micro_batches`:
each micro-batch on exactly one rank, tokens balanced), so each token is computed once;
gradients are combined by torch's engines (DDP's bucketed all-reduce, FSDP's
reduce-scatter) and the step's counters by one all-reduce. The optimizer step that
follows equals the one-process step up to the order of float summation.

Invariants:
- The process group exists before anything here runs: `node/` starts the ranks and the
  rendezvous. This module only computes on the group (no sockets, no launching).
- Every rank calls `Trainer.step` with the same groups in the same order. Under FSDP
  every rank runs the same number of forwards and backwards (a rank with fewer
  micro-batches runs empty ones: one token, zero loss), as its all-gathers and
  reduce-scatters require; it reduce-scatters every backward, so accumulated gradients
  stay sharded. Under DDP every rank runs exactly one gradient-synchronizing backward per
  iteration (the last of its micro-batches, or an empty one).
- The engines average gradients over ranks; the trainer's micro-batch losses are sums
  (unit normalizers), so gradients are scaled back by the number of ranks.
- The wrapped model keeps its parameter names: checkpoints, deltas and the sampler see
  the same names as in a one-process node (`gathered_state_dict` gathers FSDP's shards).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

ParallelKind = Literal["none", "ddp", "fsdp"]


@dataclass(frozen=True)
class RankInfo:
    """This process's place among a node's training ranks."""

    kind: ParallelKind
    rank: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} of {self.world} ranks")
        if self.kind == "none" and self.world != 1:
            raise ValueError("parallel 'none' runs one rank")


def assign_micro_batches(costs: Sequence[int], world: int) -> list[int]:
    """The rank that computes each micro-batch: the costliest first, each to the rank with
    the least cost so far (ties to the lower rank). Deterministic, so every rank computes
    the same assignment without communicating."""
    if world < 1:
        raise ValueError("world must be >= 1")
    load = [0] * world
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += costs[i]
    return owner


class _Call(torch.nn.Module):
    """A root module whose forward runs a function of the model, so that the engine's
    hooks (FSDP's unshard and reduce-scatter, DDP's reducer) surround whatever the
    trainer computes with it: the packed path calls the decoder and the LM head apart,
    never the model's own forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.model)


def _block_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (FSDP's units): the classes a Hugging Face model names in
    its private `_no_split_modules`, found through any PEFT wrapper (a transformers
    without it degrades loudly: `policy.hf_selfcheck.no_split_module_names`)."""
    from policy.hf_selfcheck import no_split_module_names  # transformers: only for FSDP

    names = no_split_module_names(model.modules())
    return [m for m in model.modules() if type(m).__name__ in names]


class ParallelModel:
    """The policy under one engine: `compute(fn)` runs `fn(model)` through it.

    `model` is the caller's module; it keeps its identity and parameter names (FSDP turns
    its parameters into sharded DTensors in place)."""

    def __init__(self, model: torch.nn.Module, info: RankInfo) -> None:
        if info.kind == "none":
            raise ValueError("ParallelModel needs parallel 'ddp' or 'fsdp'")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized (the node starts the ranks)")
        if dist.get_world_size() != info.world or dist.get_rank() != info.rank:
            raise RuntimeError(
                f"process group is rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"expected {info.rank} of {info.world}"
            )
        self.info = info
        self.model = model
        self.root: torch.nn.Module = _Call(model)
        if info.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            # Broadcasts rank 0's parameters and buffers: every replica starts equal.
            self.root = DistributedDataParallel(self.root, forward_sync_buffers=False)
        else:
            from torch.distributed.fsdp import fully_shard

            _broadcast_from_rank0(model)  # shards are cut from equal full tensors
            for block in _block_modules(model):
                fully_shard(block)
            fully_shard(self.root)

    @property
    def world(self) -> int:
        return self.info.world

    def compute(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(model)` through the engine (for passes that must gather or synchronize)."""
        return self.root(fn)

    def plain_compute(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(model)` for a no-grad pass: the bare replica under DDP (no collective); under
        FSDP the engine, since only it can gather the shards."""
        return fn(self.model) if self.info.kind == "ddp" else self.root(fn)

    @contextlib.contextmanager
    def gradient_sync(self, sync: bool) -> Iterator[None]:
        """DDP: backward passes inside all-reduce gradients only when `sync`; the others
        accumulate in the replica until the synchronizing one. FSDP reduce-scatters every
        backward (`sync` is ignored): turning that off would keep whole gradients on every
        rank while micro-batches accumulate, the memory FSDP exists to save
        (`benchmarks/parallel_memory.py`)."""
        if self.info.kind == "ddp" and not sync:
            with self.root.no_sync():  # type: ignore[operator]
                yield
        else:
            yield

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of `values` over the ranks (float64, one all-reduce)."""
        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole gradient by name (gathers FSDP's shards; all ranks call)."""
        return {
            name: _full(p.grad).detach().clone()
            for name, p in self.model.named_parameters()
            if p.grad is not None
        }

    def gathered_state_dict(self, everywhere: bool = False) -> dict[str, torch.Tensor]:
        """The model's whole state by name on rank 0, in CPU memory; {} on the others, or
        with `everywhere` on every rank, on its device (all ranks call, with the same
        `everywhere`: FSDP gathers its shards; DDP's replicas have them already)."""
        if self.info.kind == "ddp":
            if self.info.rank != 0 and not everywhere:
                return {}
            state = self.model.state_dict().items()
            if everywhere:
                return {k: v.detach().clone() for k, v in state}
            return {k: v.detach().to("cpu", copy=True) for k, v in state}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(
            self.model,
            options=StateDictOptions(full_state_dict=True, cpu_offload=not everywhere),
        )

    def gathered_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's whole state keyed by parameter name (torch.distributed's
        format) on rank 0; {} on the others (all ranks call)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(
            self.model,
            optimizer,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any] | None
    ) -> None:
        """Rank 0's whole optimizer `state` (keyed by parameter name) into every rank's
        optimizer (all ranks call; the others pass None)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(
            self.model,
            optimizer,
            state if state is not None else {},
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )

    def load_full_state_dict(self, state: dict[str, torch.Tensor] | None) -> None:
        """Rank 0's `state` (whole tensors by name) into every rank's model or shards (all
        ranks call; the others pass None)."""
        if self.info.kind == "ddp":
            if self.info.rank == 0 and state is not None:
                self.model.load_state_dict(state, strict=False)
            _broadcast_from_rank0(self.model)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        set_model_state_dict(
            self.model,
            state if state is not None else {},
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False),
        )


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


@torch.no_grad()
def _broadcast_from_rank0(model: torch.nn.Module) -> None:
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=0)


def optimizer_state_by_index(state: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (`gathered_optimizer_state`) as a one-
    process optimizer's `state_dict()`, whose parameters are `names` in order."""
    index = {name: i for i, name in enumerate(names)}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def optimizer_state_by_name(state: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The inverse of `optimizer_state_by_index`."""
    return {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def clip_grad_norm(parameters: Sequence[torch.Tensor], max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_` on whole or sharded gradients; the total norm."""
    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    return float(_full(norm))
