"""Discovery beyond a bootstrap list, as real `swarm join` processes on 127.0.0.1.

N nodes (tiny model, J = 0 so no re-scoring workers) each know ONE bootstrap peer:
node 0 (`--topology star`) or the previous node (`--topology chain`). Measured from
each node's `peers.json` (peers it heard a hello from, with last-seen times) and the
last line of its `metrics.jsonl` (transport counters: connections by how each peer was
learned, GossipSub mesh sizes):

1. start: connections and mesh degree each node reaches, and the time until every node
   has heard from every other;
2. node 0 (everyone's bootstrap in a star) is killed (SIGKILL): do the rest stay
   connected, and how long until every survivor has heard every other survivor again;
3. rejoin: node N-1 stops and restarts with only the dead node 0 as bootstrap but its
   peer book; a fresh node with the same config and no book is the control.

    .venv/bin/python benchmarks/discovery.py                      # 20 nodes, star
    .venv/bin/python benchmarks/discovery.py --nodes 8 --no-exchange   # bootstrap only

Nodes share the machine: 20 processes on 2 cores take ~1-2 min to start.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.demo import demo_config, spawn_join
from node.ports import free_port
from node.starter import merge
from swarm.identity import write_key_file

ROUNDS = 1_000_000
"""Nodes run until stopped."""
POLL_S = 1.0


def write_config(out: Path, name: str, index: int, port: int, boot: list[str], px: bool) -> Path:
    config = merge(
        demo_config(index, out, port, boot, ROUNDS),
        {
            "node": {"name": name, "data_dir": str(out / name), "checkpoint_every": ROUNDS},
            "sapo": {"external_groups": 0},
            "transport": {"peer_exchange": px, "peer_book": True},
        },
    )
    path = out / f"{name}.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def last_record(path: Path) -> dict[str, Any] | None:
    """The last complete JSON line of `path` (reads only its tail)."""
    try:
        with path.open("rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 256 * 1024, 0))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def heard(data_dir: Path) -> dict[str, float]:
    """Peer id -> monotonic time it was last heard from, per `peers.json`."""
    try:
        table = json.loads((data_dir / "peers.json").read_text())
    except (OSError, ValueError):
        return {}
    return {row["peer"]: table["time"] - row["last_seen_s"] for row in table["peers"]}


def transport(data_dir: Path) -> dict[str, Any]:
    record = last_record(data_dir / "metrics.jsonl") or {}
    return record.get("transport") or {}


def wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("node exited during start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port}")


def table_time(data_dir: Path) -> float:
    try:
        return float(json.loads((data_dir / "peers.json").read_text())["time"])
    except (OSError, ValueError, KeyError):
        return -1.0


def wait_all_heard(
    dirs: dict[str, Path], ids: dict[str, str], since: float, timeout_s: float
) -> tuple[float | None, float | None]:
    """Seconds from `since` until every node in `dirs` heard every other after `since`,
    and the same counted from when the last of them wrote its first round's table."""
    deadline = since + timeout_s
    up: float | None = None
    while time.monotonic() < deadline:
        if up is None and all(table_time(d) >= since for d in dirs.values()):
            up = time.monotonic()
        done = True
        for name, d in dirs.items():
            seen = heard(d)
            others = [ids[o] for o in dirs if o != name]
            if not all(seen.get(pid, -1.0) >= since for pid in others):
                done = False
                break
        if done:
            now = time.monotonic()
            return round(now - since, 1), round(now - (up or now), 1)
        time.sleep(POLL_S)
    return None, None


def snapshot(
    dirs: dict[str, Path], phase: str, seconds: tuple[float | None, float | None]
) -> dict[str, Any]:
    conn, mesh, sources, dials, failed = [], [], {}, 0, 0
    for d in dirs.values():
        t = transport(d)
        disc = t.get("discovery", {})
        by_source = disc.get("connected_by_source", {})
        conn.append(sum(by_source.values()))
        degrees = disc.get("mesh_degree", {})
        mesh.append(max((v for k, v in degrees.items() if k.endswith("/peers")), default=0))
        for k, v in by_source.items():
            sources[k] = sources.get(k, 0) + v
        dials += t.get("dials_attempted", 0)
        failed += t.get("dials_failed", 0)
    return {
        "phase": phase,
        "nodes": len(dirs),
        "connected": (min(conn), statistics.median(conn), max(conn)),
        "mesh": (min(mesh), statistics.median(mesh), max(mesh)),
        "sources": sources,
        "dials": (dials, failed),
        "all_heard_s": seconds,
    }


def run(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    n = args.nodes
    names = [f"node-{i}" for i in range(n)]
    ports = [free_port() for _ in range(n)]
    ids = {name: write_key_file(out / name / "node.key").peer_id for name in names}
    addr = {name: f"/ip4/127.0.0.1/tcp/{ports[i]}/p2p/{ids[name]}" for i, name in enumerate(names)}
    configs = {}
    for i, name in enumerate(names):
        boot = [] if i == 0 else [addr[names[0] if args.topology == "star" else names[i - 1]]]
        configs[name] = write_config(out, name, i, ports[i], boot, not args.no_exchange)
    procs: dict[str, subprocess.Popen] = {}
    logs = []

    def start(name: str) -> None:
        log = (out / f"{name}.log").open("a")
        logs.append(log)
        procs[name] = spawn_join(configs[name], ROUNDS, stdout=subprocess.DEVNULL, stderr=log)

    rows = []
    try:
        start(names[0])
        wait_listening(ports[0], procs[names[0]])
        t0 = time.monotonic()
        for name in names[1:]:
            start(name)
        dirs = {name: out / name for name in names}
        secs = wait_all_heard(dirs, ids, t0, args.timeout)
        time.sleep(args.settle)
        rows.append(snapshot(dirs, f"start ({args.topology})", secs))

        procs[names[0]].send_signal(signal.SIGKILL)
        procs[names[0]].wait()
        t_kill = time.monotonic()
        survivors = {name: out / name for name in names[1:]}
        secs = wait_all_heard(survivors, ids, t_kill, args.timeout)
        time.sleep(args.settle)
        rows.append(snapshot(survivors, "node 0 killed", secs))

        # Rejoin: the last node restarts knowing only dead node 0, with its peer book;
        # a fresh node (new key, no book, same bootstrap) is the control.
        last = names[-1]
        procs[last].send_signal(signal.SIGINT)
        procs[last].wait(timeout=120)
        boot_dead = [addr[names[0]]]
        configs[last] = write_config(out, last, n - 1, ports[-1], boot_dead, not args.no_exchange)
        fresh = "fresh"
        ids[fresh] = write_key_file(out / fresh / "node.key").peer_id
        configs[fresh] = write_config(out, fresh, n, free_port(), boot_dead, not args.no_exchange)
        t_restart = time.monotonic()
        start(last)
        start(fresh)
        others = {name: out / name for name in names[1:-1]}
        secs = wait_all_heard({last: out / last, **others}, ids, t_restart, args.timeout)
        time.sleep(args.settle)
        rows.append(snapshot({last: out / last}, "restarted with book", secs))
        rows.append(snapshot({fresh: out / fresh}, "fresh, no book (control)", (None, None)))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--topology", choices=("star", "chain"), default="star")
    parser.add_argument("--no-exchange", action="store_true", help="bootstrap (and book) only")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--settle", type=float, default=10.0, help="s before a snapshot")
    parser.add_argument("--keep", default="", help="keep the run in this directory")
    args = parser.parse_args()
    if args.keep:
        out = Path(args.keep)
        out.mkdir(parents=True, exist_ok=True)
        rows = run(args, out)
    else:
        with tempfile.TemporaryDirectory(prefix="discovery-") as tmp:
            rows = run(args, Path(tmp))
    mode = "bootstrap only" if args.no_exchange else "peer exchange"
    print(f"{args.nodes} nodes, {mode}; min / median / max over the nodes of each row")
    print(
        "| phase | nodes | connected peers | mesh degree (peers topic) "
        "| connections by source | dials (failed) "
        "| every node heard every other: s from start (s from all running) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        c, m = r["connected"], r["mesh"]
        src = ", ".join(f"{k} {v}" for k, v in r["sources"].items() if v) or "-"
        total, running = r["all_heard_s"]
        heard_s = "n/a" if total is None else f"{total} ({running})"
        print(
            f"| {r['phase']} | {r['nodes']} | {c[0]} / {c[1]} / {c[2]} | {m[0]} / {m[1]} / {m[2]} "
            f"| {src} | {r['dials'][0]} ({r['dials'][1]}) | {heard_s} |"
        )


if __name__ == "__main__":
    main()
