"""Peak RSS of a slow receiver under a flood of 4 MB messages, bounded and unbounded.

    .venv/bin/python benchmarks/flood_rss.py [--transports libp2p,mqtt]
        [--queue-mib 16,4096]

Runs the flood of `tests/gossip/test_flood_rss.py` (two OS processes, 40 x 4 MB at a
receiver whose consumer sleeps 0.5 s per accepted message) once per transport and per
receiver `max_queued_bytes`, and prints one JSON line of figures per run: baseline and
peak RSS, growth, the bound the test asserts for that budget, messages accepted and
dropped by reason, and the flood's duration. A budget of 4096 MiB lifts the byte bounds
(the receive queue is then bounded by its 1024 messages only, as before byte budgets):
the growth it shows is what the budgets save. MQTT needs mosquitto (skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.gossip.conftest import Broker, PeerProcess, mosquitto_path  # noqa: E402
from tests.gossip.test_flood_rss import MIB, budget_bound, figures, flood, start_pair  # noqa: E402


def run(transport: str, queue_bytes: int, broker: list[str]) -> dict[str, Any]:
    started: list[PeerProcess] = []
    log_dir = Path(tempfile.mkdtemp(prefix="flood-rss-"))

    def spawn(name: str, *args: str, script: Path) -> PeerProcess:
        peer = PeerProcess(name, list(args), log_dir, script)
        started.append(peer)
        return peer

    try:
        report = flood(*start_pair(spawn, transport, broker, queue_bytes))
    finally:
        for peer in started:
            peer.stop()
    return {
        "transport_type": transport,
        "max_queued_mib": queue_bytes // MIB,
        **figures(report, budget_bound(transport, queue_bytes)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transports", default="libp2p,mqtt")
    p.add_argument("--queue-mib", default="16,4096", help="receiver max_queued_bytes, MiB")
    args = p.parse_args()
    budgets = [int(x) * MIB for x in args.queue_mib.split(",")]
    for transport in args.transports.split(","):
        broker: Broker | None = None
        broker_args: list[str] = []
        if transport == "mqtt":
            binary = mosquitto_path()
            if binary is None:
                print(json.dumps({"transport_type": "mqtt", "skipped": "no mosquitto"}))
                continue
            broker = Broker(binary, Path(tempfile.mkdtemp(prefix="flood-rss-broker-")))
            broker.start()
            broker_args = ["--mqtt-host", broker.host, "--mqtt-port", str(broker.port)]
        try:
            for queue_bytes in budgets:
                print(json.dumps(run(transport, queue_bytes, broker_args)), flush=True)
        finally:
            if broker is not None:
                broker.stop()


if __name__ == "__main__":
    main()
