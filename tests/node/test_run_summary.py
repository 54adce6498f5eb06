"""`RunSummary` over a run with restarts: every figure covers the whole run (issue 34: after
a restart, `swarm status` showed "peers' groups trained on 711" beside "first round with
external groups -", "without signal 0" and "bytes in 0", the last process's counters)."""

from __future__ import annotations

from typing import Any

from node.run_summary import RunSummary


def _line(round_: int, external: int, drops: dict[str, int], bytes_in: int) -> dict[str, Any]:
    return {
        "round": round_,
        "policy_version": round_,
        "mean_local_reward": 0.5,
        "external_groups": external,
        "external_by_sender": {"peer": external} if external else {},
        "drops": drops,
        "bytes_in": bytes_in,
        "bytes_out": 10 * round_,
        "seconds": {"total": 1.0},
    }


def test_counters_add_up_over_restarts_and_the_first_external_round_is_the_runs() -> None:
    summary = RunSummary(last=2)
    # First process: rounds 1-3, then killed; the restart resumes at round 3.
    summary.add(_line(1, 0, {}, 100))
    summary.add(_line(2, 2, {"zero_variance": 4}, 300))
    summary.add(_line(3, 2, {"zero_variance": 6, "stale": 1}, 500))
    summary.add(_line(3, 0, {}, 0))  # the new process: its totals start again
    summary.add(_line(4, 3, {"zero_variance": 2}, 200))
    s = summary.summary()
    assert s["restarts"] == 1
    assert s["first_external_round"] == 2
    assert s["drops"] == {"zero_variance": 8, "stale": 1}
    assert s["bytes_in"] == 700 and s["bytes_out"] == 30 + 40
    assert s["external_groups"] == 7 and s["rounds"] == 4


def test_a_run_without_restarts_shows_the_last_lines_totals() -> None:
    summary = RunSummary(last=2)
    for i in range(1, 4):
        summary.add(_line(i, 1, {"stale": i}, 100 * i))
    s = summary.summary()
    assert s["restarts"] == 0 and s["drops"] == {"stale": 3} and s["bytes_in"] == 300


def test_unsent_publishes_and_reconnects_add_up_over_restarts() -> None:
    """A broker outage (publishes the MQTT transport dropped, its reconnects) and
    publishes the transport refused showed nowhere but raw metrics.jsonl (issue 34)."""
    summary = RunSummary(last=2)

    def line(round_: int, bytes_in: int, dropped: int, reconnects: int, failed: int) -> dict:
        return {
            **_line(round_, 0, {}, bytes_in),
            "publish_failed": {"OSError": failed} if failed else {},
            "transport": {"dropped_outgoing": dropped, "reconnects": reconnects},
        }

    summary.add(line(1, 100, 0, 0, 0))
    summary.add(line(2, 200, 37, 8, 1))  # an outage, then the process is killed
    summary.add(line(2, 0, 0, 0, 0))  # the restart
    summary.add(line(3, 50, 2, 1, 0))
    s = summary.summary()
    assert s["restarts"] == 1
    assert s["not_sent"] == 37 + 1 + 2
    assert s["reconnects"] == 8 + 1
