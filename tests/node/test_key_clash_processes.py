"""Two nodes started with the same key, as real `swarm join` processes over libp2p.

Found by hand: a copy of a node's data dir (its `node.key` inside) started on another
machine connects to the swarm, and libp2p then lets only one of the two be heard: the
other trained alone for ever, its table saying `peers 0`, and nothing told its user why.
Now the deaf one says so (`node.silence`) within about half a minute.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from node.demo import write_configs
from node.metrics import read_metrics
from node.ports import free_port
from node.silence import SILENT_AFTER_S
from tests.node.process_helpers import start_join

pytestmark = pytest.mark.slow(seconds=60)

WARNING = "heard nothing from anyone"


def test_a_node_deafened_by_a_clone_of_its_key_says_why(tmp_path: Path) -> None:
    config_a, config_b = write_configs(2, 1000, tmp_path)
    clone_dir = tmp_path / "clone"
    clone_dir.mkdir()
    shutil.copy(tmp_path / "node-1" / "node.key", clone_dir / "node.key")
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b", "clone")}
    procs: dict[str, subprocess.Popen] = {}

    def spawn(name: str, config: Path, *extra: str) -> None:
        procs[name] = start_join(config, 100_000, stdout=subprocess.DEVNULL,
                                 stderr=logs[name].open("w"), extra_args=extra)  # fmt: skip

    try:
        spawn("a", config_a)
        spawn("b", config_b)
        deadline = time.monotonic() + 120
        while not any(r["peers"] for r in read_metrics(tmp_path / "node-1" / "metrics.jsonl")):
            assert time.monotonic() < deadline, logs["b"].read_text()[-2000:]
            assert all(p.poll() is None for p in procs.values())
            time.sleep(0.5)
        # The same config and key on "another machine": its own data dir and port.
        listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
        spawn("clone", config_b, "--data-dir", str(clone_dir), "--listen", listen)
        deadline = time.monotonic() + SILENT_AFTER_S + 60
        warned: list[str] = []
        while not warned:
            assert time.monotonic() < deadline, {n: p.read_text()[-1500:] for n, p in logs.items()}
            assert all(p.poll() is None for p in procs.values())
            warned = [name for name in ("b", "clone") if WARNING in logs[name].read_text()]
            time.sleep(1)
        assert "another node running with this node's key" in logs[warned[0]].read_text()
        assert WARNING not in logs["a"].read_text()  # A hears B (one of the two)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            proc.wait(timeout=60)
