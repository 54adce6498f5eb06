"""Sampling on every training rank (`sampler.data_parallel`, issue 36): the prompts'
split and seeds, the config's refusals, and a learner on 2 ranks (DDP and FSDP; its rank 1
a real `node.rank_worker` process, gloo on 127.0.0.1) whose two samplers give what one
sampler gives: greedy token ids equal and logprobs to 1e-5 before a step and to 1e-4
after it (float32; the step's numbers equal the one-process step's up to summation
order), rank 1 returning its share each time; a seeded round reproducible; after a resume
from a checkpoint every rank's sampler back at its weights."""

from __future__ import annotations

import importlib.util
import multiprocessing
from pathlib import Path

import pytest
import torch

from node.ranked_sampler import prompt_shares, share_seed
from swarm.config import parse_config
from swarm.errors import ConfigError
from tests.node import ranked_sampler_case

pytestmark = pytest.mark.slow(seconds=60)


def test_prompt_shares_cover_the_prompts_in_order() -> None:
    assert prompt_shares(5, 2) == [range(0, 3), range(3, 5)]
    assert prompt_shares(1, 3) == [range(0, 1), range(1, 1), range(1, 1)]
    assert [i for r in prompt_shares(17, 4) for i in r] == list(range(17))
    with pytest.raises(ValueError):
        prompt_shares(3, 0)


def test_share_seeds_differ_per_share_and_keep_no_seed() -> None:
    assert share_seed(None, 1) is None
    assert share_seed(7, 0) == share_seed(7, 0) != share_seed(7, 1)
    assert share_seed(7, 0) != share_seed(8, 0)


def _config(**sections: dict) -> None:
    parse_config({"model": {"seed": 0}, **sections})


def test_the_config_refuses_what_cannot_sample_on_ranks() -> None:
    ranks = {"parallel": "ddp", "ranks": 2}
    with pytest.raises(ConfigError, match=r"data_parallel = true needs train\.ranks > 1"):
        _config(sampler={"data_parallel": True})
    with pytest.raises(ConfigError, match="every rank holds one"):
        _config(train=ranks, sampler={"backend": "vllm", "data_parallel": False})
    with pytest.raises(ConfigError, match="nothing to overlap"):
        _config(train=ranks, sampler={"data_parallel": True, "overlap": True})
    with pytest.raises(ConfigError, match=r"must divide train\.ranks"):
        _config(
            train={"parallel": "fsdp", "ranks": 3},
            sampler={"backend": "vllm", "vllm_tensor_parallel_size": 2},
        )
    fsdp = {"parallel": "fsdp", "ranks": 2}
    assert parse_config({"train": fsdp, "sampler": {"backend": "vllm"}}).samples_on_every_rank()
    assert parse_config({"train": ranks}).samples_on_every_rank()  # DDP: the replica samples
    assert not parse_config({"train": fsdp}).samples_on_every_rank()  # a whole copy each
    assert not parse_config({"train": ranks, "sampler": {"overlap": True}}).samples_on_every_rank()


def _same(a: list, b: list, atol: float) -> bool:
    """Same token ids, logprobs within `atol`."""
    for ga, gb in zip(a, b, strict=True):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(ga, gb, strict=True):
            if ids_a != ids_b or not torch.allclose(
                torch.tensor(lp_a), torch.tensor(lp_b), atol=atol
            ):
                return False
    return True


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_sampling_ranks_give_what_one_sampler_gives(kind: str, tmp_path: Path) -> None:
    _two_ranks_against_one(kind, "transformers", tmp_path, 1e-5)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_vllm_engines_on_the_ranks_give_what_one_sampler_gives(
    kind: str, tmp_path: Path
) -> None:
    """vLLM on a node of 2 ranks: each rank's engine forms over the node's process group
    (before, rank 0's engine waited forever in vLLM's group setup for a rank that was
    waiting for a command). Compared with transformers' greedy completions (the two
    backends agree to 1e-4 on this model: `tests/policy/test_vllm_sampler.py`)."""
    _two_ranks_against_one(kind, "vllm", tmp_path, 1e-4)


def _two_ranks_against_one(kind: str, backend: str, tmp_path: Path, atol: float) -> None:
    out = tmp_path / "result.pt"
    process = multiprocessing.get_context("spawn").Process(
        target=ranked_sampler_case.compare, args=(kind, str(tmp_path), str(out), backend)
    )
    process.start()
    process.join(240)
    if process.is_alive():
        process.kill()
    assert process.exitcode == 0, f"exit {process.exitcode}; rank log: {tmp_path}/two/ranks"
    got = torch.load(out, weights_only=False)
    assert got["counts"] == [3, 2]  # rank 1 sampled the last 2 of the 5 prompts
    assert got["sampled_counts"] == [3, 2]
    assert _same(got["two_start"], got["one_start"], atol)
    assert got["sampled"] == got["sampled_again"]
    assert all(len(ids) == 4 for ids in got["sampled"])
    assert got["versions"] == [1, 1]
    assert _same(got["two_trained"], got["one_trained"], max(atol, 1e-4))
    # The step moved rank 1's share too (its sampler took the new weights) ...
    assert not _same(got["two_trained"][3:], got["two_start"][3:], 1e-3)
    # ... and the resume moved it back.
    assert _same(got["two_loaded"], got["one_start"], atol)
