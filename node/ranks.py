"""A node's training ranks: rank 0 (the node on the network) starts the others and tells
them what to do (issue 36; `policy.parallel` computes).

Invariants:
- One command starts everything on rank 0's machine: `swarm join` with `train.ranks = N`
  starts ranks 1..L-1 (L = `train.local_ranks`, default N) as its children, `python -m
  node.rank_worker`, each loading the node's resolved config (written once into
  `<data_dir>/ranks/`) and its own copy of the model. Ranks L..N-1 run on other machines,
  started there by `swarm ranks` (`serve_remote_ranks`). All join one torch.distributed
  process group (gloo on CPUs, NCCL on GPUs): through a file in that folder when every
  rank is on this machine (gloo then stays on the loopback interface), else through rank
  0's TCP store at `train.rendezvous`. A machine's i-th rank uses its `cuda:i`.
- Rank 0 alone has a network identity, gossip, checkpoints and metrics; the other ranks
  only train. Before each collective operation rank 0 broadcasts the command (`Command`)
  that makes the others run the same one, so every rank calls the same collectives in the
  same order; one command at a time (a lock), so a checkpoint's gather never interleaves
  with a step.
- Any rank's death stops the node: a dead rank makes rank 0's next (or current)
  collective raise, which fails the round with `RanksFailed` naming it; rank 0's death
  kills its children (parent-death signal) and fails the other machines' next
  collective. The last checkpoint on disk stays the one to resume from.
- `close` stops the other ranks (a stop command, then SIGKILL of children after a grace
  period).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from policy.parallel import RankInfo
from swarm.config import NodeConfig
from swarm.errors import ConfigError, RanksFailed

T = TypeVar("T")

RANKS_DIR = "ranks"
"""Folder under the node's data dir: the resolved config and the rendezvous file."""
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=6)
"""A waiting rank's limit on one collective: workers wait for rank 0's next command for a
whole round (sampling, evaluation); death of a rank is noticed at once without it."""


@dataclass(frozen=True)
class Command:
    """What rank 0 tells the other ranks to do next."""

    kind: str
    """`step` (train on `payload`, the groups; under FSDP then gather the whole weights to
    rank 0), `sync` (take rank 0's weights), `load` (take rank 0's weights, optimizer state
    and policy version: `payload`), `gather_optimizer` (the whole optimizer state to rank
    0, for a checkpoint), `stop`."""
    payload: Any = None


def rank_device(device: torch.device, local_index: int) -> torch.device:
    """The device of a machine's i-th rank: `cuda:i` on GPUs (one per rank), else the CPU."""
    return torch.device("cuda", local_index) if device.type == "cuda" else device


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def local_ranks(config: NodeConfig) -> int:
    """How many of the node's ranks run on rank 0's machine (rank 0 included)."""
    return config.train.local_ranks or config.train.ranks


def threads_per_rank(config: NodeConfig, device: torch.device) -> int:
    """`model.threads` for one of the node's processes: as set; else, for ranks on CPUs,
    this machine's cores divided among its ranks (torch's default, one thread per core in
    every rank, put two threads on each core of a 2-rank node); 0 (auto) otherwise."""
    if config.model.threads > 0 or config.train.ranks == 1 or device.type != "cpu":
        return config.model.threads
    return max(1, usable_cores() // local_ranks(config))


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def check_devices(config: NodeConfig, device: torch.device, count: int) -> None:
    """Refuses `count` ranks on a machine whose GPUs cannot hold them (one line, naming
    the fix)."""
    if device.type == "cuda" and torch.cuda.device_count() < count:
        raise ConfigError(
            f"{count} training ranks on this machine need {count} GPUs, it has "
            f"{torch.cuda.device_count()} (set train.ranks, or train.local_ranks with ranks "
            'on other machines, to at most that; or model.device = "cpu")'
        )


def init_method(config: NodeConfig, folder: Path) -> str:
    """Where the ranks meet: a file in rank 0's data dir when all are on its machine, else
    rank 0's TCP store at `train.rendezvous`."""
    if local_ranks(config) < config.train.ranks:
        return f"tcp://{config.train.rendezvous}"
    return f"file://{folder / 'rendezvous'}"


def join_group(info: RankInfo, device: torch.device, method: str) -> None:
    """This process into the node's process group (blocks until every rank is in). Ranks
    of one machine talk over its loopback interface."""
    if method.startswith("file://"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        backend_for(device),
        init_method=method,
        rank=info.rank,
        world_size=info.world,
        timeout=COLLECTIVE_TIMEOUT,
    )


def start_rank_processes(
    folder: Path, ranks: list[int], first_device: int
) -> list[subprocess.Popen[bytes]]:
    """`python -m node.rank_worker` for each of `ranks`, the i-th on this machine's device
    `first_device + i`, each logging to `<folder>/rank-N.log`."""
    children = []
    for local_index, rank in enumerate(ranks, start=first_device):
        with (folder / f"rank-{rank}.log").open("wb") as log:
            children.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "node.rank_worker",
                        str(folder), str(rank), str(local_index),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C goes to their parent, which stops them
                )
            )  # fmt: skip
    return children


def write_rank_folder(config: NodeConfig, folder: Path) -> None:
    """A fresh folder with the config every rank loads (a previous run's files removed)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config.model_dump_json())


class TrainingRanks:
    """Rank 0's side: the children, the group, and the commands."""

    def __init__(self, config: NodeConfig, device: torch.device) -> None:
        here = local_ranks(config)
        check_devices(config, device, here)
        self.info = RankInfo(config.train.parallel, 0, config.train.ranks)
        self.folder = Path(config.node.data_dir) / RANKS_DIR
        write_rank_folder(config, self.folder)
        self._lock = threading.Lock()
        self.closed = False
        self.before_leaving: Callable[[], None] | None = None
        """Run by `close` before this process leaves the group (the sampler's groups over
        it first: `node.ranked_sampler`)."""
        self.children = start_rank_processes(self.folder, list(range(1, here)), 1)
        if here < self.info.world:
            print(
                f"waiting for training ranks {here}-{self.info.world - 1} at "
                f"{config.train.rendezvous} (swarm ranks on their machines)",
                flush=True,
            )
        try:
            join_group(self.info, device, init_method(config, self.folder))
        except Exception:
            self.close()
            raise

    def run(self, command: Command, collective: Callable[[], T]) -> T:
        """Broadcasts `command` (the other ranks then run their side of it) and runs rank
        0's side, `collective`, one command at a time; a rank's failure raises, naming it."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the node's training ranks are stopped")
            try:
                dist.broadcast_object_list([command], src=0)
                return collective()
            except RuntimeError as exc:
                raise RanksFailed(self.why_failed(exc)) from exc

    def why_failed(self, exc: BaseException) -> str:
        """A collective's failure, naming the rank that died where one did."""
        time.sleep(0.5)  # a rank's death closes its sockets just before its exit is seen
        dead = [
            f"rank {i + 1} (pid {p.pid}) exited with {p.returncode}"
            for i, p in enumerate(self.children)
            if p.poll() is not None
        ]
        if dead:
            return f"training ranks failed: {', '.join(dead)}; logs: {self.folder}/rank-N.log"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"training ranks failed: {first} (rank logs: {self.folder}/rank-N.log)"

    def close(self, grace_s: float = 10.0) -> None:
        """Stops the other ranks and leaves the group (idempotent)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            alive = all(p.poll() is None for p in self.children)
            if alive and dist.is_initialized():
                with contextlib.suppress(RuntimeError):  # a rank that died meanwhile
                    dist.broadcast_object_list([Command("stop")], src=0)
            for child in self.children:
                try:
                    child.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            if self.before_leaving is not None:
                self.before_leaving()
            if dist.is_initialized():
                dist.destroy_process_group()


def read_config(folder: Path) -> NodeConfig:
    return NodeConfig.model_validate(json.loads((folder / "config.json").read_text()))


def serve_remote_ranks(config: NodeConfig, first_rank: int, count: int | None) -> int:
    """`swarm ranks`: runs ranks `first_rank`.. of a node whose rank 0 runs elsewhere, until
    they end (rank 0 stops them, or dies). Returns how many failed."""
    train = config.train
    if local_ranks(config) >= train.ranks:
        raise ConfigError(
            "swarm ranks runs ranks on other machines than rank 0's: set train.local_ranks "
            "below train.ranks and train.rendezvous in the node's config"
        )
    count = count if count is not None else train.ranks - first_rank
    if not local_ranks(config) <= first_rank < first_rank + count <= train.ranks:
        raise ConfigError(
            f"ranks {first_rank}..{first_rank + count - 1} are not among the other "
            f"machines' ranks {local_ranks(config)}..{train.ranks - 1} (--first-rank, --count)"
        )
    from policy.loading import resolve_device

    check_devices(config, resolve_device(config.model.device), count)
    folder = Path(config.node.data_dir) / f"{RANKS_DIR}-from-{first_rank}"
    write_rank_folder(config, folder)
    children = start_rank_processes(folder, list(range(first_rank, first_rank + count)), 0)
    print(f"ranks {first_rank}-{first_rank + count - 1} started; logs in {folder}", flush=True)
    try:
        codes = [child.wait() for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return sum(code != 0 for code in codes)
