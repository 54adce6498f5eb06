"""The `swarm` CLI: user mistakes are one clear line and exit 2; commands round-trip."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import cli.main
from cli.main import app
from swarm import __version__
from swarm.config import load_config

runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_keygen_writes_private_key_and_refuses_overwrite(tmp_path: Path) -> None:
    key = tmp_path / "k" / "node.key"
    result = runner.invoke(app, ["keygen", str(key)])
    assert result.exit_code == 0
    assert result.output.strip().startswith("12D3KooW")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    again = runner.invoke(app, ["keygen", str(key)])
    assert again.exit_code == 2
    assert "already exists" in again.output
    peer = runner.invoke(app, ["peerid", str(key)])
    assert peer.output.strip() == result.output.strip()


def test_world_readable_key_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    runner.invoke(app, ["keygen", str(key)])
    key.chmod(0o644)
    result = runner.invoke(app, ["peerid", str(key)])
    assert result.exit_code == 2
    assert "chmod 600" in result.output
    assert "Traceback" not in result.output


def test_init_names_the_node_after_its_file(tmp_path: Path) -> None:
    """The README's `swarm init me.toml` then `swarm status runs/me` (issue 34: the node
    was called "node", its data in runs/node, and the next three commands failed)."""
    path = tmp_path / "me.toml"
    assert runner.invoke(app, ["init", str(path)]).exit_code == 0
    config = load_config(path)
    assert config.node.name == "me" and config.node.data_dir == Path("runs/me")


def test_init_then_check_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "alice.toml"
    result = runner.invoke(app, ["init", str(path), "--name", "alice", "--transport", "mqtt"])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert text.count("#") > 30  # commented
    config = load_config(path)
    assert config.node.name == "alice"
    assert config.transport.type == "mqtt"
    check = runner.invoke(app, ["config", "check", str(path)])
    assert check.exit_code == 0
    assert "ok" in check.output


def test_config_check_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[sapo]\nexternal_groupz = 3\n[sampler]\nbackend = "tgi"\n')
    result = runner.invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert "sapo.external_groupz" in result.output
    assert "sampler.backend" in result.output and "vllm" in result.output
    assert "Traceback" not in result.output


def test_config_check_missing_file_and_bad_toml(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["config", "check", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2 and "not found" in missing.output
    broken = tmp_path / "broken.toml"
    broken.write_text("[node\nname=")
    result = runner.invoke(app, ["config", "check", str(broken)])
    assert result.exit_code == 2 and "not valid TOML" in result.output


def test_status_summarizes_metrics(tmp_path: Path) -> None:
    records = [
        {
            "round": i,
            "peers": 1,
            "first_external_round": 1,
            "policy_version": i,
            "mean_local_reward": 0.1 * i,
            "external_groups": 2,
            "external_by_sender": {"12D3KooWpeer": 2},
            "drops": {"bad_signature": 1},
            "bytes_in": 100 * i,
            "bytes_out": 50 * i,
            "seconds": {"sample": 0.5, "score": 0.01, "train": 0.4, "total": 1.0},
        }
        for i in range(1, 6)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n{torn")
    result = runner.invoke(app, ["status", str(tmp_path), "--last", "2"])
    assert result.exit_code == 0, result.output
    assert "bad_signature: 1" in result.output
    assert "0.450" in result.output  # mean of the last two rounds' rewards
    assert "first round with external groups" in result.output
    # Piped (as here) or logged, a table is not cut at 80 columns (issue 34).
    many = {"bad_signature": 1, "rate_limited": 12345, "prompt_mismatch": 7, "stale_version": 99}
    records[-1]["drops"] = many
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    wide = runner.invoke(app, ["status", str(tmp_path)]).output.splitlines()
    assert any(all(f"{k}: {v}" in line for k, v in many.items()) for line in wide), wide
    empty = runner.invoke(app, ["status", str(tmp_path / "none")])
    assert empty.exit_code == 2


def test_status_shows_peer_scores_and_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gossip.scoring import PeerScores
    from swarm.config.network import ScoringConfig

    class Still:
        def now(self) -> float:
            return 50.0

        async def sleep(self, seconds: float) -> None:
            return None

    scores = PeerScores(ScoringConfig(ignore_s=120), Still())
    for _ in range(4):
        scores.penalize("12D3KooWforger", "forged_rewards")
    scores.penalize("12D3KooWsloppy", "unknown_task")
    record = {
        "round": 1,
        "policy_version": 1,
        "mean_local_reward": 0.5,
        "external_groups": 0,
        "external_by_sender": {},
        "drops": {"forged_rewards": 4, "ignored_peer": 9},
        "peer_scores": scores.snapshot(),
        "bytes_in": 1,
        "bytes_out": 1,
        "seconds": {"sample": 0.5, "score": 0.01, "train": 0.4, "total": 1.0},
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    # A wide console of its own: the module's console fixed its width from COLUMNS when
    # cli.main was imported (pytest-xdist workers set COLUMNS=80).
    monkeypatch.setattr(cli.main, "console", Console(width=200))
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "1 / 1 / 0" in result.output  # ignored now / ignore periods / forgiven
    assert "ignored 120 s more; forged_rewards: 4" in result.output
    assert "heard; unknown_task: 1" in result.output


def test_a_bad_flag_is_named_as_the_flag_not_the_file(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    assert runner.invoke(app, ["init", str(config)]).exit_code == 0
    bad = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWcutshort"
    result = runner.invoke(app, ["join", "-c", str(config), "--bootstrap", bad])
    assert result.exit_code == 2
    assert f"{config} with --bootstrap: transport.libp2p.bootstrap" in result.output
    assert "'12D3KooWcutshort' is not a peer id" in result.output


def test_status_and_samples_take_a_config_file_and_init_makes_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: `swarm status alice.toml`, `swarm samples alice.toml` (NotADirectoryError)
    and `swarm init nodir/x.toml` (FileNotFoundError) ended in tracebacks."""
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["init", "nodir/alice.toml"]).exit_code == 0
    data_dir = tmp_path / "runs" / "alice"
    data_dir.mkdir(parents=True)
    record = {
        "round": 1,
        "peers": 0,
        "policy_version": 1,
        "mean_local_reward": 0.25,
        "external_groups": 0,
        "external_by_sender": {},
        "first_external_round": None,
        "drops": {},
        "bytes_in": 0,
        "bytes_out": 0,
        "seconds": {"sample": 0.5, "score": 0.0, "train": 0.5, "total": 1.0},
    }
    (data_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    status = runner.invoke(app, ["status", "nodir/alice.toml"])
    assert status.exit_code == 0 and "0.250" in status.output, status.output
    samples = runner.invoke(app, ["samples", "nodir/alice.toml"])
    assert samples.exit_code == 2 and "runs/alice: no samples.jsonl" in samples.output
    other = tmp_path / "notes.txt"
    other.write_text("x")
    for command in ("status", "samples"):
        result = runner.invoke(app, [command, str(other)])
        assert result.exit_code == 2 and "give a node's data_dir" in result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "command",
    [[], ["join"], ["config", "check"], ["status"], ["demo"], ["simnet"], ["simnet", "run"]],
)
def test_help_shows_no_value_placeholder_for_flags(command: list[str]) -> None:
    """Typer listed `--help` as `--help <bool>` (and `--json` likewise before): users then
    typed a value, which is refused. Flags show none."""
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--help" in result.output
    assert "<bool>" not in result.output
