"""Prometheus metrics for the nodes a dashboard follows (`/metrics`).

Invariants:
- A scrape reads nothing but the followers' state (each follower was polled just
  before): it never touches the node's event loop or its files beyond what the
  dashboard already reads.
- Every metric carries a `node` label (the data dir's name), so one endpoint can serve
  several nodes. Counters come from the newest metrics line (the node's running totals
  since its process started) or from the summary's sums; gauges are the newest round's.
- Label values from peers are not used (a hostile peer cannot blow up cardinality):
  refusal reasons are the node's own fixed vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from node.dashboard.follow import DataDirFollower

PREFIX = "swarm_"


class SwarmCollector:
    def __init__(self, followers: Callable[[], Sequence[DataDirFollower]]) -> None:
        self.followers = followers

    def collect(self) -> Iterable[Metric]:
        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, doc, labels=["node", *labels])

        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=["node", *labels])

        rounds = counter("rounds", "Rounds done (the node's round counter).")
        version = gauge("policy_version", "Optimizer steps of the local policy.")
        reward = gauge("reward", "Mean reward of the newest round's own samples.")
        eval_accuracy = gauge("eval_accuracy", "Newest held-out greedy accuracy.")
        peers = gauge("peers", "Peers that said hello.")
        pool = gauge("pool_groups", "Peers' groups waiting in the rollout pool.")
        used = counter("external_groups", "Peers' groups trained on.")
        refused = counter("refused", "Messages and groups refused, by reason.", ["reason"])
        bytes_in = counter("bytes_in", "Gossip bytes received.")
        bytes_out = counter("bytes_out", "Gossip bytes sent.")
        publish_failed = counter(
            "publish_failed", "Own publishes not sent (transport refused or dropped them)."
        )
        reconnects = counter("transport_reconnects", "Reconnections to the broker or network.")
        seconds = counter("round_seconds", "Time spent in rounds, by phase.", ["phase"])
        last_seconds = gauge("last_round_seconds", "The newest round's time, by phase.", ["phase"])
        for follower in self.followers():
            summary, final = follower.summary, follower.summary.final
            if final is None:
                continue
            node = follower.name
            rounds.add_metric([node], final["round"])
            version.add_metric([node], final["policy_version"])
            if final["mean_local_reward"] is not None:
                reward.add_metric([node], final["mean_local_reward"])
            if summary.eval_last is not None:
                eval_accuracy.add_metric([node], summary.eval_last[1]["accuracy"])
            peers.add_metric([node], final.get("peers", 0))
            pool.add_metric([node], final.get("pool_groups", 0))
            used.add_metric([node], summary.external_groups)
            for reason, count in final["drops"].items():
                refused.add_metric([node, reason], count)
            bytes_in.add_metric([node], final["bytes_in"])
            bytes_out.add_metric([node], final["bytes_out"])
            whole_run = summary.summary()
            publish_failed.add_metric([node], whole_run["not_sent"])
            reconnects.add_metric([node], whole_run["reconnects"])
            for phase, total in summary.seconds.items():
                seconds.add_metric([node, phase], total)
            for phase, value in final["seconds"].items():
                last_seconds.add_metric([node, phase], value)
        yield from (rounds, version, reward, eval_accuracy, peers, pool, used, refused)
        yield from (bytes_in, bytes_out, publish_failed, reconnects, seconds, last_seconds)


def registry_for(followers: Callable[[], Sequence[DataDirFollower]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SwarmCollector(followers))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
