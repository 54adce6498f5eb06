"""A new user's first run: `swarm init` then `swarm train` learns, each node with its
own seeds; so does a hand-written config of nothing but a name and a data dir."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from node.metrics import read_metrics
from rewards.mixture import TaskStream
from swarm.config import load_config, parse_config
from swarm.identity import Identity

runner = CliRunner()


def _init(path: Path, *args: str) -> None:
    result = runner.invoke(app, ["init", str(path), *args])
    assert result.exit_code == 0, result.output


def test_nodes_made_from_one_init_file_get_their_own_seeds(tmp_path: Path) -> None:
    """Issue 34: two copies of one config ran with identical seeds and task streams.
    `swarm init` writes no seed: each node derives its own from its key (the same key,
    the same seeds: a restart continues its task stream); `--seed` writes seeds."""
    _init(tmp_path / "a.toml", "--name", "a")
    config = load_config(tmp_path / "a.toml")
    assert config.model.seed is None and config.tasks.seed is None
    one, two = (Identity.from_seed(bytes([i]) * 32).peer_id for i in (1, 2))
    a, b = config.with_node_seeds(one), config.with_node_seeds(two)
    assert a.model.seed != b.model.seed and a.tasks.seed != b.tasks.seed
    assert a.model.seed != a.tasks.seed
    streams = [TaskStream(c.tasks, c.model.seed).next_refs(8) for c in (a, b)]
    assert streams[0] != streams[1]
    assert config.with_node_seeds(one) == a
    _init(tmp_path / "c.toml", "--seed", "5")
    _init(tmp_path / "d.toml", "--seed", "5")
    c, d = load_config(tmp_path / "c.toml"), load_config(tmp_path / "d.toml")
    assert c.model.seed is not None and c.model.seed != c.tasks.seed
    assert (c.model.seed, c.tasks.seed) == (d.model.seed, d.tasks.seed)


def test_init_writes_no_copy_of_the_defaults(tmp_path: Path) -> None:
    """Issue 34: `swarm init` wrote its own set of learning settings next to the config
    models' defaults. It writes the node's own keys; every default is commented out."""
    path = tmp_path / "me.toml"
    _init(path)
    keys = [
        line.split("=")[0].strip()
        for line in path.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    ]
    assert keys == ["name", "data_dir", "type"], keys
    assert load_config(path) == parse_config(
        {"node": {"name": "me", "data_dir": "runs/me"}, "transport": {"type": "libp2p"}}
    )


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
    """The file `swarm init` writes is the config models' defaults plus a name, a data
    dir and (here) seeds, so this is what a hand-written minimal config learns too."""
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
