"""`swarm train` and `swarm peers` run for real (tiny model; a libp2p endpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _swarm(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_swarm_train_runs_a_silo_node_and_resumes(tmp_path: Path) -> None:
    config = ROOT / "examples" / "node-silo.toml"
    first = _swarm("train", "-c", str(config), "--rounds", "2", "--data-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr[-2000:]
    second = _swarm("train", "-c", str(config), "--rounds", "1", "--data-dir", str(tmp_path))
    assert second.returncode == 0, second.stderr[-2000:]
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2, 3]  # the second run resumed at round 2
    assert all(r["external_groups"] == 0 and r["local_groups"] == 8 for r in records)


def test_swarm_peers_starts_a_libp2p_endpoint_and_reports(tmp_path: Path) -> None:
    config = tmp_path / "peer.toml"
    init = _swarm("init", str(config), "--data-dir", str(tmp_path / "data"))
    assert init.returncode == 0, init.stderr
    result = _swarm(
        "peers", "-c", str(config), "--seconds", "2", "--listen", "/ip4/127.0.0.1/tcp/0", timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    started = events[0]
    assert started["event"] == "started" and started["peer_id"].startswith("12D3KooW")
    assert any(a.startswith("/ip4/127.0.0.1/tcp/") for a in started["listen"])
    assert events[-1]["event"] == "counters"
