"""A node of 2 training ranks (issue 36) as real processes: `swarm join` with
`train.parallel = "ddp"`, `train.ranks = 2` starts its second rank itself (gloo on
127.0.0.1; both ranks sample, the DDP default), joins a swarm of a one-process node over
libp2p and trains on its groups; SIGKILL of the second rank stops the node with an error
naming it; the node resumes on one rank from the checkpoint its 2 ranks wrote, and then on
2 FSDP ranks from that one-rank checkpoint, trains on its peer's groups again; SIGKILL of
rank 0 takes the other rank with it.
(`tests/policy/test_parallel.py` shows that the 2-rank step equals the 1-process step.)
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w

from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from swarm.identity import load_or_create_key_file
from tests.node.process_helpers import senders, wait_rounds, wait_used

pytestmark = pytest.mark.slow(seconds=90)


def _set_train(config: Path, **train: object) -> None:
    data = tomllib.loads(config.read_text())
    data.setdefault("train", {}).update(train)
    data.setdefault("node", {})["checkpoint_every"] = 2
    config.write_text(tomli_w.dumps(data))


def _rank_pid(log: Path, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        found = re.search(r"ready \((?:ddp|fsdp)\), pid (\d+)", text)
        if found:
            return int(found.group(1))
        time.sleep(0.2)
    raise AssertionError(f"rank 1 never said ready: {log}")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True  # exited, not yet reaped by its (dead) parent
        time.sleep(0.1)
    return False


def test_a_two_rank_node_trains_with_peers_survives_a_rank_kill_and_resumes_on_one(
    tmp_path: Path,
) -> None:
    config_a, config_b = write_configs(2, 1000, tmp_path)
    _set_train(config_a)
    _set_train(config_b, parallel="ddp", ranks=2)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    metrics_b = tmp_path / "node-1" / "metrics.jsonl"
    rank_log = tmp_path / "node-1" / "ranks" / "rank-1.log"
    peer_a = load_or_create_key_file(tmp_path / "node-0" / "node.key").peer_id
    a = spawn_join(config_a, 100_000, stdout=subprocess.DEVNULL, stderr=log_a.open("a"))
    b = spawn_join(config_b, 100_000, stdout=subprocess.DEVNULL, stderr=log_b.open("a"))
    try:
        # 1. The 2-rank node trains on the one-process node's groups (and steps: v > 0;
        # the round that first used them may have had nothing to train: all rewards 0).
        rank1 = _rank_pid(rank_log)
        wait_used(metrics_b, peer_a, 0, b, 240)
        records = read_metrics(metrics_b)
        assert peer_a in senders(records)
        wait_rounds(metrics_b, len(records) + 4, b, 120)  # a checkpoint after the peers' groups
        assert read_metrics(metrics_b)[-1]["policy_version"] > 0

        # 2. SIGKILL of rank 1: the node stops with an error that names it.
        os.kill(rank1, signal.SIGKILL)
        assert b.wait(timeout=120) != 0
        assert "rank 1" in log_b.read_text(), log_b.read_text()[-2000:]
        done = len(read_metrics(metrics_b))

        # 3. The same node on one rank resumes from the checkpoint its 2 ranks wrote.
        _set_train(config_b, parallel="none", ranks=1)
        b = spawn_join(config_b, 6, stdout=subprocess.DEVNULL, stderr=log_b.open("a"))
        assert b.wait(timeout=180) == 0, log_b.read_text()[-2000:]
        resumed = re.findall(r"resumed from \S+ at round (\d+)", log_b.read_text())
        assert resumed and done - 3 <= int(resumed[-1]) <= done, (resumed, done)
        assert len(read_metrics(metrics_b)) >= int(resumed[-1]) + 6

        # 4. Under FSDP on 2 ranks it resumes from the one-rank checkpoint and trains on
        # the peer's groups again; SIGKILL of rank 0 then takes rank 1 with it.
        _set_train(config_b, parallel="fsdp", ranks=2)
        rank_log.unlink()
        before = len(read_metrics(metrics_b))
        b = spawn_join(config_b, 100_000, stdout=subprocess.DEVNULL, stderr=log_b.open("a"))
        rank1 = _rank_pid(rank_log)
        wait_used(metrics_b, peer_a, before, b, 240)
        wait_rounds(metrics_b, len(read_metrics(metrics_b)) + 3, b, 120)  # (a step, as in 1.)
        again = re.findall(r"resumed from \S+ at round (\d+)", log_b.read_text())
        assert len(again) == len(resumed) + 1 and before - 2 <= int(again[-1]) <= before
        version = read_metrics(metrics_b)[before - 1]["policy_version"]
        assert read_metrics(metrics_b)[-1]["policy_version"] > version
        os.kill(b.pid, signal.SIGKILL)
        b.wait()
        assert _gone(rank1, 30), "rank 1 outlived rank 0"
        assert a.poll() is None, log_a.read_text()[-2000:]
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_on_another_machine_joins_through_the_rendezvous(tmp_path: Path) -> None:
    """`train.local_ranks` < `train.ranks`: rank 0 (`swarm train`) waits at
    `train.rendezvous` for the rank `swarm ranks` starts "on another machine" (here another
    process on 127.0.0.1, gloo kept on the loopback interface); they train together and the
    remote rank stops when rank 0 does."""
    config = tmp_path / "node.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "node": {"name": "three", "data_dir": str(tmp_path / "data")},
                "model": {"seed": 0},
                "train": {
                    "parallel": "ddp",
                    "ranks": 3,
                    "local_ranks": 2,
                    "rendezvous": f"127.0.0.1:{_free_port()}",
                },
            }
        )
    )
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    remote = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "ranks", "-c", str(config), "--first-rank", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        node = subprocess.run(
            [sys.executable, "-m", "cli.main", "train", "-c", str(config), "--rounds", "6"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert node.returncode == 0, node.stderr[-2000:]
        assert remote.wait(timeout=120) == 0
        log = (tmp_path / "data" / "ranks-from-2" / "rank-2.log").read_text()
        assert "rank 2 of 3 ready (ddp)" in log and "rank 2 stopped" in log, log
        records = read_metrics(tmp_path / "data" / "metrics.jsonl")
        assert len(records) == 6 and records[-1]["policy_version"] > 0
    finally:
        if remote.poll() is None:
            remote.kill()
            remote.wait()
