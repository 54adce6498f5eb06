"""How fast a node takes in a one-key flood, and whether every message is accounted for.

    .venv/bin/python benchmarks/flood_intake.py [--count 20000] [--size 200]

Two OS processes on 127.0.0.1: a receiver A and a flooder X that publishes `--count`
messages of `--size` bytes from one key as fast as its transport takes them. Rows:
- `valid, bare`: A without the gossip layer (libp2p transport only), the baseline;
- `valid, gossip`: A with the gossip layer (checks, signatures, rate limits lifted);
- `forged, gossip`: X signs each envelope with random bytes; A's forward gate refuses
  them (and soon ignores X's connection, refusing the rest unread).
For each: how long X took to publish, A's intake rate while X published, how long A
took to work through the backlog after X stopped, and the account: what A received or
refused plus what X's own queue refused (`skipped_slow_peer`) must equal what X sent.

What issue 31 called "~90% lost below the pipeline" in such a flood was this backlog: A
read a flooding connection at ~140 messages a second, so most of the flood still sat in
the connection's buffers when the flooder hung up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.gossip.conftest import PEER_SCRIPT, PeerProcess  # noqa: E402

LOCAL = "/ip4/127.0.0.1/tcp/0"
DRAIN_TIMEOUT_S = 300.0


def peer(name: str, log_dir: Path, *extra: str) -> PeerProcess:
    args = ["--transport", "libp2p", "--heartbeat", "0.5", "--light", "--listen", LOCAL]
    return PeerProcess(name, [*args, "--no-peer-exchange", *extra], log_dir, PEER_SCRIPT)


def taken_in(stats: dict) -> int:
    """Messages A received or refused (before forwarding, or unread from an ignored peer)."""
    refused = stats["transport"]["refused_incoming_by_reason"]
    return stats["transport"]["received"] + refused["not_forwarded"] + refused["ignored_forwarder"]


def run(kind: str, layer: str, count: int, size: int) -> dict[str, float | int | str]:
    log_dir = Path(tempfile.mkdtemp(prefix="flood-intake-"))
    a = peer("A", log_dir, *(["--raw"] if layer == "bare" else [])).ready()
    x_args = ["--raw"] if kind == "forged" else []
    x = peer("X", log_dir, *x_args, "--bootstrap", a.addrs[0]).ready()
    try:
        x.wait_until(lambda _: a.peer_id in x.mesh(), 60.0, "X's mesh to include A")
        start = time.monotonic()
        x.command(f"{'forge' if kind == 'forged' else 'send'} {count} {size}")
        done = "forged" if kind == "forged" else "burst"
        x.wait_for(lambda e: e["event"] == done, DRAIN_TIMEOUT_S, "the flood")
        sent_s = time.monotonic() - start
        during = taken_in(a.request("stats", "stats"))
        skipped = x.request("stats", "stats")["transport"]["skipped_slow_peer"]
        while True:
            taken = taken_in(a.request("stats", "stats"))
            if taken + skipped >= count or time.monotonic() - start > DRAIN_TIMEOUT_S:
                break
            time.sleep(0.25)
        total_s = time.monotonic() - start
    finally:
        a.stop()
        x.stop()
    return {
        "flood": f"{kind}, {layer}",
        "sent_s": round(sent_s, 1),
        "intake_per_s": round(during / sent_s),
        "drain_after_s": round(total_s - sent_s, 1),
        "received_or_refused": taken,
        "refused_at_x": skipped,
        "unaccounted": count - taken - skipped,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--size", type=int, default=200)
    args = p.parse_args()
    rows = [
        run(kind, layer, args.count, args.size)
        for kind, layer in (("valid", "bare"), ("valid", "gossip"), ("forged", "gossip"))
    ]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
