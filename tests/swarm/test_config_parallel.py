"""`[train] parallel` / `ranks` and the vLLM tensor-parallel setting (issue 36): choices that
cannot work are refused at load, naming the field and the fix."""

from __future__ import annotations

import pytest

from swarm.config import parse_config
from swarm.errors import ConfigError


@pytest.mark.parametrize(
    ("train", "needle"),
    [
        ({"ranks": 2}, 'train.ranks = 2 needs train.parallel = "ddp" or "fsdp"'),
        ({"parallel": "fsdp"}, 'train.parallel = "fsdp" needs train.ranks >= 2'),
        ({"parallel": "ddp", "ranks": 0}, "ranks"),
    ],
)
def test_rank_settings_that_cannot_work_are_refused(train: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"train": train})
    assert needle in str(caught.value)


def test_two_ranks_load() -> None:
    config = parse_config({"train": {"parallel": "fsdp", "ranks": 2}})
    assert (config.train.parallel, config.train.ranks) == ("fsdp", 2)
    assert parse_config({}).train.ranks == 1


def test_tensor_parallel_sampling_needs_the_vllm_backend() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"sampler": {"vllm_tensor_parallel_size": 2}})
    assert "vllm_tensor_parallel_size" in str(caught.value)
    assert 'backend = "vllm"' in str(caught.value)
    config = parse_config({"sampler": {"backend": "vllm", "vllm_tensor_parallel_size": 2}})
    assert config.sampler.vllm_tensor_parallel_size == 2


@pytest.mark.parametrize(
    ("train", "needle"),
    [
        ({"parallel": "ddp", "ranks": 2, "local_ranks": 3}, "is more than train.ranks"),
        ({"parallel": "ddp", "ranks": 4, "local_ranks": 2}, 'needs train.rendezvous = "host:port"'),
        (
            {"parallel": "ddp", "ranks": 4, "local_ranks": 2, "rendezvous": "box-a"},
            "needs train.rendezvous",
        ),
        ({"parallel": "ddp", "ranks": 2, "rendezvous": "box-a:29500"}, "remove it"),
    ],
)
def test_ranks_on_other_machines_need_a_rendezvous(train: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"train": train})
    assert needle in str(caught.value)


def test_ranks_on_other_machines_load() -> None:
    train = {"parallel": "fsdp", "ranks": 8, "local_ranks": 4, "rendezvous": "10.0.0.2:29500"}
    config = parse_config({"train": train})
    assert config.train.rendezvous == "10.0.0.2:29500"
