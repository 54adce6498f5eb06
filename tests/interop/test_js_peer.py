"""An independent peer: js-libp2p GossipSub with its own msgpack + Ed25519 wire code
(`tests/interop/js_peer`, written from `docs/wire.md`) against a real `swarm join`.

What it proves: a peer sharing no code with this repository (other libp2p, other msgpack
encoder, other Ed25519, its own peer id derivation and task generator) verifies every
envelope the node sends (hellos and rollout groups, zero refusals, the node's `digit`
prompts regenerated and its advisory rewards recomputed equal), and publishes hellos and
rollout groups the node verifies, re-scores and trains on. The negative control: one
envelope of the js peer with one bit of its signature flipped is refused by the node as
`bad_signature` and blamed on the js peer, so the checks can fail.

Skips, saying why, where Node.js >= 20 or npm is missing or `npm ci` fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from node.peer_table import read_peer_table
from swarm.identity import load_or_create_key_file
from tests.interop.js_peer_setup import JS_PEER_DIR, ensure_installed

REPO = Path(__file__).resolve().parents[2]
SWARM_ID = "swarm-demo"
"""The swarm id of `node.demo`'s configs."""
MIN_GROUPS_USED = 8
"""The node must train on at least this many of the js peer's groups."""
MIN_ROLLOUTS_VERIFIED = 5
"""The js peer must verify at least this many of the node's rollout envelopes."""
DEADLINE_S = 90.0
"""From the start of both processes until every condition above is met (~15 s idle)."""
ATTACK_REASONS = ("bad_payload", "malformed", "prompt_mismatch", "forged_rewards",
                  "sender_mismatch", "wrong_topic", "unknown_task", "bad_sender")  # fmt: skip


@pytest.fixture(scope="module")
def js_peer_ready() -> Path:
    problem = ensure_installed()
    if problem is not None:
        pytest.skip(f"js peer unavailable: {problem}")
    return JS_PEER_DIR


def test_js_wire_code_matches_the_vectors(js_peer_ready: Path) -> None:
    """The js wire code reproduces docs/wire.md's vectors byte for byte (peer id, signing
    input, signature, sealed envelope) and refuses corrupted ones."""
    done = subprocess.run(
        ["node", "vectors.mjs", str(REPO / "docs" / "wire.md")],
        cwd=js_peer_ready,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and len(report["results"]) == 5, report


class _Lines:
    """JSON lines of a process's stdout, read by a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.records: list[dict[str, Any]] = []
        self.other: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                try:
                    self.records.append(json.loads(line))
                except json.JSONDecodeError:
                    self.other.append(line)

    def last(self, event: str) -> dict[str, Any] | None:
        with self._lock:
            found = [r for r in self.records if r.get("event") == event]
        return found[-1] if found else None

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _stop(proc: subprocess.Popen, sig: int, timeout: float) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _used_from(records: list[dict[str, Any]], peer: str) -> int:
    return sum(r["external_by_sender"].get(peer, 0) for r in records)


@pytest.mark.slow
def test_js_peer_and_node_verify_and_use_each_other(js_peer_ready: Path, tmp_path: Path) -> None:
    config = write_configs(1, 1000, tmp_path)[0]
    data = tmp_path / "node-0"
    node_id = load_or_create_key_file(data / "node.key").peer_id
    listen = tomllib.loads(config.read_text())["transport"]["listen"]  # /ip4/<ip>/tcp/<port>
    log = tmp_path / "node-0.log"
    node_err = log.open("w")
    started = time.monotonic()
    node = spawn_join(config, 1000, stdout=subprocess.DEVNULL, stderr=node_err, wait_peers=1)
    js_err = (tmp_path / "js-peer.err").open("w")
    js = subprocess.Popen(
        ["node", "peer.mjs", "--connect", f"{listen}/p2p/{node_id}",
         "--swarm-id", SWARM_ID, "--interval-ms", "500", "--corrupt-after", "2"],
        cwd=js_peer_ready, stdout=subprocess.PIPE, stderr=js_err, text=True,
    )  # fmt: skip
    lines = _Lines(js)
    try:
        js_id = None
        while time.monotonic() - started < DEADLINE_S:
            assert node.poll() is None, log.read_text()[-3000:]
            assert js.poll() is None, (tmp_path / "js-peer.err").read_text()[-3000:]
            begun = lines.last("started")
            js_id = begun["peer_id"] if begun else None
            stats = lines.last("stats") or {}
            records = read_metrics(data / "metrics.jsonl")
            drops = records[-1]["drops"] if records else {}
            if (
                js_id is not None
                and _used_from(records, js_id) >= MIN_GROUPS_USED
                and drops.get("bad_signature", 0) >= 1
                and stats.get("verified", {}).get("rollouts", 0) >= MIN_ROLLOUTS_VERIFIED
                and stats.get("verified", {}).get("hello", 0) >= 1
            ):
                break
            time.sleep(0.25)
    finally:
        node_code = _stop(node, signal.SIGINT, 60)
        js_code = _stop(js, signal.SIGTERM, 15)
        lines.join(5)
        js_err.close()
        node_err.close()
    elapsed = time.monotonic() - started
    tail = log.read_text()[-3000:]
    assert node_code == 0, tail
    assert js_code == 0, (tmp_path / "js-peer.err").read_text()[-3000:]

    # (a) The js peer verified the node's envelopes with its own code, refusing none.
    begun, final = lines.last("started"), lines.last("final")
    assert begun is not None and final is not None, lines.other[-20:]
    assert begun["peer_id"] == begun["libp2p_peer_id"]  # our derivation = js-libp2p's
    js_id = begun["peer_id"]
    verified, checks = final["verified"], final["checks"]
    assert final["refused"] == {}, final
    assert verified.get("hello", 0) >= 1 and verified.get("rollouts", 0) >= MIN_ROLLOUTS_VERIFIED
    assert set(final["senders"]) == {node_id}, final
    assert checks.get("digit_prompt_ok", 0) == verified["groups"] > 0, final  # regenerated
    assert checks.get("rewards_agree", 0) == verified["groups"], final  # re-scored equal
    assert checks.get("logprobs_carried", 0) == verified["groups"], final  # protocol 4
    assert checks.get("token_ids_carried", 0) == verified["groups"], final  # protocol 5
    assert checks.get("hello_policy_version_matches_envelope") == verified["hello"], final

    # (b) The node trained on the js peer's groups, and its peer table shows the js peer.
    records = read_metrics(data / "metrics.jsonl")
    used = _used_from(records, js_id)
    assert used >= MIN_GROUPS_USED, (used, tail)
    assert all(set(r["external_by_sender"]) <= {js_id} for r in records)
    table = read_peer_table(data / "peers.json")
    assert table is not None, tail
    row = next(p for p in table["peers"] if p["peer"] == js_id)
    assert row["model_id"] == "js-peer" and row["verified_groups"] >= used, row

    # The negative control: exactly the one corrupted envelope refused, blamed on the js
    # peer; nothing else the js peer sent was refused.
    drops = records[-1]["drops"]
    assert final["published"].get("rollouts_bad_signature") == 1, final
    assert drops.get("bad_signature") == 1, drops
    assert not {r: drops[r] for r in ATTACK_REASONS if r in drops}, drops
    # A penalty decays: on a loaded machine the last rounds may come after the js peer's
    # score recovered to 0, when it is no longer listed. The newest record listing it.
    scored = [r["peer_scores"]["peers"] for r in records]
    listed = [peers[js_id] for peers in scored if js_id in peers]
    assert listed, [r["peer_scores"] for r in records[-3:]]
    score = listed[-1]
    assert score["reasons"] == {"bad_signature": 1} and not score["ignored_for_s"], score
    print(
        json.dumps(
            {
                "js_verified": verified,
                "js_checks": checks,
                "js_published": final["published"],
                "node_rounds": len(records),
                "node_used_js_groups": used,
                "node_drops": drops,
                "wall_s": round(elapsed, 1),
            }
        )
    )
