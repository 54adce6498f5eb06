"""`run_scenario` layout with variants, `write_report`, and the typer commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from simnet.cli import report_command, simnet_app
from simnet.report import load_runs, table_rows, write_report
from simnet.runs import run_scenario
from swarm.errors import ConfigError
from tests.simnet.helpers import scenario

GRID = [
    {
        "name": "i4-j0",
        "label": "4/0",
        "defaults": {"sapo": {"local_groups": 4, "external_groups": 0}},
    },
    {
        "name": "i2-j2",
        "label": "2/2",
        "defaults": {"sapo": {"local_groups": 2, "external_groups": 2}},
    },
]


def _grid(tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "grid"
    seen = []
    result = run_scenario(scenario(rounds=8, seeds=[0, 1], variants=GRID), out, seen.append)
    assert seen[-1].finished and seen[-1].run == "i2-j2/seed-1"
    assert [p.node_rounds_done for p in seen if p.run == "i4-j0/seed-0"][-1] == 4 * 8
    return out, result


def test_variants_times_seeds_layout_and_summary(tmp_path: Path) -> None:
    out, result = _grid(tmp_path)
    for variant in ("i4-j0", "i2-j2"):
        for seed in (0, 1):
            run = out / variant / f"seed-{seed}"
            assert (run / "run.json").exists()
            assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [
                f"n-{i}" for i in range(4)
            ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary == result
    labels = [row["label"] for row in summary["configurations"]]
    assert labels == ["4/0", "2/2"]
    assert summary["configurations"][0]["external_per_round"] == 0.0
    assert summary["configurations"][1]["external_per_round"] > 0.0
    with pytest.raises(ConfigError, match="exists and is not empty"):
        run_scenario(scenario(rounds=8, seeds=[0], variants=GRID), out)
    with pytest.raises(ConfigError, match="unknown variant"):
        run_scenario(scenario(rounds=8, variants=GRID), tmp_path / "x", variants=["nope"])


def test_report_writes_plots_and_table(tmp_path: Path) -> None:
    out, result = _grid(tmp_path)
    paths = write_report(out, tmp_path / "report")
    assert [p.name for p in paths] == [
        "reward_per_round.png",
        "cumulative_reward.png",
        "paired_ratios.png",  # 4/0 is a silo control
        "report.md",
    ]
    for png in paths[:3]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = paths[3].read_text()
    assert "| 4/0 | 4/0 |" in table and "| 2/2 | 2/2 |" in table
    assert "| configuration | vs 4/0 |" in table and "| 2/2 | " in table.split("vs 4/0 |")[1]
    rows = table_rows(load_runs(out))
    for row, config in zip(rows, result["configurations"], strict=True):
        assert row["mean"] == pytest.approx(config["cumulative_mean"])
        assert row["std"] == pytest.approx(config["cumulative_std"])


def test_cli_run_and_report(tmp_path: Path) -> None:
    app = typer.Typer()
    app.add_typer(simnet_app, name="simnet")
    app.command("report")(report_command)
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "cli"\nrounds = 3\n[[nodes]]\ncount = 3\n[defaults.sampler]\ngroup_size = 4\n'
    )
    runner = CliRunner()
    result = runner.invoke(app, ["simnet", "run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "cumulative reward" in result.output and (tmp_path / "out/report.md").exists()
    again = runner.invoke(app, ["simnet", "run", str(path), "-o", str(tmp_path / "out")])
    assert again.exit_code == 2 and "error:" in again.output and "--force" in again.output
    report = runner.invoke(app, ["report", str(tmp_path / "out")])
    assert report.exit_code == 0 and "| cli |" in report.output
    missing = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert missing.exit_code == 2 and "no such directory" in missing.output
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\nrounds = 0\n[[nodes]]\n')
    invalid = runner.invoke(app, ["simnet", "run", str(bad)])
    assert invalid.exit_code == 2 and "rounds" in invalid.output


def test_runs_made_variant_by_variant_end_in_one_summary(tmp_path: Path) -> None:
    """A grid run one variant and seed at a time (as long grids are) must leave a summary
    of every configuration in the scenario's order: each call used to replace it with its
    own runs, and the report then compared everything with the last variant run."""
    out = tmp_path / "grid"
    grid = scenario(rounds=8, seeds=[0, 1], variants=GRID)
    run_scenario(grid, out, variants=["i2-j2"], seeds=[0])
    run_scenario(grid, out, variants=["i4-j0"], seeds=[0])
    result = run_scenario(grid, out, variants=["i2-j2"], seeds=[1])
    assert [r["dir"] for r in result["runs"]] == ["i4-j0/seed-0", "i2-j2/seed-0", "i2-j2/seed-1"]
    assert [c["label"] for c in result["configurations"]] == ["4/0", "2/2"]
    assert json.loads((out / "summary.json").read_text()) == result
    assert [row["label"] for row in table_rows(load_runs(out))] == ["4/0", "2/2"]
    # The summary of another scenario (here: of another length) is replaced, not merged.
    other = scenario(rounds=6, seeds=[0], variants=GRID)
    replaced = run_scenario(other, out / "other", variants=["i2-j2"])
    (out / "summary.json").write_text(json.dumps(replaced))
    fresh = run_scenario(grid, out, variants=["i4-j0"], seeds=[1])
    assert [r["dir"] for r in fresh["runs"]] == ["i4-j0/seed-1"]
