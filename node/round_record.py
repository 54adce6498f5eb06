"""One round's metrics line (`metrics.jsonl`): what the round did, read off the node.

Invariant: a pure read of the node and the round's results; nothing here changes state
or waits (it runs on the event loop between two rounds).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sized
from typing import Any, Protocol

from node.learner import ExternalGroup
from node.metrics import histogram, mean_by_key, mean_or_none
from swarm.internals import DEGRADED


class RoundSource(Protocol):
    """What a round's record reads off the node (`node.runner.Node` is one)."""

    rounds_done: int
    first_external_round: int | None
    gossip: Any
    learner: Any
    clock: Any
    pool: Sized
    peers: Sized
    drops: Counter[str]
    rescorer: Any

    @property
    def checkpoint_errors(self) -> int: ...


def round_record(
    node: RoundSource,
    *,
    sampled: Any,
    sampled_version: int,
    external: list[ExternalGroup],
    ages: list[int],
    lags: list[int],
    trained: Any,
    deltas: dict[str, Any] | None,
    evaluation: dict[str, Any] | None,
    seconds: dict[str, Any],
    admission_queue: int,
    transport: dict[str, Any] | None,
    metrics_dropped: int,
) -> dict[str, Any]:
    counters = node.gossip.counters.snapshot()
    # The trainer's groups are ours, then `external` in order (a stub learner: none).
    group_logprobs = trained.stats.get("group_logprob") or [None] * len(external)
    own_logprobs = group_logprobs[: len(group_logprobs) - len(external)]
    peer_logprobs = group_logprobs[len(group_logprobs) - len(external) :]
    return {
        "round": node.rounds_done,
        "policy_version": node.learner.policy_version,
        "sampled_version": sampled_version,
        "time": node.clock.now(),
        "local_groups": len(sampled.groups),
        # Own task references left out (item not built in time, generator raised).
        "own_tasks_skipped": dict(sampled.skipped),
        "external_groups": len(external),
        "external_by_sender": dict(Counter(e.sender for e in external)),
        "external_reward_by_sender": mean_by_key(
            (e.sender, r) for e in external for r in e.rewards
        ),
        # How plausible our policy found what it trained: ours vs each peer's.
        "local_logprob": mean_or_none(lp for lp in own_logprobs if lp is not None),
        "external_logprob_by_sender": mean_by_key(
            (e.sender, lp) for e, lp in zip(external, peer_logprobs, strict=True) if lp is not None
        ),
        "mean_local_reward": mean_or_none(r for g in sampled.groups for r in g.rewards),
        "mean_external_reward": mean_or_none(r for e in external for r in e.rewards),
        "age": histogram(ages),
        "version_lag": histogram(lags),
        "pool_groups": len(node.pool),
        "peers": len(node.peers),
        "first_external_round": node.first_external_round,
        "admission_queue": admission_queue,
        "drops": dict(sorted((node.drops + Counter(counters["dropped"])).items())),
        "publish_failed": counters["publish_failed"],
        "rescore": node.rescorer.stats(),
        "peer_scores": node.gossip.scores.snapshot(),
        "transport": transport,
        "checkpoint_errors": node.checkpoint_errors,
        # Fallbacks taken because a library internal we use is gone (`swarm.internals`).
        "degraded": dict(DEGRADED),
        "metrics_dropped": metrics_dropped,
        "bytes_in": counters["bytes_in"],
        "bytes_out": counters["bytes_out"],
        "seconds": seconds,
        "train": trained.stats,
        "deltas": deltas,
        "eval": evaluation,
    }
