"""A node's training rank other than 0 (`python -m node.rank_worker <folder> <rank>
<local index>`), started by rank 0 (`node.ranks.TrainingRanks`) or, on another machine, by
`swarm ranks`: it loads the node's resolved config and
its own copy of the model, joins the process group, and runs rank 0's commands until
told to stop. It has no network identity, no gossip, no checkpoints of its own.

Invariants: it dies with rank 0 (a parent-death signal, and a failed collective where
rank 0 is gone); it never writes into the node's data dir except its log.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from node.ranked_sampler import SamplerReplica, launcher_env
from node.ranks import (
    Command,
    init_method,
    join_group,
    rank_device,
    read_config,
    threads_per_rank,
)
from node.trainable import Trainable, load_trainable
from policy.loading import resolve_device
from policy.parallel import RankInfo
from policy.precision import configure_threads
from policy.sampler import make_sampler
from policy.tiny import BUILTIN_PREFIX
from policy.trainer import Trainer
from swarm.config import NodeConfig

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL this process when the process that started it exits (Linux)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        print("no parent-death signal on this system: a failed collective stops this rank")
    if os.getppid() != parent:  # rank 0 died before the signal was set
        sys.exit(1)


def serve(folder: Path, rank: int, local_index: int) -> None:
    # Unset seeds only seed the initial weights here, which rank 0's replace.
    config = read_config(folder).with_node_seeds(f"training rank {rank}")
    info = RankInfo(config.train.parallel, rank, config.train.ranks)
    device = rank_device(resolve_device(config.model.device), local_index)
    threads = threads_per_rank(config, device)
    configure_threads(threads, config.model.name_or_path.startswith(BUILTIN_PREFIX))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # "cuda" is this rank's GPU while the model loads
    join_group(info, device, init_method(config, folder))
    launcher_env(rank, local_index, info.world)
    built = load_trainable(config, info, device)
    trainer, replica = built.trainer, _sampler_replica(config, built)
    # Under FSDP with vLLM the whole copy only built the engine: freed here (a
    # transformers sampler keeps it, as its model).
    del built
    print(f"rank {rank} of {info.world} ready ({info.kind}), pid {os.getpid()}", flush=True)
    _serve_commands(trainer, info, replica)
    # Leave at once, engine and group still referenced: tearing them down after rank 0
    # (which holds the TCP store) had gone was seen to hang in ProcessGroupGloo's
    # destructor, joining a worker thread, when the DDP reducer was freed.
    print(f"rank {rank} stopped", flush=True)
    os._exit(0)


def _sampler_replica(config: NodeConfig, built: Trainable) -> SamplerReplica | None:
    """This rank's sampler where every rank samples (built where rank 0 builds its own:
    with vLLM a collective)."""
    if not config.samples_on_every_rank():
        return None
    model = built.whole if built.whole is not None else built.model
    sampler = make_sampler(
        config.sampler, model, built.tokenizer, config.model, built.renderer, on_ranks=True
    )
    tp = config.sampler.vllm_tensor_parallel_size if config.sampler.backend == "vllm" else 1
    return SamplerReplica(sampler, built.trainer, built.whole is not None, tp)


def _serve_commands(trainer: Trainer, info: RankInfo, replica: SamplerReplica | None) -> None:
    """Rank 0's commands (`node.ranks.Command`), each with its collectives, until `stop`.
    With a sampler on this rank: `sample`, and its weights refreshed in every command that
    changes the weights (`node.ranked_sampler`)."""
    parallel = trainer.parallel
    assert parallel is not None
    while True:
        box: list[Command | None] = [None]
        dist.broadcast_object_list(box, src=0)
        command = box[0]
        assert command is not None
        if command.kind == "sample" and replica is not None:
            replica.serve(command.payload, info.rank)
        elif command.kind == "step":
            trainer.step(command.payload)
            if replica is not None:
                replica.refresh()  # under FSDP the gather rank 0's whole copy takes too
            elif info.kind == "fsdp":
                parallel.gathered_state_dict()  # rank 0's whole copy, after each step
        elif command.kind == "sync":
            parallel.load_full_state_dict(None)
            if replica is not None:
                replica.refresh()  # under FSDP a gather rank 0 joins
        elif command.kind == "gather_optimizer":
            parallel.gathered_optimizer_state(trainer.optimizer)
        elif command.kind == "load":
            # DDP: rank 0's whole optimizer state in the command; FSDP: a collective.
            optimizer_state, version, collective_optimizer = command.payload
            if optimizer_state is not None:
                trainer.optimizer.load_state_dict(optimizer_state)
            trainer.policy_version = version
            parallel.load_full_state_dict(None)
            if collective_optimizer:
                parallel.load_optimizer_state(trainer.optimizer, None)
            if replica is not None:
                replica.refresh()  # under FSDP a gather rank 0 joins
        elif command.kind == "stop":
            return
        else:
            raise ValueError(f"unknown command {command.kind!r} from rank 0")


def main(argv: list[str]) -> None:
    _die_with_parent()
    serve(Path(argv[0]), int(argv[1]), int(argv[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
