"""Small stub scenarios for the simnet tests, built as dicts and validated."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from node.metrics import read_metrics
from simnet.scenario import Scenario, parse_scenario

BASE: dict[str, Any] = {
    "name": "t",
    "rounds": 12,
    "seeds": [0],
    "checkpoint_every": 0,
    "defaults": {
        "sapo": {"local_groups": 2, "external_groups": 2, "max_staleness": 2},
        "sampler": {"group_size": 4},
    },
    "compute": {
        "sample_s_per_group": 1.0,
        "train_s_per_group": 0.5,
        "round_overhead_s": 1.0,
        "jitter": 0.2,
    },
    "nodes": [{"name": "n", "count": 4, "model": "stub", "stub": {"skill": 0.3, "rate": 0.01}}],
    "network": {"latency": {"type": "uniform", "low_ms": 10, "high_ms": 90}},
}
"""4 stub nodes, 2 local / 2 external groups of 4; a round is about 5 virtual seconds."""


def scenario(**changes: Any) -> Scenario:
    """BASE with top-level keys replaced (dicts are merged one level deep)."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_scenario(data, "<test>")


def records(run_dir: Path, node: str) -> list[dict[str, Any]]:
    return read_metrics(run_dir / node / "metrics.jsonl")
