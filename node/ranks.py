"""A node's training ranks: rank 0 (the node on the network) starts ranks 1..N-1 as its
own child processes and tells them what to do (issue 36; `policy.parallel` computes).

Invariants:
- One command starts everything: `swarm join` with `train.ranks = N` starts N - 1
  processes of `python -m node.rank_worker`, each loading the node's resolved config
  (written once into `<data_dir>/ranks/`) and its own copy of the model, and joins them in
  a torch.distributed process group (gloo on CPUs, NCCL on GPUs) through a file
  rendezvous in that folder. Gloo's connections stay on the loopback interface.
- Rank 0 alone has a network identity, gossip, checkpoints and metrics; the other ranks
  only train. Before each collective operation rank 0 broadcasts the command (`Command`)
  that makes the others run the same one, so every rank calls the same collectives in the
  same order.
- Any rank's death stops the node: a dead child makes rank 0's next (or current)
  collective raise, which fails the round with the rank named; rank 0's death kills the
  children (parent-death signal) or fails their next collective. The last checkpoint on
  disk stays the one to resume from.
- `close` stops the children (a stop command, then SIGKILL after a grace period).
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from policy.parallel import RankInfo
from swarm.config import NodeConfig
from swarm.errors import ConfigError

T = TypeVar("T")

RANKS_DIR = "ranks"
"""Folder under the node's data dir: the resolved config and the rendezvous file."""
JOIN_TIMEOUT = datetime.timedelta(minutes=10)
"""How long ranks wait for each other to load their models and join the group."""
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=6)
"""A waiting rank's limit on one collective: workers wait for rank 0's next command for a
whole round (sampling, evaluation); death of a rank is noticed at once without it."""


@dataclass(frozen=True)
class Command:
    """What rank 0 tells the other ranks to do next."""

    kind: str
    """`step` (train on `payload`: the groups), `sync` (take rank 0's weights), `load`
    (take rank 0's weights, optimizer state and policy version: `payload`), `stop`."""
    payload: Any = None


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: `cuda:r` on GPUs (one per rank), the CPU otherwise."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def check_devices(config: NodeConfig, device: torch.device) -> None:
    """Refuses a rank count the machine's GPUs cannot hold (one line, naming the fix)."""
    ranks = config.train.ranks
    if device.type == "cuda" and torch.cuda.device_count() < ranks:
        raise ConfigError(
            f"train.ranks = {ranks} needs {ranks} GPUs, this machine has "
            f"{torch.cuda.device_count()} (set train.ranks to at most that, or "
            'model.device = "cpu")'
        )


def join_group(info: RankInfo, device: torch.device, store: Path) -> None:
    """This process into the node's process group (blocks until every rank is in)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        backend_for(device),
        init_method=f"file://{store}",
        rank=info.rank,
        world_size=info.world,
        timeout=COLLECTIVE_TIMEOUT,
    )


class TrainingRanks:
    """Rank 0's side: the children, the group, and the commands."""

    def __init__(self, config: NodeConfig, device: torch.device) -> None:
        check_devices(config, device)
        self.info = RankInfo(config.train.parallel, 0, config.train.ranks)
        self.folder = Path(config.node.data_dir) / RANKS_DIR
        shutil.rmtree(self.folder, ignore_errors=True)  # a previous run's rendezvous
        self.folder.mkdir(parents=True)
        (self.folder / "config.json").write_text(config.model_dump_json())
        store = self.folder / "rendezvous"
        self.children: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self.closed = False
        for rank in range(1, self.info.world):
            log = (self.folder / f"rank-{rank}.log").open("wb")
            self.children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "node.rank_worker", str(self.folder), str(rank)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C goes to rank 0, which stops them
                )
            )
            log.close()
        try:
            join_group(self.info, device, store)
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
                raise RuntimeError(self.why_failed(exc)) from exc

    def why_failed(self, exc: BaseException) -> str:
        """A collective's failure, naming the rank that died where one did."""
        dead = [
            f"rank {i + 1} (pid {p.pid}) exited with {p.returncode}"
            for i, p in enumerate(self.children)
            if p.poll() is not None
        ]
        logs = f"; its log: {self.folder}/rank-N.log" if dead else ""
        return f"training ranks failed: {', '.join(dead) or exc}{logs}"

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
            if dist.is_initialized():
                dist.destroy_process_group()


def read_config(folder: Path) -> NodeConfig:
    return NodeConfig.model_validate(json.loads((folder / "config.json").read_text()))
