"""`benchmarks/hostile_swarm.py` in a stub-model smoke run: every configuration runs, the
silo comparison pairs the same honest nodes, and refusals are tabled by reason.

The benchmark is run as the program it is (`python -m benchmarks.hostile_swarm` from the
repository's root), not imported: benchmarks/ is not a package that ships.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_tables_each_configuration(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    figures = tmp_path / "runs.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.hostile_swarm",
            "--quick", "--rounds", "4", "--seeds", "0", "--jobs", "1",
            "--kinds", "forged_rewards", "--fractions", "0.3",
            "--out", str(out), "--json", str(figures),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["label"]: row for row in json.loads(figures.read_text())["rows"]}
    assert set(rows) == {"silo (no sharing)", "0% hostile", "forged_rewards 30%"}
    attacked = rows["forged_rewards 30%"]
    assert (attacked["honest"], attacked["attackers"]) == (7, 3)
    assert attacked["refused_per_node"]["forged_rewards"] > 0
    assert attacked["ignores_per_node"] >= 3  # each honest node ignored all three
    assert rows["silo (no sharing)"]["vs_silo"] == pytest.approx(1.0)
    assert "| forged_rewards 30% | 7 / 3 |" in out.read_text()
