"""Peak RSS of a slow receiver under a flood of 4 MB messages stays within its byte budgets.

Two real OS processes (`flood_peer.py`) on 127.0.0.1: a receiver running a real `Gossip`
over a real transport whose consumer sleeps 0.5 s after every accepted message (about
8 MB/s), and a flooder publishing 4 MB `DeltaPacket`s (4 chunks of ~1 MiB each) as fast
as its `Gossip.publish` returns. The receiver samples its own VmRSS every 5 ms (and
reads the kernel's VmHWM, reset when the baseline is taken, after a 2-message warm-up).

The bound asserted on `peak - baseline` is the sum of what the configured budgets let
peers make the receiver hold (see the transports' module docstrings):

    receive queue   max_queued_bytes + 512 B x queue messages
    message cache   max_queued_bytes               (libp2p only: GossipSub's mcache)
    one packet      max_message_bytes + 128 KiB    (MQTT only: paho reads a packet whole)
    reassembly      max_reassembly_bytes           (gossip layer)
    slack           SLACK_BYTES                    (Python, allocator, transient copies)

Measured here (2 shared cores), receiver max_queued_bytes 16 MiB, reassembly 32 MiB,
envelopes 8 MiB, 40 x 4 MB: libp2p grows 47-52 MiB (37 MiB with a fast consumer), MQTT
33-36 MiB. With the byte bounds lifted to 4 GiB (the former behaviour: 1024 messages of
up to 1 MiB, and GossipSub's message cache kept whole for 5 heartbeats) the same flood
grows libp2p by 199-231 MiB and MQTT by 152-157 MiB, and more with a longer or faster
flood. Beyond the two budgets the growth left is 16-20 MiB, the flooder's own partial
sets (at most one envelope, 8 MiB, per sender) included: SLACK_BYTES is 24 MiB. The
figures, bounded and unbounded, come from `.venv/bin/python benchmarks/flood_rss.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

MIB = 1 << 20
FLOOD_SCRIPT = Path(__file__).with_name("flood_peer.py")
QUEUE_BYTES = 16 * MIB
QUEUE_MESSAGES = 1024
REASSEMBLY_BYTES = 32 * MIB
ENVELOPE_BYTES = 8 * MIB
MESSAGE_BYTES = MIB  # the transports' default max_message_bytes
SLACK_BYTES = 24 * MIB
FLOOD_COUNT = 40
FLOOD_SIZE = 4_000_000
TIMEOUT_S = 60.0

PeerProcess = Any  # conftest.PeerProcess (conftest modules are not imported by tests)


def receiver_args(transport: str, *extra: str, queue_bytes: int = QUEUE_BYTES) -> list[str]:
    return [
        "--role", "recv", "--transport", transport,
        "--max-queued-bytes", str(queue_bytes),
        "--queue-messages", str(QUEUE_MESSAGES),
        "--max-reassembly-bytes", str(REASSEMBLY_BYTES),
        "--max-envelope-bytes", str(ENVELOPE_BYTES),
        "--delay", "0.5",
        *extra,
    ]  # fmt: skip


def arrivals(transport_stats: dict[str, Any]) -> int:
    """Transport messages that reached the receiver's queue, admitted or dropped."""
    dropped = transport_stats["dropped_incoming_by_reason"]
    return transport_stats["received"] + sum(n for r, n in dropped.items() if r != "evicted")


def flood(receiver: PeerProcess, flooder: PeerProcess) -> dict[str, Any]:
    """Warm up, take the baseline, flood, wait for every message to arrive; the report."""
    flooder.request(f"flood 2 {FLOOD_SIZE} 0", "flooded", TIMEOUT_S)
    receiver.wait_until(lambda _: len(receiver.received()) >= 2, TIMEOUT_S, "warm-up messages")
    receiver.request("baseline", "baseline")
    t0 = time.monotonic()
    sent = flooder.request(f"flood {FLOOD_COUNT} {FLOOD_SIZE} 100", "flooded", 4 * TIMEOUT_S)
    # libp2p: a flooder whose outbound queue to the slow receiver is full skips the
    # message there (counted by the flooder): those never arrive.
    expected = sent["wire_messages"] - sent["skipped_slow_peer"]
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        report = receiver.request("report", "report")
        if arrivals(report["transport"]) >= expected:
            break
        assert time.monotonic() < deadline, f"flood did not arrive: {report['transport']}"
        time.sleep(0.2)
    report["flood_seconds"] = time.monotonic() - t0
    report["flood"] = sent
    return report


def figures(report: dict[str, Any], bound: int) -> dict[str, Any]:
    """The measured figures of one flood, JSON-ready (MiB rounded to 0.1)."""
    return {
        "baseline_mib": round(report["baseline"] / MIB, 1),
        "peak_mib": round(report["peak"] / MIB, 1),
        "growth_mib": round((report["peak"] - report["baseline"]) / MIB, 1),
        "bound_mib": round(bound / MIB, 1),
        "accepted": report["accepted"],
        "transport": report["transport"],
        "gossip_dropped": report["gossip"]["dropped"],
        "flood_seconds": round(report["flood_seconds"], 1),
    }


def check_bound(report: dict[str, Any], bound: int) -> None:
    growth = report["peak"] - report["baseline"]
    stats = report["transport"]
    shown = figures(report, bound)
    print(json.dumps(shown))  # shown with pytest -s: the figures of the module docstring
    assert report["samples"] > 100, "the RSS sampler did not run"
    assert growth <= bound, shown
    # The flood outran the consumer, so the byte budget is what held memory down ...
    assert stats["dropped_incoming"] > 0, shown
    assert stats["peak_queued_bytes"] <= QUEUE_BYTES + MESSAGE_BYTES, shown
    # ... and the receiver still got some of the flood through.
    assert report["accepted"] >= 3, shown


def budget_bound(transport: str, queue_bytes: int = QUEUE_BYTES) -> int:
    """What the configured budgets let peers make the receiver hold, plus slack."""
    queue = queue_bytes + 512 * QUEUE_MESSAGES
    # libp2p: GossipSub's message cache; MQTT: one packet being read by paho.
    extra = queue_bytes if transport == "libp2p" else MESSAGE_BYTES + 128 * 1024
    return queue + extra + REASSEMBLY_BYTES + SLACK_BYTES


def start_pair(
    spawn: Any, transport: str, broker: list[str], queue_bytes: int = QUEUE_BYTES
) -> tuple[PeerProcess, PeerProcess]:
    """A slow receiver and a flooder, connected (libp2p mesh formed, or both on the broker)."""
    args = receiver_args(transport, *broker, queue_bytes=queue_bytes)
    receiver = spawn("R", *args, script=FLOOD_SCRIPT).ready()
    dial = ["--bootstrap", receiver.addrs[0]] if transport == "libp2p" else []
    flooder = spawn(
        "F", "--role", "flood", "--transport", transport, *broker, *dial, script=FLOOD_SCRIPT
    ).ready()
    for peer, other in ((receiver, flooder), (flooder, receiver)):
        if transport == "libp2p":
            peer.wait_until(lambda _, p=peer, o=other: o.peer_id in p.mesh(), TIMEOUT_S, "mesh")
        else:
            peer.wait_until(lambda _, p=peer: bool(p.mesh()), TIMEOUT_S, "broker connection")
    return receiver, flooder


@pytest.mark.slow
def test_libp2p_receiver_rss_stays_within_its_budgets(spawn_peer: Any) -> None:
    report = flood(*start_pair(spawn_peer, "libp2p", []))
    check_bound(report, budget_bound("libp2p"))
    assert report["transport"]["message_cache_bytes"] <= QUEUE_BYTES


@pytest.mark.slow
def test_mqtt_receiver_rss_stays_within_its_budgets(
    spawn_peer: Any, mosquitto_broker: Any
) -> None:
    broker = ["--mqtt-host", mosquitto_broker.host, "--mqtt-port", str(mosquitto_broker.port)]
    report = flood(*start_pair(spawn_peer, "mqtt", broker))
    check_bound(report, budget_bound("mqtt"))
