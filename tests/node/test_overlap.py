"""`sampler.overlap`: round r+1 is sampled while round r trains, from one-step-old weights."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from node.build import build_node
from node.metrics import read_metrics
from node.policy_learner import PolicyLearner
from node.starter import learning_settings, merge
from swarm.config import parse_config

ROUNDS = 8


def _run(tmp_path: Path, overlap: bool) -> list[dict]:
    config = parse_config(
        merge(
            learning_settings(),
            {
                "node": {"name": "o", "data_dir": str(tmp_path / str(overlap))},
                "transport": {"type": "memory", "network": f"overlap-{overlap}"},
                "sapo": {"external_groups": 0},
                "sampler": {"overlap": overlap},
                "model": {"seed": 3},
                "tasks": {"seed": 4},
            },
        )
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
    versions = [0] + [r["policy_version"] for r in records]  # versions[k]: after round k
    lag = 2 if overlap else 1  # round k samples with the weights after round k - lag
    for k, record in enumerate(records, start=1):
        assert record["sampled_version"] == versions[max(k - lag, 0)], (k, records)
    assert versions[-1] > 2  # it trained: the lag is observable
    samples = [
        json.loads(line)
        for line in (tmp_path / str(overlap) / "samples.jsonl").read_text().splitlines()
    ]
    by_round = {r["round"]: r["sampled_version"] for r in records}
    assert all(s["policy_version"] == by_round[s["round"]] for s in samples)


def test_overlap_is_off_by_default(tmp_path: Path) -> None:
    """On this project's 2-core CPUs overlapped rounds were slower (benchmarks/overlap.py)."""
    config = parse_config(
        {
            "node": {"name": "d", "data_dir": str(tmp_path)},
            "transport": {"type": "memory"},
            "model": {"name_or_path": "builtin:tiny", "device": "cpu"},
        }
    )
    assert PolicyLearner(config).sample_overlap is False
