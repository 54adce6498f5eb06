"""A node restarted with its clock an hour behind its previous run, as real `swarm join`
processes over libp2p (the clock faked by libfaketime in that process only).

Found by hand: such a node connected, and no pubsub traffic went either way. Every peer
that remembered it refused its RPCs whole, because the signed peer record on each RPC is
sequenced by its signer's wall clock and was older than the one stored
(`gossip.libp2p_records`). With that mended, a peer restarted from a checkpoint still
refused its envelopes as replays, their seqs (wall-clock microseconds) being below the
floor it restored for it (`node.resume`'s seq reservation). Both for as long as the clock
stayed behind: an hour here; for ever for a board whose clock starts in 1970.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
from pathlib import Path

import pytest

from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from swarm.identity import load_or_create_key_file
from tests.node.process_helpers import senders, wait_rounds

pytestmark = pytest.mark.slow(seconds=90)

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
AN_HOUR_AGO = {"LD_PRELOAD": LIBFAKETIME or "", "FAKETIME": "-1h"}
ROUNDS = 30
"""Each node must use the other's groups within this many of its rounds (see
`test_late_join_processes.WITHIN_ROUNDS`: the same slow learners)."""


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed (make system-deps)")
def test_a_node_restarted_with_its_clock_behind_shares_both_ways(tmp_path: Path) -> None:
    config_a, config_b = write_configs(2, 1000, tmp_path)
    for config in (config_a, config_b):
        text = config.read_text().replace("checkpoint_every = 500", "checkpoint_every = 2")
        config.write_text(text.replace("learning_rate = 0.0003", "learning_rate = 1e-06"))
    metrics = [tmp_path / f"node-{i}" / "metrics.jsonl" for i in (0, 1)]
    logs = [tmp_path / f"node-{i}.log" for i in (0, 1)]
    ids = [load_or_create_key_file(tmp_path / f"node-{i}" / "node.key").peer_id for i in (0, 1)]

    def spawn(i: int, rounds: int, **kwargs: object) -> subprocess.Popen:
        config = (config_a, config_b)[i]
        return spawn_join(config, rounds, stdout=subprocess.DEVNULL,
                          stderr=logs[i].open("a"), **kwargs)  # type: ignore[arg-type]  # fmt: skip

    def share(i: int, other: int, **kwargs: object) -> None:
        """Node `i` runs ROUNDS rounds next to the running `other`; each must use the
        other's groups meanwhile."""
        before, before_other = len(read_metrics(metrics[i])), len(read_metrics(metrics[other]))
        proc = spawn(i, ROUNDS, **kwargs)
        assert proc.wait(timeout=300) == 0, logs[i].read_text()[-3000:]
        mine = read_metrics(metrics[i])[before:]
        assert len(mine) == ROUNDS
        assert ids[other] in senders(mine), logs[i].read_text()[-3000:]
        theirs = read_metrics(metrics[other])[before_other:]
        assert ids[i] in senders(theirs), logs[other].read_text()[-3000:]

    a = spawn(0, 100_000)
    b: subprocess.Popen | None = None
    try:
        wait_rounds(metrics[0], 10, a, 300)
        share(1, 0)  # B's first run, on time
        # B again, its clock an hour behind: A still holds B's newer signed peer record.
        share(1, 0, env=AN_HOUR_AGO)
        # A restarts from its checkpoint, remembering B's highest seq as a replay floor,
        # while B runs on with its clock behind.
        b = spawn(1, 100_000, env=AN_HOUR_AGO)
        wait_rounds(metrics[1], len(read_metrics(metrics[1])) + 3, b, 300)
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        share(0, 1, wait_peers=1)
        assert b.poll() is None, logs[1].read_text()[-3000:]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
