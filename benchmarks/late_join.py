"""How soon a late joiner shares, as real `swarm join` processes over libp2p on 127.0.0.1.

For each head start H (rounds node A runs alone before node B starts with A as its
bootstrap peer), B runs `--rounds 400` (~12 s) and the table shows, measured from the two nodes'
metrics.jsonl: B's first round that trained on A's groups, A's first round (counted from
B's start) that trained on B's groups, the seconds from B's start to each, and the share
of B's rounds with external groups. The baseline row is H = 0 (started together).

    .venv/bin/python benchmarks/late_join.py                 # H = 0, 60, 600
    .venv/bin/python benchmarks/late_join.py --head-starts 0 60

Protocol 1 (a global round clock) refused everything here once H exceeded ~4 rounds.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from swarm.identity import load_or_create_key_file

B_ROUNDS = 400
"""About 12 s of tiny-model rounds (~30 ms each on this machine)."""


def _wait_rounds(metrics: Path, rounds: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(read_metrics(metrics)) < rounds:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"node A stopped or stalled before round {rounds}")
        time.sleep(0.2)


def _first(records: list[dict[str, Any]], sender: str) -> dict[str, Any] | None:
    return next((r for r in records if sender in r["external_by_sender"]), None)


def measure(head_start: int, out: Path) -> dict[str, Any]:
    config_a, config_b = write_configs(2, 100_000, out)
    id_a = load_or_create_key_file(out / "node-0" / "node.key").peer_id
    id_b = load_or_create_key_file(out / "node-1" / "node.key").peer_id
    metrics_a, metrics_b = out / "node-0" / "metrics.jsonl", out / "node-1" / "metrics.jsonl"
    with (out / "a.log").open("w") as log_a, (out / "b.log").open("w") as log_b:
        a = spawn_join(config_a, 100_000, stdout=subprocess.DEVNULL, stderr=log_a)
        try:
            if head_start:
                _wait_rounds(metrics_a, head_start, a, 3600)
            a_before = len(read_metrics(metrics_a))
            b_start = time.monotonic()  # the nodes' metrics use the same clock
            b = spawn_join(config_b, B_ROUNDS, stdout=subprocess.DEVNULL, stderr=log_b)
            if b.wait(timeout=1800) != 0:
                raise RuntimeError(f"node B failed: see {out / 'b.log'}")
        finally:
            a.send_signal(signal.SIGINT)
            a.wait(timeout=120)
    records_b = read_metrics(metrics_b)
    records_a = read_metrics(metrics_a)[a_before:]
    b_used = _first(records_b, id_a)
    a_used = _first(records_a, id_b)
    b_steady = records_b[b_used["round"] - 1 :] if b_used else []
    return {
        "head_start": head_start,
        "a_round_at_b_start": a_before,
        "b_first_round_using_a": b_used["round"] if b_used else None,
        "b_seconds": round(b_used["time"] - b_start, 1) if b_used else None,
        "a_first_round_using_b": a_used["round"] - a_before if a_used else None,
        "a_seconds": round(a_used["time"] - b_start, 1) if a_used else None,
        "b_first_round_s": round(records_b[0]["time"] - b_start, 1),
        "b_share_after_first": round(
            sum(r["external_groups"] > 0 for r in b_steady) / max(len(b_steady), 1), 3
        ),
        "b_rounds_with_external": sum(r["external_groups"] > 0 for r in records_b),
        "b_rounds": len(records_b),
        "stale": sum(
            r["drops"].get("stale", 0) + r["drops"].get("stale_version", 0)
            for r in records_a + records_b
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-starts", type=int, nargs="+", default=[0, 60, 600])
    args = parser.parse_args()
    rows = []
    for head_start in args.head_starts:
        with tempfile.TemporaryDirectory(prefix="late-join-") as tmp:
            rows.append(measure(head_start, Path(tmp)))
        print(f"head start {head_start}: done", file=sys.stderr, flush=True)
    print(
        "| A's rounds before B | B's first round (s after B's start) "
        "| B's first round using A (s) | A's first round using B, counted from B's start (s) "
        "| B's rounds with external: all / from its first one | evicted stale, both nodes |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        label = f"{r['head_start']}" + (" (baseline)" if r["head_start"] == 0 else "")
        print(
            f"| {label} | {r['b_first_round_s']} "
            f"| {r['b_first_round_using_a']} ({r['b_seconds']}) "
            f"| {r['a_first_round_using_b']} ({r['a_seconds']}) "
            f"| {r['b_rounds_with_external']} / {r['b_rounds']}; {r['b_share_after_first']:.1%} "
            f"| {r['stale']} |"
        )


if __name__ == "__main__":
    main()
