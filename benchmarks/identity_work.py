"""What a swarm's proof of work on keys (`gossip.identity_work_bits`) costs: minting (a
joiner's first minutes, and a Sybil's price per key) against checking (what a node pays
per hello).

    .venv/bin/python benchmarks/identity_work.py [--keys 5] [--measure-up-to 20]

Prints one table: per difficulty, the expected hashes, the expected minting time at this
machine's measured rate (one core), the mean measured time over `--keys` fresh keys (for
difficulties up to `--measure-up-to`), what 8, 128 and 1,000 Sybil keys cost at that
difficulty, and the check's cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.identity_work import has_work, mint, mint_seconds

SWARM = "swarm-demo"


def hashes_per_s(seconds: float = 2.0) -> float:
    """Rate of `mint`'s own loop: a mint that cannot succeed (bits 32, stopped)."""
    done = [0]
    start = time.perf_counter()

    class Stop(Exception):
        pass

    def progress(hashes: int) -> None:
        done[0] = hashes
        if time.perf_counter() - start > seconds:
            raise Stop

    try:
        mint(SWARM, "rate-probe", 32, on_progress=progress)
    except Stop:
        pass
    return done[0] / (time.perf_counter() - start)


def human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=5)
    p.add_argument("--measure-up-to", type=int, default=20)
    args = p.parse_args()
    rate = hashes_per_s()
    start = time.perf_counter()
    checks = 20_000
    for i in range(checks):
        has_work(SWARM, "12D3KooWcheck", i, 20)
    check_us = (time.perf_counter() - start) / checks * 1e6
    print(f"one core: {rate:,.0f} hashes/s; a check costs {check_us:.1f} us\n")
    print("| bits | hashes (mean) | expected mint | measured mint (mean of keys) "
          "| 8 Sybil keys | 128 keys | 1,000 keys |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for bits in (16, 20, 24, 28, 32):
        expected = mint_seconds(bits, rate)
        measured = "-"
        if bits <= args.measure_up_to:
            times = []
            for _ in range(args.keys):
                key = "12D3KooW" + os.urandom(8).hex()
                t0 = time.perf_counter()
                mint(SWARM, key, bits)
                times.append(time.perf_counter() - t0)
            measured = f"{human(sum(times) / len(times))} ({args.keys} keys)"
        sybils = " | ".join(human(n * expected) for n in (8, 128, 1000))
        print(f"| {bits} | {2**bits:,} | {human(expected)} | {measured} | {sybils} |")


if __name__ == "__main__":
    main()
