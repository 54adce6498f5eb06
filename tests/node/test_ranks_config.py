"""A node's ranks as its config sets them up (issue 36): CPU threads per rank and the GPU
count check, without starting any process."""

from __future__ import annotations

import os

import pytest
import torch

from node.ranks import check_devices, threads_per_rank, usable_cores
from swarm.config import parse_config
from swarm.errors import ConfigError

CPU = torch.device("cpu")


def test_cpu_ranks_divide_the_cores_unless_threads_are_set() -> None:
    cores = usable_cores()
    assert cores == len(os.sched_getaffinity(0))  # Linux
    two = {"train": {"parallel": "ddp", "ranks": 2}}
    assert threads_per_rank(parse_config(two), CPU) == max(1, cores // 2)
    remote = {"train": {"parallel": "ddp", "ranks": 4, "local_ranks": 2,
                        "rendezvous": "127.0.0.1:29500"}}  # fmt: skip
    assert threads_per_rank(parse_config(remote), CPU) == max(1, cores // 2)
    assert threads_per_rank(parse_config({**two, "model": {"threads": 3}}), CPU) == 3
    assert threads_per_rank(parse_config({}), CPU) == 0  # one process: torch's own choice
    assert threads_per_rank(parse_config(two), torch.device("cuda", 0)) == 0


def test_more_ranks_than_gpus_is_one_line_naming_the_fix() -> None:
    config = parse_config({"train": {"parallel": "ddp", "ranks": 2}})
    if torch.cuda.device_count() >= 64:
        pytest.skip("a machine with 64 GPUs")
    with pytest.raises(ConfigError, match=r"64 training ranks on this machine need 64 GPUs"):
        check_devices(config, torch.device("cuda", 0), 64)
    check_devices(config, CPU, 64)  # CPU ranks share the cores: no count to check
