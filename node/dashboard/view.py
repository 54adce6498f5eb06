"""What the dashboard page shows of one node: pure functions from a followed data dir
to JSON.

Invariants:
- The headline figures are `node.progress.headline` of the same `RunSummary`: the page
  and `swarm status` show the same numbers for the same lines.
- Every series has at most `MAX_POINTS` points whatever the run's length (rounds are
  binned; a bin's value is the mean of its rounds, refusals the sum).
- A series' line is broken (`breaks`: the indices of points that start a new stretch)
  where the node was not running between two rounds (`run_starts`); no bin spans such
  a break (of the newest `MAX_POINTS // 4`; older ones are merged, to keep the bound).
- Peers do not say their names: a peer is named where the dashboard follows it too
  (`names`, from the followed nodes' peer ids), else shown by its id.
- The round-time split's `parts` partition the round: their means add up to the mean
  round time. Work that runs ahead of the round or beside it (sampling and scoring with
  prefetch or `sampler.overlap`) is shown apart (`overlapping`), never in that sum.
- Strings that came from peers (peer ids, model ids) or models (completions) are data,
  never markup: the page inserts them as text.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from node.dashboard.follow import DataDirFollower
from node.progress import headline

MAX_POINTS = 400
TIME_SPLIT_ROUNDS = 50
"""The round-time split is the mean over this many newest rounds."""
SAMPLE_GROUPS = 4
MAX_TEXT = 400
"""Characters of a prompt or completion shown (the rest is in samples.jsonl)."""
DOWN_S = 5.0
"""Seconds between two rounds' lines, past the later round's own time, after which the
node counts as not running between them (stopped, suspended or stalled)."""
OVERLAPPING = ("sample", "score")
"""Round-time entries measured beside the round when it has a `sample_wait` part."""
PART_ORDER = ("sample_wait", "sample", "score", "train", "publish", "checkpoint", "deltas",
              "eval")  # fmt: skip
"""The round's parts in the order they are drawn (unknown ones next, `other` last)."""


def _down_s(before: dict[str, Any], point: dict[str, Any]) -> float | None:
    """Seconds between two lines not spent in the later round (None: a clock that went
    back, e.g. after a reboot, or a line without a time)."""
    if before.get("time") is None or point.get("time") is None:
        return None
    gap = point["time"] - before["time"]
    return None if gap < 0 else max(gap - point["seconds"].get("total", 0.0), 0.0)


def run_starts(history: Sequence[dict[str, Any]]) -> list[tuple[int, float | None]]:
    """(index, seconds down or None if unknown) of each round that starts a new stretch
    of running: the first line of a restarted process (`restart`), a round number that
    did not go up (resumed from an older checkpoint), a clock that went back, or more
    than `DOWN_S` seconds between two lines that the later round does not account for."""
    out = []
    for i in range(1, len(history)):
        before, point = history[i - 1], history[i]
        down = _down_s(before, point)
        times = (before.get("time"), point.get("time"))
        clock_back = None not in times and times[1] < times[0]
        if (
            point.get("restart")
            or point["round"] <= before["round"]
            or clock_back
            or (down is not None and down > DOWN_S)
        ):
            out.append((i, down))
    return out


def _kept(starts: Sequence[int], n: int, limit: int) -> list[int]:
    """The stretch starts bins respect: at most `limit // 4`, the newest (older ones are
    merged into their neighbours, so the points stay within `limit`)."""
    inside = sorted({s for s in starts if 0 < s < n})
    return inside[len(inside) - limit // 4 :] if limit // 4 else []


def bins(n: int, limit: int = MAX_POINTS, starts: Sequence[int] = ()) -> list[range]:
    """Consecutive index ranges covering 0..n-1, at most `limit` of them, none across
    one of `starts` (see `_kept`)."""
    kept = _kept(starts, n, limit)
    size = max(1, math.ceil(n / (limit - len(kept))))
    edges = [0, *kept, n]
    return [
        range(first, min(first + size, end))
        for begin, end in itertools.pairwise(edges)
        for first in range(begin, end, size)
    ]


def _breaks(spans: Sequence[range], kept: set[int], present: Sequence[bool]) -> list[int]:
    """Indices (among the spans that have a point) of the points that start a stretch."""
    out, pending, index = [], False, 0
    for span, has_point in zip(spans, present, strict=True):
        pending = pending or span.start in kept
        if has_point:
            if pending and index:
                out.append(index)
            pending = False
            index += 1
    return out


def binned_mean(
    rounds: Sequence[int], values: Sequence[float | None], starts: Sequence[int] = ()
) -> dict[str, list]:
    """(last round of the bin, mean of its non-missing values) per bin, empty bins
    dropped; `breaks`: the points after a stretch start (the line is broken there)."""
    spans = bins(len(values), starts=starts)
    xs, ys, present = [], [], []
    for span in spans:
        values_in = [values[i] for i in span if values[i] is not None]
        present.append(bool(values_in))
        if values_in:
            xs.append(rounds[span[-1]])
            ys.append(round(statistics.fmean(values_in), 5))
    kept = set(_kept(starts, len(values), MAX_POINTS))
    return {"round": xs, "value": ys, "breaks": _breaks(spans, kept, present)}


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


def refusals_over_time(
    history: Sequence[dict[str, Any]], starts: Sequence[int] = ()
) -> dict[str, Any]:
    rounds = [p["round"] for p in history]
    steps = increments([p["drops"] for p in history])
    reasons = sorted({reason for step in steps for reason in step})
    spans = bins(len(steps), starts=starts)
    kept = set(_kept(starts, len(steps), MAX_POINTS))
    return {
        "round": [rounds[span[-1]] for span in spans],
        "by_reason": {
            reason: [sum(steps[i].get(reason, 0) for i in span) for span in spans]
            for reason in reasons
        },
        "breaks": _breaks(spans, kept, [True] * len(spans)),
    }


def peer_rewards(
    history: Sequence[dict[str, Any]], starts: Sequence[int] = ()
) -> dict[str, dict[str, list]]:
    """Per peer: the mean reward (as we re-scored it) of its groups we trained on."""
    rounds = [p["round"] for p in history]
    peers = sorted({peer for p in history for peer in p["reward_by_sender"]})
    return {
        peer: binned_mean(rounds, [p["reward_by_sender"].get(peer) for p in history], starts)
        for peer in peers
    }


def time_split(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mean round time of the newest `TIME_SPLIT_ROUNDS` rounds (`total`, seconds),
    its `parts` (they add up to `total`), and the `overlapping` work measured beside it.
    Lines of versions before `sample_wait` had sampling and scoring as parts."""
    recent = list(history)[-TIME_SPLIT_ROUNDS:]
    parts: dict[str, float] = {}
    overlapping: dict[str, float] = {}
    for p in recent:
        seconds = p["seconds"]
        beside = OVERLAPPING if "sample_wait" in seconds else ()
        for key, value in seconds.items():
            if key != "total":
                into = overlapping if key in beside else parts
                into[key] = into.get(key, 0.0) + value
    n = max(len(recent), 1)

    def order(key: str) -> tuple[int, str]:
        rank = PART_ORDER.index(key) if key in PART_ORDER else len(PART_ORDER)
        return (len(PART_ORDER) + 1 if key == "other" else rank, key)

    return {
        "rounds": len(recent),
        "total": round(sum(p["seconds"].get("total", 0.0) for p in recent) / n, 5),
        "parts": {k: round(parts[k] / n, 5) for k in sorted(parts, key=order)},
        "overlapping": {k: round(overlapping[k] / n, 5) for k in sorted(overlapping, key=order)},
    }


def uptime(history: Sequence[dict[str, Any]], starts: Sequence[int]) -> dict[str, Any] | None:
    """Since when the node has run without a break (as of its newest line): the first
    round of its newest stretch (`since_round`), the seconds from that round's start to
    the newest line (`up_s`), and the newest line's time (`last_time`, the node's clock:
    the boot clock of its machine, `swarm.clock.WallClock`)."""
    if not history:
        return None
    first = history[starts[-1] if starts else 0]
    last = history[-1]
    up = None
    if first.get("time") is not None and last.get("time") is not None:
        up = round(last["time"] - first["time"] + first["seconds"].get("total", 0.0), 3)
    return {"since_round": first["round"], "up_s": up, "last_time": last.get("time")}


def seen_ago(view: dict[str, Any], now: float) -> float | None:
    """Seconds since the node's newest line, by `now` on the node's clock (None where the
    clocks cannot be compared: a line from the future is another machine's, or boot's)."""
    up = (view.get("self") or {}).get("uptime") or {}
    last = up.get("last_time")
    if last is None or now < last:
        return None
    return round(now - last, 1)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def _end(finished: bool | None) -> str:
    """How a completion ended, as `swarm samples` says it: with the stop token
    (`[EOS]`), cut at the token budget (`[cut]`), or not recorded ("")."""
    return "" if finished is None else "[EOS]" if finished else "[cut]"


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
                    {"text": _cut(text), "reward": reward, "finished": done, "end": _end(done)}
                    for text, reward, done in zip(
                        record["completions"], record["rewards"], finished, strict=False
                    )
                ],
            }
        )
    return out


def node_view(follower: DataDirFollower, names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The page's JSON for one node (`{"name", "data_dir", "self", "rounds": 0}` before
    its first round). `names`: peer id -> name of the nodes a dashboard follows (peers
    do not say their names: others are shown by id)."""
    names = names or {}
    summary = follower.summary
    base = {
        "name": follower.name,
        "data_dir": str(follower.data_dir),
        "self": {**follower.node_info(), "uptime": None, "restarts": []},
    }
    if summary.final is None:
        return {**base, "rounds": 0}
    s = summary.summary()
    history = list(summary.history)
    rounds = [p["round"] for p in history]
    down = run_starts(history)
    starts = [i for i, _ in down]
    base["self"]["uptime"] = uptime(history, starts)
    base["self"]["restarts"] = [
        {
            "round": history[i]["round"],
            "after_round": history[i - 1]["round"],
            "down_s": None if d is None else round(d, 1),
        }
        for i, d in down
    ]
    table = follower.peer_table()
    if table is not None:
        table = {**table, "peers": [{**row, "name": names.get(row.get("peer"))}
                                    for row in table["peers"]]}  # fmt: skip
    seen = {*summary.external_by_sender, *(row["peer"] for row in (table or {}).get("peers", []))}
    seen.update(peer for p in history for peer in p["reward_by_sender"])
    return {
        **base,
        "rounds": s["rounds"],
        "time": summary.final.get("time"),
        "headline": [
            {"key": key, "label": label, "value": value}
            for key, label, value in headline(s, follower.last)
        ],
        "reward": binned_mean(rounds, [p["reward"] for p in history], starts),
        "eval": [[p["round"], p["eval"]] for p in history if p["eval"] is not None],
        "peer_reward": peer_rewards(history, starts),
        "external": binned_mean(rounds, [p["external"] for p in history], starts),
        "refusals": refusals_over_time(history, starts),
        "time_split": time_split(history),
        "round_seconds": binned_mean(rounds, [p["seconds"].get("total") for p in history], starts),
        "used_by_peer": dict(summary.external_by_sender.most_common()),
        "peers": table,
        "peer_names": {peer: names[peer] for peer in sorted(seen) if peer in names},
        "samples": sample_rows(follower.samples(SAMPLE_GROUPS)),
        "corrupt_lines": follower.corrupt_lines,
    }
