"""A quick node next to a node whose process stops for a while (Ctrl-Z, SIGSTOP, a
suspended laptop or VM), as real `swarm join` processes over libp2p.

Found by hand, twice:
- B stopped for 90 s next to A, then continued, ignored A for the next two minutes. A
  had gone on publishing at its usual rate; what the transports buffered meanwhile
  reached B at once on waking, far beyond its rate limit's burst, and the refusals
  (`rate_limited`) scored A down until B ignored it. Now B counts the time it did not
  run as time the peers could send in (`gossip.ratelimit`), says so in its log, and
  uses A's groups again as soon as it has worked through the backlog.
- A node whose rounds came faster than a peer's rate limit (one batch a round) was
  ignored by that peer for being quick. It now coalesces its batches
  (`node.publish_pacing`).

Here A samples one group a round (20-40 rounds a second on this machine), and B takes
12 messages a second from a peer with a burst of 20 (the defaults are 50 and 500: a
machine a few times faster than this one, or a longer stop, meets them the same way).
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
from tests.node.process_helpers import set_config, wait_used

pytestmark = pytest.mark.slow(seconds=45)

STOPPED_S = 20.0
"""How long B is stopped: A publishes up to 10 batches a second meanwhile (at 12 s the
backlog past the burst was 77 refusals, just short of the 80 that get a peer ignored)."""
RATE, BURST = 12, 20
RUN_ON_S = 10.0
"""How long both run on once B has used A's groups after waking: unpaced, A's batches
(20-40 a second) get it ignored by B within a few seconds."""


def test_a_quick_peer_is_taken_up_also_by_a_node_stopped_for_a_while(tmp_path: Path) -> None:
    config_a, config_b = write_configs(2, 1000, tmp_path)
    for config in (config_a, config_b):
        # Slow learners: groups keep reward variance, so "used" does not hang on learning.
        set_config(config, train={"learning_rate": 1e-6})
        if config == config_a:
            set_config(config, sapo={"local_groups": 1})
        else:
            set_config(config, gossip={"rate_limit_per_s": RATE, "rate_burst": BURST})
    metrics_b = tmp_path / "node-1" / "metrics.jsonl"
    log_b = tmp_path / "node-1.log"
    id_a = load_or_create_key_file(tmp_path / "node-0" / "node.key").peer_id
    procs = [
        spawn_join(config, 100_000, stdout=subprocess.DEVNULL, stderr=log.open("w"))
        for config, log in ((config_a, tmp_path / "node-0.log"), (config_b, log_b))
    ]
    b = procs[1]
    try:
        wait_used(metrics_b, id_a, 0, b, 120)
        os.kill(b.pid, signal.SIGSTOP)
        time.sleep(STOPPED_S)
        os.kill(b.pid, signal.SIGCONT)
        woke = len(read_metrics(metrics_b))
        wait_used(metrics_b, id_a, woke, b, 60)
        time.sleep(RUN_ON_S)
        assert all(proc.poll() is None for proc in procs)
        last = read_metrics(metrics_b)[-1]
        assert last["peer_scores"]["ignores_started"] == 0, last["peer_scores"]
        assert "this process did not run for" in log_b.read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            proc.wait(timeout=60)
