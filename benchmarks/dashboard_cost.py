"""What serving the dashboard costs a node: round time with and without `--dashboard`.

Runs `swarm train` (the built-in tiny model, `swarm init`'s settings) as its own process,
alternately without and with `--dashboard`; with it, a client polls the page's JSON every
second and Prometheus `/metrics` every 5 s (a browser tab left open plus a scraper,
both more eager than usual). Prints the mean round time (metrics.jsonl `seconds.total`,
rounds after the first 10) per run and the ratio of the two means.

    .venv/bin/python benchmarks/dashboard_cost.py --rounds 200 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.metrics import read_metrics
from node.ports import free_port

WARMUP_ROUNDS = 10


def _poll(url: str, stop: threading.Event, counts: dict[str, int]) -> None:
    tick = 0
    while not stop.wait(1.0):
        paths = ["api/node/0"] + (["metrics"] if tick % 5 == 0 else [])
        tick += 1
        for path in paths:
            try:
                with urllib.request.urlopen(url + path, timeout=5) as response:
                    response.read()
                counts[path] = counts.get(path, 0) + 1
            except OSError:
                counts["failed"] = counts.get("failed", 0) + 1  # not up yet, or gone


def run_once(work: Path, rounds: int, dashboard: bool) -> tuple[float, dict[str, int]]:
    data_dir = work / ("with" if dashboard else "without") / str(time.monotonic_ns())
    command = [sys.executable, "-m", "cli.main", "train", "-c", str(work / "node.toml"),
               "--rounds", str(rounds), "--data-dir", str(data_dir)]  # fmt: skip
    stop, counts = threading.Event(), {}
    poller = None
    if dashboard:
        port = free_port()
        command += ["--dashboard", f"127.0.0.1:{port}"]
        poller = threading.Thread(target=_poll, args=(f"http://127.0.0.1:{port}/", stop, counts))
        poller.start()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    finally:
        stop.set()
        if poller is not None:
            poller.join()
    records = read_metrics(data_dir / "metrics.jsonl")[WARMUP_ROUNDS:]
    return statistics.fmean(r["seconds"]["total"] for r in records), counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "cli.main", "init", str(work / "node.toml")],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        means: dict[bool, list[float]] = {False: [], True: []}
        print("| run | dashboard | mean round s | requests served |\n|---:|---|---:|---|")
        for repeat in range(args.repeats):
            # ABBA order: drift in the machine's load hits both variants alike.
            for dashboard in (False, True) if repeat % 2 == 0 else (True, False):
                mean, counts = run_once(work, args.rounds, dashboard)
                means[dashboard].append(mean)
                served = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"
                print(f"| {repeat + 1} | {'on' if dashboard else 'off'} | {mean:.4f} | {served} |",
                      flush=True)  # fmt: skip
        off, on = statistics.fmean(means[False]), statistics.fmean(means[True])
        print(f"\nmean round time: off {off:.4f} s, on {on:.4f} s, ratio on/off {on / off:.3f}")


if __name__ == "__main__":
    main()
