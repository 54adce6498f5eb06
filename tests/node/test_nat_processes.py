"""Two NATed `swarm join` processes find each other through a public relay node.

Real sockets through real NAT (see `tests.node.netns`): node A in LAN 1 and node B in
LAN 2, each behind its own masquerading router, and a public node P (`relay = true`) in
the wan. A and B know only P. The test passes when each of A and B trained on a rollout
group of the other; it also checks what the NAT traversal did (AutoNAT verdicts, relay
reservations, a circuit between A and B) and reports whether their link ended relayed
or hole-punched (DCUtR) and the time from start to the first external group each used.

Skips (with the reason) where namespaces cannot be made: not root, no CAP_NET_ADMIN, no
`nft`. Namespaces carry a per-run prefix and are deleted by the fixture even on failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from node.demo import JOIN_ENV, demo_config
from node.metrics import read_metrics
from node.peer_table import read_peer_table
from swarm.identity import write_key_file
from tests.node.netns import NatNet, unavailable_reason

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PORT = 4001
# Far more than fit in the deadline: the test stops the nodes itself. (It was 200: a
# stub round takes ~0.3 s, so a node could finish all of them and exit before a relayed
# A-B link counted as settled, and the test read that as "a node exited early".)
ROUNDS = 100_000
DEADLINE_S = 75.0


@pytest.fixture
def nat_net() -> Iterator[NatNet]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    net = NatNet.create(f"sw{uuid.uuid4().hex[:5]}")
    try:
        yield net
    finally:
        net.delete()


def _config(index: int, out: Path, bootstrap: list[str], *, relay: bool) -> Path:
    config = demo_config(index, out, PORT, bootstrap, ROUNDS)
    config["transport"]["listen"] = f"/ip4/0.0.0.0/tcp/{PORT}"
    config["transport"]["relay"] = relay
    path = out / f"node-{index}.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def _spawn(namespace: str, config: Path, log: Path) -> subprocess.Popen[str]:
    command = ["ip", "netns", "exec", namespace, sys.executable, "-m", "cli.main", "join"]
    command += ["--config", str(config), "--rounds", str(ROUNDS), "--json"]
    command += ["--wait-peers", "1", "--wait-timeout", "60"]  # the public node is enough
    return subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
        env={**os.environ, **JOIN_ENV},
    )


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _transport(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The newest transport counters (cumulative) of a node's metrics."""
    return (records[-1].get("transport") or {}) if records else {}


def _circuits(transport: dict[str, Any]) -> int:
    """Circuits (connections through the relay) a node opened."""
    return int(transport.get("circuit_dials", 0) - transport.get("circuit_dials_failed", 0))


def _logs(out: Path) -> dict[int, str]:
    """The tail of each node's stderr log, for a failure's message."""
    return {i: (out / f"node-{i}.log").read_text()[-3000:] for i in range(3)}


def test_nated_nodes_train_on_each_others_groups(nat_net: NatNet, tmp_path: Path) -> None:
    ids = [write_key_file(tmp_path / f"node-{i}" / "node.key", overwrite=True).peer_id
           for i in range(3)]  # fmt: skip
    public = [f"/ip4/{NatNet.wan_addr(i)}/tcp/{PORT}/p2p/{ids[0]}" for i in (1, 2)]
    configs = [
        _config(0, tmp_path, [], relay=True),
        _config(1, tmp_path, [public[0]], relay=False),
        _config(2, tmp_path, [public[1]], relay=False),
    ]
    namespaces = [nat_net.wan, nat_net.lan(1), nat_net.lan(2)]
    start = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    first_external: dict[int, float] = {}
    try:
        for index in range(3):
            procs.append(_spawn(namespaces[index], configs[index], tmp_path / f"node-{index}.log"))
        circuit_at: float | None = None
        while time.monotonic() - start < DEADLINE_S:
            now = time.monotonic() - start
            latest = []
            for index, other in ((1, 2), (2, 1)):
                records = read_metrics(tmp_path / f"node-{index}" / "metrics.jsonl")
                latest.append(_transport(records))
                used = any(ids[other] in r.get("external_by_sender", {}) for r in records)
                if used and index not in first_external:
                    first_external[index] = now
            if circuit_at is None and any(_circuits(s) for s in latest):
                circuit_at = now
            upgraded = any(s.get("direct_upgrades", 0) for s in latest)
            # Done once both used the other's groups and the A-B link settled: hole
            # punched, or still relayed 12 s after the circuit opened (DCUtR takes ~3 s).
            settled = upgraded or (circuit_at is not None and now - circuit_at > 12.0)
            if len(first_external) == 2 and settled:
                break
            exited = {i: p.returncode for i, p in enumerate(procs) if p.poll() is not None}
            assert not exited, (f"exited early (node: exit code) {exited}", _logs(tmp_path))
            time.sleep(0.5)
    finally:
        _stop(procs)
    logs = _logs(tmp_path)
    records = [read_metrics(tmp_path / f"node-{i}" / "metrics.jsonl") for i in range(3)]
    stats = [_transport(r) for r in records]
    tables = [read_peer_table(tmp_path / f"node-{i}" / "peers.json") for i in range(3)]
    links = {
        i: {row.get("peer"): row.get("link") for row in (tables[i] or {}).get("peers", [])}
        for i in (1, 2)
    }
    upgrades = stats[1].get("direct_upgrades", 0) + stats[2].get("direct_upgrades", 0)
    if upgrades:
        path = "direct (hole-punched)"
    elif _circuits(stats[1]) + _circuits(stats[2]):
        path = "relayed (/p2p-circuit)"
    else:
        path = "none (the circuit dial failed; groups came through the relay's GossipSub)"
    print(
        f"\nNAT test: A used B's groups after {first_external.get(1, float('nan')):.1f} s, "
        f"B used A's after {first_external.get(2, float('nan')):.1f} s; A-B link: {path}; "
        f"peer table A->B {links[1].get(ids[2])}, B->A {links[2].get(ids[1])}; "
        f"reachability P/A/B: {[s.get('nat_reachability') for s in stats]}; "
        f"transport counters A {stats[1]}, B {stats[2]}"
    )
    assert set(first_external) == {1, 2}, (first_external, logs)
    assert [s.get("nat_reachability") for s in stats] == ["public", "private", "private"], logs
    assert stats[1].get("relay_reservations", 0) >= 1, logs[1]
    assert stats[2].get("relay_reservations", 0) >= 1, logs[2]
    # One of the two NATed nodes dials the other through the relay. The dial itself
    # failed in 1 of 5 runs here (the groups then still flow through the relay node's
    # GossipSub forwarding, asserted above): the path taken is printed, not asserted.
    dialed = stats[1].get("circuit_dials", 0) + stats[2].get("circuit_dials", 0)
    assert dialed >= 1, (stats, logs)
    # Each sees the other in its peer table: `relayed` or `direct` while connected,
    # `indirect` otherwise, and never a connection where no circuit was ever made.
    assert links[1].get(ids[2]) in {"relayed", "direct", "indirect"}, (links, logs[1])
    assert links[2].get(ids[1]) in {"relayed", "direct", "indirect"}, (links, logs[2])
    if path.startswith("none"):
        assert links[1].get(ids[2]) == links[2].get(ids[1]) == "indirect", links
