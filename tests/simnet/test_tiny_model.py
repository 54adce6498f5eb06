"""Tiny-model mode: real `PolicyLearner`s (builtin:tiny) in simnet, deterministic."""

from __future__ import annotations

from pathlib import Path

from simnet.engine import Simulation
from tests.simnet.helpers import records, scenario


def test_tiny_model_nodes_run_deterministically(tmp_path: Path) -> None:
    run = scenario(
        rounds=3,
        defaults={
            "sapo": {"local_groups": 2, "external_groups": 2},
            "sampler": {"group_size": 4, "max_new_tokens": 3},
        },
        nodes=[{"name": "t", "count": 2, "model": "builtin:tiny"}],
    )
    first = Simulation(run, None, 0, tmp_path / "a").run()
    second = Simulation(run, None, 0, tmp_path / "b").run()
    for name in ("t-0", "t-1"):
        a = (tmp_path / "a" / name / "metrics.jsonl").read_bytes()
        assert a == (tmp_path / "b" / name / "metrics.jsonl").read_bytes()
        lines = records(tmp_path / "a", name)
        assert [r["round"] for r in lines] == [1, 2, 3]
        assert all(r["train"]["seconds"] == r["seconds"]["train"] for r in lines)
    assert first == second
    assert {n["model"] for n in first["nodes"]} == {"builtin:tiny"}
