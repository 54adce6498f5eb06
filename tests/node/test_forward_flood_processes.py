"""A flood of envelopes that fail a node's checks never reaches its neighbours, and the
neighbours keep learning from it (issue 31, item 2), as real `swarm join` processes.

Line topology X -> A -> B, peer exchange off (so X never meets B). A and B are real nodes
(tiny model, libp2p); X is a raw libp2p peer that publishes envelopes with random
signatures on the swarm's rollouts topic at 1,000 a second. Before validation ran inside
GossipSub, A forwarded every one of them to B (450 of 450 in the issue) and B's backlog
of junk kept it from A's groups for over 40 s. Now A refuses them before forwarding and
ignores X's connection; B must see none of them and train on A's groups all along.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from node.demo import write_configs
from node.metrics import read_metrics
from swarm.config import load_config
from swarm.identity import load_or_create_key_file
from tests.gossip.conftest import PEER_SCRIPT, PeerProcess
from tests.node.process_helpers import set_config, start_join, wait_used

pytestmark = pytest.mark.slow(seconds=60)

FORGED, PER_S = 12_000, 1000
"""12 s of forged envelopes at 1,000 a second (the issue's rate)."""
LONGEST_GAP_S = 5.0
"""The longest B may go without training on a group of A's during the flood. A node's
round here takes 0.1-1 s and A publishes every round; under the flood both share two
cores with X."""


def test_a_flood_of_invalid_envelopes_neither_reaches_b_nor_keeps_it_from_a(
    tmp_path: Path,
) -> None:
    config_a, config_b = write_configs(2, 100_000, tmp_path)
    for config in (config_a, config_b):
        # Slow learners (groups keep reward variance); bootstrap only, so B never meets X.
        set_config(config, train={"learning_rate": 1e-6}, transport={"peer_exchange": False})
    a_address = tomllib.loads(config_b.read_text())["transport"]["bootstrap"][0]
    swarm_id = load_config(config_a).node.swarm_id
    id_a = load_or_create_key_file(tmp_path / "node-0" / "node.key").peer_id
    metrics_a = tmp_path / "node-0" / "metrics.jsonl"
    metrics_b = tmp_path / "node-1" / "metrics.jsonl"
    logs = (tmp_path / "node-0.log", tmp_path / "node-1.log")
    procs = [
        start_join(config, 100_000, stdout=subprocess.DEVNULL, stderr=log.open("w"))
        for config, log in zip((config_a, config_b), logs, strict=True)
    ]
    x: PeerProcess | None = None
    try:
        wait_used(metrics_b, id_a, 0, procs[1], 120)
        x = PeerProcess(
            "X",
            ["--transport", "libp2p", "--raw", "--no-peer-exchange", "--heartbeat", "0.5",
             "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", a_address,
             "--swarm-id", swarm_id, "--topic", "rollouts"],
            tmp_path,
            PEER_SCRIPT,
        ).ready()  # fmt: skip
        x.wait_until(lambda _: id_a in x.mesh(), 60.0, "X grafted into A's rollouts mesh")
        flood_start = len(read_metrics(metrics_b))
        x.command(f"forge {FORGED} 200 {PER_S}")
        x.wait_for(lambda e: e["event"] == "forged", 120.0, "the forged flood")
        flood = read_metrics(metrics_b)[flood_start:]
        assert all(proc.poll() is None for proc in procs)

        # B trained on A's groups all through the flood.
        used_at = [r["time"] for r in flood if id_a in r["external_by_sender"]]
        assert used_at, f"B used none of A's groups in {len(flood)} rounds of the flood"
        edges = [flood[0]["time"], *used_at, flood[-1]["time"]]
        longest = max(b - a for a, b in itertools.pairwise(edges))
        assert longest < LONGEST_GAP_S, (longest, len(used_at), len(flood))

        # None of X's envelopes reached B: nothing refused there, X unknown to it.
        last_b = read_metrics(metrics_b)[-1]
        refused_b = last_b["transport"]["refused_incoming_by_reason"]
        assert sum(refused_b.values()) == 0, refused_b
        assert "bad_signature" not in last_b["drops"], last_b["drops"]
        assert x.peer_id not in last_b["peer_scores"].get("peers", {}), last_b["peer_scores"]

        # A refused every one before forwarding (X's own queue refused those it could not
        # send, and counts them): nothing is lost uncounted. A reads a flooding
        # connection's backlog at its own pace after the flood.
        skipped_at_x = x.request("stats", "stats")["transport"]["skipped_slow_peer"]
        deadline = time.monotonic() + 90.0
        while True:
            last_a = read_metrics(metrics_a)[-1]
            refused_a = last_a["transport"]["refused_incoming_by_reason"]
            counted = refused_a["not_forwarded"] + refused_a["ignored_forwarder"] + skipped_at_x
            if counted >= FORGED:
                break
            assert time.monotonic() < deadline, (
                f"{FORGED - counted} of {FORGED} not counted: A {refused_a}, "
                f"X skipped {skipped_at_x}"
            )
            time.sleep(1.0)
        assert counted == FORGED, (refused_a, skipped_at_x)
        assert refused_a["not_forwarded"] >= 1, refused_a
    finally:
        if x is not None:
            x.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            proc.wait(timeout=60)
    print(
        f"B: {len(flood)} rounds during the flood, {len(used_at)} with A's groups, "
        f"longest gap {longest:.2f} s; A refused {refused_a}, X skipped {skipped_at_x}"
    )
