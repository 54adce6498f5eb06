"""A broker outage, as real `swarm join` processes over a real mosquitto broker.

Two nodes start before their broker does (a user who forgot it, or a machine whose
broker comes up later): each says so, trains alone, connects once the broker is up and
trains on the other's groups. Then the broker is stopped for several seconds and started
again on the same port. Both nodes must keep training through the outage (as silos:
their publishes are dropped and counted, never raised), reconnect by themselves, and
train on each other's groups again afterwards.
"""

from __future__ import annotations

import os
import re
import signal
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
from tests.gossip.conftest import Broker, mosquitto_path
from tests.node.process_helpers import senders

pytestmark = pytest.mark.slow

OUTAGE_S = 6.0
TIMEOUT_S = 120.0


def _until(check: object, what: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():  # type: ignore[operator]
        assert all(p.poll() is None for p in procs), f"a node exited while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {TIMEOUT_S} s"
        time.sleep(0.2)


def test_nodes_train_through_a_broker_outage_and_share_again(tmp_path: Path) -> None:
    binary = mosquitto_path()
    if binary is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto; CI installs it)")
    (tmp_path / "broker").mkdir()
    broker = Broker(binary, tmp_path / "broker")  # not started yet: the nodes come first
    paths = write_configs(2, 100_000, tmp_path)
    for path in paths:
        config = tomllib.loads(path.read_text())
        config["transport"] = {"type": "mqtt", "host": broker.host, "port": broker.port}
        # A slow learner keeps reward variance: this tests sharing, not learning.
        config.setdefault("train", {})["learning_rate"] = 1e-6
        path.write_text(tomli_w.dumps(config))
    ids = [load_or_create_key_file(tmp_path / f"node-{i}" / "node.key").peer_id for i in (0, 1)]
    metrics = [tmp_path / f"node-{i}" / "metrics.jsonl" for i in (0, 1)]
    logs = [tmp_path / f"node-{i}.log" for i in (0, 1)]
    procs = [
        spawn_join(path, 1_000_000, stdout=subprocess.DEVNULL, stderr=log.open("a"))
        for path, log in zip(paths, logs, strict=True)
    ]

    def shared_since(marks: list[int]) -> bool:
        return all(
            ids[1 - i] in senders(read_metrics(metrics[i])[marks[i] :]) for i in (0, 1)
        )

    try:
        _until(lambda: all(len(read_metrics(m)) >= 5 for m in metrics), "rounds alone", procs)
        for log in logs:
            assert "training alone meanwhile" in log.read_text(), log.read_text()[-3000:]
        broker.start()
        first = [len(read_metrics(m)) for m in metrics]
        _until(lambda: shared_since(first), "sharing once the broker is up", procs)

        broker.stop()
        down = [len(read_metrics(m)) for m in metrics]
        time.sleep(OUTAGE_S)
        during = [len(read_metrics(m)) - d for m, d in zip(metrics, down, strict=True)]
        assert all(n >= 5 for n in during), during  # training went on, alone
        assert all(p.poll() is None for p in procs)

        broker.start()
        restarted = time.monotonic()
        back = [len(read_metrics(m)) for m in metrics]
        _until(lambda: shared_since(back), "sharing after the broker came back", procs)
        print(f"sharing again {time.monotonic() - restarted:.1f} s after the broker restart")
        for i in (0, 1):
            transport = read_metrics(metrics[i])[-1]["transport"]
            print(f"node-{i}: {during[i]} rounds during the outage; {transport}")
            assert transport["dropped_outgoing"] > 0, transport  # counted, not raised
            assert transport["reconnects"] >= 1 and transport["connected"], transport
        # ... and `swarm status` says so (it said nothing of an outage before).
        status = subprocess.run(
            [sys.executable, "-m", "cli.main", "status", str(metrics[0].parent)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        row = next(line for line in status.stdout.splitlines() if "publishes not sent" in line)
        unsent, reconnects = (int(x.replace(",", "")) for x in re.findall(r"[\d,]+", row)[:2])
        assert unsent > 0 and reconnects >= 1, row
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(None)
        broker.stop()
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    assert all("Traceback" not in log.read_text() for log in logs)
