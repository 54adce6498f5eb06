"""A new user's first run: `swarm init` then `swarm train` learns, with fresh seeds."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from node.metrics import read_metrics
from swarm.config import load_config

runner = CliRunner()


def _init(path: Path, *args: str) -> None:
    result = runner.invoke(app, ["init", str(path), *args])
    assert result.exit_code == 0, result.output


def test_two_inits_get_distinct_seeds(tmp_path: Path) -> None:
    _init(tmp_path / "a.toml", "--name", "a")
    _init(tmp_path / "b.toml", "--name", "b")
    a, b = load_config(tmp_path / "a.toml"), load_config(tmp_path / "b.toml")
    assert a.model.seed != b.model.seed and a.tasks.seed != b.tasks.seed
    assert a.model.seed != a.tasks.seed
    _init(tmp_path / "c.toml", "--seed", "5")
    _init(tmp_path / "d.toml", "--seed", "5")
    c, d = load_config(tmp_path / "c.toml"), load_config(tmp_path / "d.toml")
    assert (c.model.seed, c.tasks.seed) == (d.model.seed, d.tasks.seed)


def test_config_check_catches_a_missing_model_path(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[model]\nname_or_path = "./models/smollm2-typo"\n')
    result = runner.invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert "model.name_or_path" in result.output and "does not exist" in result.output
    assert "Traceback" not in result.output


def test_an_unloadable_model_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "broken-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "no-such-architecture"}')
    path = tmp_path / "node.toml"
    path.write_text(f'[model]\nname_or_path = "{folder}"\n[node]\ndata_dir = "{tmp_path}/d"\n')
    result = runner.invoke(app, ["train", "--config", str(path), "--rounds", "1"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot load model"), result.output


@pytest.mark.slow
def test_init_then_train_learns_alone(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    _init(path, "--seed", "11", "--data-dir", str(tmp_path / "run"))
    result = runner.invoke(app, ["train", "--config", str(path), "--rounds", "120"])
    assert result.exit_code == 0, result.output
    rewards = [r["mean_local_reward"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert len(rewards) == 120
    first, last = statistics.fmean(rewards[:20]), statistics.fmean(rewards[-20:])
    assert last > first + 0.2, (first, last)
    evals = [r["eval"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["eval"]]
    assert evals[0]["policy_version"] == 0 and len(evals) == 5  # every 25 rounds
    assert evals[-1]["accuracy"] > evals[0]["accuracy"], evals
    shown = runner.invoke(app, ["samples", str(tmp_path / "run"), "--last", "2"])
    assert shown.exit_code == 0 and shown.output.count("round 120") == 2, shown.output
    assert "[EOS]" in shown.output or "[cut]" in shown.output
