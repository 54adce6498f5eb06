"""A node's run summarized as its metrics lines stream in, in bounded memory.

One implementation behind every view of a run: `swarm status`, the demo's table, the
dashboard and its Prometheus endpoint, so they can never disagree.

Invariants:
- `add(record)` takes the metrics lines in file order (a restarted node may repeat
  rounds it had done after its last checkpoint: they are counted again, as they were
  trained again).
- Memory is bounded whatever the run's length: totals are running sums, the chart
  history keeps the newest `max_history` rounds, `last` windows are deques. A history
  point says (`restart`) whether its line is the first of a new process.
- Cumulative counters in a record (drops, bytes) are the node's running totals since
  its process started; the summary adds them up over every process of the run (a
  restart is seen where a total goes down), so that every figure it shows covers the
  whole run. The first round with peers' groups is the run's, not the last process's.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from typing import Any

MAX_HISTORY = 5000
"""Rounds kept for charts (one compact point each, ~0.5 KB)."""


def point(record: dict[str, Any]) -> dict[str, Any]:
    """The part of a metrics line the dashboard charts."""
    evaluation = record.get("eval")
    return {
        "round": record["round"],
        "time": record.get("time"),
        "policy_version": record["policy_version"],
        "reward": record["mean_local_reward"],
        "external_reward": record.get("mean_external_reward"),
        "eval": evaluation["accuracy"] if evaluation else None,
        "external": record["external_groups"],
        "by_sender": record["external_by_sender"],
        "reward_by_sender": record.get("external_reward_by_sender", {}),
        "peers": record.get("peers", 0),
        "drops": record["drops"],
        "seconds": record["seconds"],
    }


class RunSummary:
    def __init__(self, last: int = 10, max_history: int = MAX_HISTORY) -> None:
        self.last = last
        self.rounds_seen = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=max_history)
        self.final: dict[str, Any] | None = None
        self._first_rewards: list[float] = []
        self._rewards_seen = 0
        self._last_rewards: deque[float] = deque(maxlen=last)
        self._first_window = 0
        self.cumulative_reward = 0.0
        self.external_groups = 0
        self.external_by_sender: Counter[str] = Counter()
        self.rounds_with_external = 0
        self.seconds: Counter[str] = Counter()
        self.eval_first: tuple[int, dict[str, Any]] | None = None
        self.eval_last: tuple[int, dict[str, Any]] | None = None
        self.first_external_round: int | None = None
        self.restarts = 0
        self._before_restarts: Counter[str] = Counter()
        """Drops, bytes, unsent publishes and reconnects of the run's earlier processes
        (their last lines' totals)."""

    def add(self, record: dict[str, Any]) -> None:
        previous = self.final
        restarted = previous is not None and any(
            now < before
            for now, before in zip(_process_totals(record), _process_totals(previous), strict=True)
        )
        if restarted and previous is not None:
            self.restarts += 1
            self._before_restarts.update(_counters(previous))
        if record["external_groups"] and self.first_external_round is None:
            self.first_external_round = record["round"]
        self.rounds_seen += 1
        reward = record["mean_local_reward"]
        if self._first_window < self.last:  # the first `last` rounds, as `summarize` had it
            self._first_window += 1
            if reward is not None:
                self._first_rewards.append(reward)
        if reward is not None:
            self._last_rewards.append(reward)
            self.cumulative_reward += reward
        self.external_groups += record["external_groups"]
        self.external_by_sender.update(record["external_by_sender"])
        self.rounds_with_external += bool(record["external_groups"])
        self.seconds.update(record["seconds"])
        if record.get("eval"):
            entry = (record["round"], record["eval"])
            self.eval_first = self.eval_first or entry
            self.eval_last = entry
        self.history.append({**point(record), "restart": restarted})
        self.final = record

    def summary(self) -> dict[str, Any]:
        """The run's headline figures (the keys `swarm status` and the demo show)."""
        final = self.final
        if final is None:
            raise ValueError("no rounds yet")
        seconds = self.seconds
        # The worker's own time (sampling may run ahead of its round or, with overlap,
        # beside training: then the sum can pass the rounds' total, and nothing idles).
        work = seconds["sample"] + seconds["score"] + seconds["train"]
        total = seconds["total"]
        first, last = self._first_rewards, list(self._last_rewards)
        return {
            "eval_first": self.eval_first,
            "eval_last": self.eval_last,
            "rounds": final["round"],
            "rounds_seen": self.rounds_seen,
            "policy_version": final["policy_version"],
            "peers": final.get("peers", 0),
            "first_external_round": self.first_external_round,
            "restarts": self.restarts,
            "rounds_with_external": self.rounds_with_external,
            "reward_first": statistics.fmean(first) if first else None,
            "reward_last": statistics.fmean(last) if last else None,
            "cumulative_reward": self.cumulative_reward,
            "external_groups": self.external_groups,
            "external_by_sender": dict(self.external_by_sender),
            "drops": self._whole_run_drops(final),
            "peer_scores": final.get("peer_scores"),  # absent in metrics of older versions
            "degraded": final.get("degraded") or {},  # library fallbacks, this process
            "bytes_in": self._before_restarts["bytes_in"] + final["bytes_in"],
            "bytes_out": self._before_restarts["bytes_out"] + final["bytes_out"],
            "not_sent": self._before_restarts["not_sent"] + not_sent(final),
            "reconnects": self._before_restarts["reconnects"] + _transport(final, "reconnects"),
            "overhead_fraction": max(1 - work / total, 0.0) if total else None,
            "seconds": dict(seconds),
        }

    def _whole_run_drops(self, final: dict[str, Any]) -> dict[str, int]:
        drops = Counter(final["drops"])
        for key, count in self._before_restarts.items():
            if key.startswith("drop:"):
                drops[key[5:]] += count
        return dict(drops)


def _counters(record: dict[str, Any]) -> Counter[str]:
    """A line's process totals, drops keyed `drop:<reason>`."""
    out: Counter[str] = Counter({f"drop:{k}": v for k, v in record["drops"].items()})
    out["bytes_in"], out["bytes_out"] = record.get("bytes_in", 0), record.get("bytes_out", 0)
    out["not_sent"], out["reconnects"] = not_sent(record), _transport(record, "reconnects")
    return out


def _transport(record: dict[str, Any], key: str) -> int:
    value = (record.get("transport") or {}).get(key, 0)
    return value if isinstance(value, int) else 0


def not_sent(record: dict[str, Any]) -> int:
    """Our publishes that never left this process, in its lifetime: refused by the
    transport (`publish_failed`) or dropped by it, e.g. during a broker outage
    (`dropped_outgoing`, MQTT)."""
    return sum((record.get("publish_failed") or {}).values()) + _transport(
        record, "dropped_outgoing"
    )


def _process_totals(record: dict[str, Any]) -> tuple[int, int, int]:
    """Totals that only grow within one process: any of them lower means a new one."""
    return (sum(record["drops"].values()), record.get("bytes_in", 0), record.get("bytes_out", 0))


NO_SIGNAL_DROPS = ("zero_variance", "no_trainable_signal")
"""Drop reasons of peers' groups with nothing to train: every completion scored the
same, or the reward spread lies only in completions the trainer will not train."""


def no_signal(drops: dict[str, int]) -> int:
    """Peers' groups dropped for carrying no trainable GRPO signal (`NO_SIGNAL_DROPS`)."""
    return sum(drops.get(reason, 0) for reason in NO_SIGNAL_DROPS)


def summarize(records: list[dict[str, Any]], last: int) -> dict[str, Any]:
    summary = RunSummary(last)
    for record in records:
        summary.add(record)
    return summary.summary()
