"""What the dashboard page shows of one node: pure functions from a followed data dir
to JSON.

Invariants:
- The headline figures are `node.progress.headline` of the same `RunSummary`: the page
  and `swarm status` show the same numbers for the same lines.
- Every series has at most `MAX_POINTS` points whatever the run's length (rounds are
  binned; a bin's value is the mean of its rounds, refusals the sum).
- Strings that came from peers (peer ids, model ids) or models (completions) are data,
  never markup: the page inserts them as text.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from node.dashboard.follow import DataDirFollower
from node.progress import headline

MAX_POINTS = 400
TIME_SPLIT_ROUNDS = 50
"""The round-time split is the mean over this many newest rounds."""
SAMPLE_GROUPS = 4
MAX_TEXT = 400
"""Characters of a prompt or completion shown (the rest is in samples.jsonl)."""


def bins(n: int, limit: int = MAX_POINTS) -> list[range]:
    """Consecutive index ranges covering 0..n-1, at most `limit` of them."""
    size = max(1, math.ceil(n / limit))
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def binned_mean(rounds: Sequence[int], values: Sequence[float | None]) -> dict[str, list]:
    """(last round of the bin, mean of its non-missing values) per bin; empty bins dropped."""
    xs, ys = [], []
    for span in bins(len(values)):
        present = [values[i] for i in span if values[i] is not None]
        if present:
            xs.append(rounds[span[-1]])
            ys.append(round(statistics.fmean(present), 5))
    return {"round": xs, "value": ys}


def increments(totals: Sequence[dict[str, int]]) -> list[dict[str, int]]:
    """Per-round increments of cumulative counters; a counter that went down marks a
    restarted process (counting from zero again), so its new value is the increment."""
    out, previous = [], {}
    for current in totals:
        step = {}
        for key, value in current.items():
            before = previous.get(key, 0)
            step[key] = value - before if value >= before else value
        out.append({k: v for k, v in step.items() if v})
        previous = current
    return out


def refusals_over_time(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rounds = [p["round"] for p in history]
    steps = increments([p["drops"] for p in history])
    reasons = sorted({reason for step in steps for reason in step})
    spans = bins(len(steps))
    return {
        "round": [rounds[span[-1]] for span in spans],
        "by_reason": {
            reason: [sum(steps[i].get(reason, 0) for i in span) for span in spans]
            for reason in reasons
        },
    }


def peer_rewards(history: Sequence[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Per peer: the mean reward (as we re-scored it) of its groups we trained on."""
    rounds = [p["round"] for p in history]
    peers = sorted({peer for p in history for peer in p["reward_by_sender"]})
    return {
        peer: binned_mean(rounds, [p["reward_by_sender"].get(peer) for p in history])
        for peer in peers
    }


def time_split(history: Sequence[dict[str, Any]]) -> dict[str, float]:
    recent = list(history)[-TIME_SPLIT_ROUNDS:]
    phases = sorted({k for p in recent for k in p["seconds"] if k != "total"})
    return {
        phase: round(statistics.fmean(p["seconds"].get(phase, 0.0) for p in recent), 5)
        for phase in phases
    }


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def sample_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for record in reversed(records):  # newest first
        finished = record.get("finished") or [None] * len(record["completions"])
        out.append(
            {
                "round": record["round"],
                "task": f"{record['task']['source']} #{record['task']['index']}",
                "prompt": _cut(record["prompt"]),
                "completions": [
                    {"text": _cut(text), "reward": reward, "finished": done}
                    for text, reward, done in zip(
                        record["completions"], record["rewards"], finished, strict=False
                    )
                ],
            }
        )
    return out


def node_view(follower: DataDirFollower) -> dict[str, Any]:
    """The page's JSON for one node (`{"name", "rounds": 0}` before its first round)."""
    summary = follower.summary
    base = {"name": follower.name, "data_dir": str(follower.data_dir)}
    if summary.final is None:
        return {**base, "rounds": 0}
    s = summary.summary()
    history = list(summary.history)
    rounds = [p["round"] for p in history]
    return {
        **base,
        "rounds": s["rounds"],
        "time": summary.final.get("time"),
        "headline": [
            {"key": key, "label": label, "value": value}
            for key, label, value in headline(s, follower.last)
        ],
        "reward": binned_mean(rounds, [p["reward"] for p in history]),
        "eval": [[p["round"], p["eval"]] for p in history if p["eval"] is not None],
        "peer_reward": peer_rewards(history),
        "external": binned_mean(rounds, [p["external"] for p in history]),
        "refusals": refusals_over_time(history),
        "time_split": time_split(history),
        "round_seconds": binned_mean(rounds, [p["seconds"].get("total") for p in history]),
        "used_by_peer": dict(summary.external_by_sender.most_common()),
        "peers": follower.peer_table(),
        "samples": sample_rows(follower.samples(SAMPLE_GROUPS)),
        "corrupt_lines": follower.corrupt_lines,
    }
