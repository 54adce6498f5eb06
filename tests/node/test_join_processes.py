"""`swarm join` as real OS processes over libp2p on 127.0.0.1 with the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from node.checkpoints import latest_valid, round_of
from node.demo import write_configs
from node.metrics import read_metrics
from tests.node.process_helpers import edit_config, start_join

pytestmark = pytest.mark.slow


def _join(
    config: Path, rounds: int, log: Path, wait_peers: int = 0, own_process_group: bool = False
) -> subprocess.Popen:
    return start_join(
        config,
        rounds,
        stdout=subprocess.DEVNULL,
        stderr=log.open("a"),
        wait_peers=wait_peers,
        own_process_group=own_process_group,
    )


def _wait(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 1)))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    return codes


def test_three_join_processes_share_rollouts(tmp_path: Path) -> None:
    # A node used 6-12 of each peer's groups in 20 rounds (one measured run: early on,
    # most groups score all-zero and carry no signal), so none from one of the six
    # (node, peer) pairs was a ~1.5%-a-run event at 20 rounds; 30 make it ~0.1%.
    rounds = 30
    configs = write_configs(3, rounds, tmp_path)
    for config in configs:  # all on one machine: one network, the draw as without it
        config.write_text(config.read_text() + "\n[sapo]\nnetworks_first = true\n")
    procs = []
    for index, config in enumerate(configs):
        # Each waits for both others before its first round (a loaded machine can start
        # a node after its bootstrap peer has finished all its rounds otherwise).
        procs.append(_join(config, rounds, tmp_path / f"node-{index}.log", wait_peers=2))
        time.sleep(0.3)
    codes = _wait(procs, 240)
    logs = {i: (tmp_path / f"node-{i}.log").read_text()[-3000:] for i in range(3)}
    assert codes == [0, 0, 0], logs
    peer_ids = [(tmp_path / f"node-{i}" / "node.key") for i in range(3)]
    assert all(p.exists() for p in peer_ids)
    used_by = {}
    for index in range(3):
        records = read_metrics(tmp_path / f"node-{index}" / "metrics.jsonl")
        assert len(records) == rounds
        senders: set[str] = set()
        for record in records:
            senders.update(record["external_by_sender"])
        used_by[index] = senders
        assert sum(r["external_groups"] for r in records) > 0, logs[index]
    # The middle node is every other node's bootstrap peer, connected to both directly:
    # its last checkpoint says where its transport saw them (`node.trust`).
    saved = latest_valid(tmp_path / "node-1")
    assert saved is not None
    senders = json.loads((saved / "node.json").read_text())["pool"]["trust"]["senders"]
    networks = {row[0]: row[3] for row in senders}
    assert networks == dict.fromkeys(used_by[1], "127.0.0.0/8"), networks
    for index in range(3):
        others = set().union(*(used_by[j] for j in range(3) if j != index))
        # every node's groups were used by some peer, and each node used both others
        assert len(used_by[index]) == 2, (index, used_by, logs[index])
        assert others


def test_sigkill_then_resume_continues(tmp_path: Path) -> None:
    configs = write_configs(1, 6, tmp_path)
    config = configs[0]
    text = edit_config(config.read_text(), ("checkpoint_every = 3", "checkpoint_every = 2"))
    config.write_text(text)
    data = tmp_path / "node-0"
    log = tmp_path / "node-0.log"
    proc = _join(config, 1000, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(read_metrics(data / "metrics.jsonl")) >= 5:
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = read_metrics(data / "metrics.jsonl")
    newest = latest_valid(data)
    assert newest is not None, log.read_text()
    resumed_round = round_of(newest)
    # Checkpoints are written in the background: round 4's may still have been in flight
    # at the kill (on a loaded machine), but each checkpoint waits for the previous write,
    # so round 2's was complete once round 4's was captured (before its metrics line).
    assert resumed_round is not None and resumed_round >= 2
    # What the checkpoint holds, read from it: the kill can land after the checkpoint of
    # a round and before that round's metrics line, so `before` may lack that line.
    saved = data / "checkpoints" / f"round-{resumed_round:08d}"
    version_at_checkpoint = json.loads((saved / "manifest.json").read_text())["manifest"][
        "policy_version"
    ]
    assert "senders" in json.loads((saved / "node.json").read_text())
    proc = _join(config, 3, log)
    assert _wait([proc], 120) == [0], log.read_text()[-3000:]
    assert f"at round {resumed_round}" in log.read_text()
    after = read_metrics(data / "metrics.jsonl")[len(before) :]
    assert [r["round"] for r in after] == [resumed_round + 1, resumed_round + 2, resumed_round + 3]
    # A round steps the optimizer once, or not at all if no group carried signal.
    assert version_at_checkpoint <= after[0]["policy_version"] <= version_at_checkpoint + 1
    assert json.loads(
        (data / "checkpoints" / f"round-{resumed_round + 3:08d}" / "manifest.json").read_text()
    )


def test_ctrl_c_stops_cleanly_with_a_checkpoint(tmp_path: Path) -> None:
    config = write_configs(1, 1000, tmp_path)[0]
    data = tmp_path / "node-0"
    log = tmp_path / "node-0.log"
    proc = _join(config, 1000, log, own_process_group=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(read_metrics(data / "metrics.jsonl")) < 3:
        time.sleep(0.2)
    # As a terminal's Ctrl-C: the whole process group, the node's workers included (each
    # printed a KeyboardInterrupt traceback when they did not ignore it).
    os.killpg(proc.pid, signal.SIGINT)
    assert _wait([proc], 60) == [0], log.read_text()[-3000:]
    done = len(read_metrics(data / "metrics.jsonl"))
    assert done >= 3
    assert "checkpoint written" in log.read_text()
    assert (data / "checkpoints" / f"round-{done:08d}" / "node.json").exists()
    assert "Traceback" not in log.read_text()
