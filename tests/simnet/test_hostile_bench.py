"""`benchmarks/hostile_swarm.py` in a stub-model smoke run: every configuration runs, the
silo comparison pairs the same honest nodes, and refusals are tabled by reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import hostile_swarm


def test_smoke_run_tables_each_configuration(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    figures = tmp_path / "runs.json"
    code = hostile_swarm.main(
        [
            "--quick", "--rounds", "4", "--seeds", "0", "--jobs", "1",
            "--kinds", "forged_rewards", "--fractions", "0.3",
            "--out", str(out), "--json", str(figures),
        ]
    )  # fmt: skip
    assert code == 0
    rows = {row["label"]: row for row in json.loads(figures.read_text())["rows"]}
    assert set(rows) == {"silo (no sharing)", "0% hostile", "forged_rewards 30%"}
    attacked = rows["forged_rewards 30%"]
    assert (attacked["honest"], attacked["attackers"]) == (7, 3)
    assert attacked["refused_per_node"]["forged_rewards"] > 0
    assert attacked["ignores_per_node"] >= 3  # each honest node ignored all three
    assert rows["silo (no sharing)"]["vs_silo"] == pytest.approx(1.0)
    assert "| forged_rewards 30% | 7 / 3 |" in out.read_text()
