"""A node that joins a running swarm late, as real `swarm join` processes over libp2p.

The situation the first design failed: node A has run for dozens of rounds when node B
starts with A as its bootstrap peer (the README's "Two nodes by hand"). Both must train
on each other's groups within a few rounds; again after B is SIGKILLed and restarted from
its checkpoint (its sequence numbers and version claims must still be accepted); and
again after A, the bootstrap peer, is SIGKILLed and restarted (B must re-dial it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from swarm.identity import load_or_create_key_file

pytestmark = pytest.mark.slow

HEAD_START_ROUNDS = 60
"""Rounds A has done before B starts (the old design refused everything after ~4)."""
WITHIN_ROUNDS = 10
"""B must use A's groups, and A B's, within this many of B's rounds."""


def _spawn(config: Path, rounds: int, log: Path, wait_peers: int = 0) -> subprocess.Popen:
    return spawn_join(
        config, rounds, stdout=subprocess.DEVNULL, stderr=log.open("a"), wait_peers=wait_peers
    )


def _wait_rounds(metrics: Path, rounds: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(read_metrics(metrics)) < rounds:
        assert proc.poll() is None, f"exited with {proc.returncode} before round {rounds}"
        assert time.monotonic() < deadline, f"fewer than {rounds} rounds in {timeout} s"
        time.sleep(0.2)


def _senders(records: list[dict]) -> set[str]:
    return {sender for record in records for sender in record["external_by_sender"]}


def test_a_late_joiner_shares_both_ways_and_again_after_a_kill(tmp_path: Path) -> None:
    config_a, config_b = write_configs(2, 1000, tmp_path)
    for config in (config_a, config_b):
        text = config.read_text().replace("checkpoint_every = 500", "checkpoint_every = 2")
        config.write_text(text)
    metrics_a = tmp_path / "node-0" / "metrics.jsonl"
    metrics_b = tmp_path / "node-1" / "metrics.jsonl"
    id_a = load_or_create_key_file(tmp_path / "node-0" / "node.key").peer_id
    id_b = load_or_create_key_file(tmp_path / "node-1" / "node.key").peer_id
    log_a, log_b = tmp_path / "node-0.log", tmp_path / "node-1.log"

    a = _spawn(config_a, 100_000, log_a)
    b: subprocess.Popen | None = None
    try:
        _wait_rounds(metrics_a, HEAD_START_ROUNDS, a, 300)
        alone = read_metrics(metrics_a)
        assert _senders(alone) == set()  # nobody else was there

        # 1. B joins late and runs WITHIN_ROUNDS rounds.
        b = _spawn(config_b, WITHIN_ROUNDS, log_b)
        assert b.wait(timeout=300) == 0, log_b.read_text()[-3000:]
        first_b = read_metrics(metrics_b)
        assert len(first_b) == WITHIN_ROUNDS
        assert id_a in _senders(first_b), log_b.read_text()[-3000:]
        a_meanwhile = read_metrics(metrics_a)[len(alone) :]
        assert id_b in _senders(a_meanwhile), log_a.read_text()[-3000:]
        assert "from_future" not in log_a.read_text() + log_b.read_text()

        # 2. B runs on, is SIGKILLed, and restarts from its last checkpoint.
        b = _spawn(config_b, 1000, log_b)
        _wait_rounds(metrics_b, WITHIN_ROUNDS + 5, b, 300)
        os.kill(b.pid, signal.SIGKILL)
        b.wait()
        before_restart_b = len(read_metrics(metrics_b))
        before_restart_a = len(read_metrics(metrics_a))
        b = _spawn(config_b, WITHIN_ROUNDS, log_b)
        assert b.wait(timeout=300) == 0, log_b.read_text()[-3000:]
        after_b = read_metrics(metrics_b)[before_restart_b:]
        assert len(after_b) == WITHIN_ROUNDS
        assert id_a in _senders(after_b), log_b.read_text()[-3000:]
        after_a = read_metrics(metrics_a)[before_restart_a:]
        assert id_b in _senders(after_a), log_a.read_text()[-3000:]
        assert a.poll() is None, log_a.read_text()[-3000:]  # A never stopped

        # 3. Now A (the bootstrap peer) is SIGKILLed while B runs, and restarts.
        b = _spawn(config_b, 1000, log_b)
        _wait_rounds(metrics_b, len(read_metrics(metrics_b)) + 3, b, 300)
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        before_restart_a = len(read_metrics(metrics_a))
        before_restart_b = len(read_metrics(metrics_b))
        # A cannot dial B (B is not its bootstrap peer): B re-dials A with backoff, which
        # takes seconds, while a tiny-model round takes ~30 ms: A waits for its peer.
        a = _spawn(config_a, WITHIN_ROUNDS, log_a, wait_peers=1)
        assert a.wait(timeout=300) == 0, log_a.read_text()[-3000:]
        after_a = read_metrics(metrics_a)[before_restart_a:]
        assert len(after_a) == WITHIN_ROUNDS
        assert id_b in _senders(after_a), log_a.read_text()[-3000:]
        after_b = read_metrics(metrics_b)[before_restart_b:]
        assert id_a in _senders(after_b), log_b.read_text()[-3000:]
        assert b.poll() is None, log_b.read_text()[-3000:]  # B went on alone meanwhile
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in (a, b):
            if proc is not None:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert a.returncode == 0, log_a.read_text()[-3000:]
    assert b is not None and b.returncode == 0, log_b.read_text()[-3000:]
