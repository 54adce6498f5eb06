"""The process tests (real `swarm join` OS processes) run again and again on a busy machine.

Starts one CPU-bound busy loop per core (the "loaded machine" a volunteer's node shares
with other work), then runs the process tests `--runs` times in a row, stopping at the
first failure, and prints one row per run: seconds and pytest's summary. Exit status 0
only when every run passed.

    .venv/bin/python benchmarks/process_tests_under_load.py --runs 20
    .venv/bin/python benchmarks/process_tests_under_load.py --runs 3 --busy 0   # baseline
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROCESS_TESTS = [
    "tests/node/test_join_processes.py",
    "tests/node/test_late_join_processes.py",
    "tests/node/test_mqtt_outage_processes.py",
    "tests/cli/test_cli_processes.py",
]
BUSY_LOOP = "while True: pass"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy loops")
    parser.add_argument("tests", nargs="*", default=PROCESS_TESTS)
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    print(f"{args.busy} busy loops; {args.runs} runs of {' '.join(args.tests)}", flush=True)
    print("| run | seconds | result |\n|---:|---:|---|", flush=True)
    passed = 0
    try:
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            result = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"| {run} | {time.monotonic() - start:.0f} | {summary} |", flush=True)
            if result.returncode != 0:
                print(result.stdout[-6000:], result.stderr[-2000:], sep="\n", flush=True)
                break
            passed += 1
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(f"{passed} of {args.runs} runs passed in a row", flush=True)
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
