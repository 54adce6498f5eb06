"""A simulation run's figures: the per-node and per-attacker parts of `run.json`, and
what the run cost this machine (`cost.json`).

Invariants: the summaries are pure functions of the simulated nodes' records (the same
scenario and seed give the same summary, byte for byte once serialized); `RunCost` is the
only thing here that reads clocks, and its figures are kept apart from `run.json`
because they are not reproducible.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from simnet.sim_nodes import SimNode

FINAL_FRACTION = 0.1
"""`final_reward` is the mean reward over the last this fraction of rounds."""


@dataclass(frozen=True)
class RunCost:
    """Wall and CPU time from `start()` on (CPU: this process's threads, and the child
    processes it has waited for, such as re-scoring workers)."""

    wall: float
    cpu: float
    children_cpu: float

    @classmethod
    def start(cls) -> RunCost:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(time.monotonic(), time.process_time(), children.ru_utime + children.ru_stime)

    def so_far(self) -> dict[str, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "wall_s": round(time.monotonic() - self.wall, 1),
            "cpu_s": round(time.process_time() - self.cpu, 1),
            "children_cpu_s": round(children.ru_utime + children.ru_stime - self.children_cpu, 1),
        }


def node_summary(sn: SimNode) -> dict[str, Any]:
    """One learning node's figures for `run.json` (rewards by round, sharing, drops)."""
    plan = sn.plan
    rewards = [sn.rewards[r] for r in sorted(sn.rewards)]
    valued = [r for r in rewards if r is not None]
    tail = max(1, round(len(rewards) * FINAL_FRACTION))
    tail_values = [r for r in rewards[-tail:] if r is not None]
    node = sn.node
    drops: Counter[str] = Counter()
    scores: dict[str, Any] = {}
    if node is not None:
        drops.update(node.drops)
        drops.update(node.gossip.counters.dropped)
        snap = node.gossip.scores.snapshot(top=0)
        scores = {k: snap[k] for k in ("ignored_now", "ignores_started", "forgiven")}
    return {
        "name": plan.name,
        "group": plan.group.name,
        "model": plan.group.model,
        "peer_id": plan.identity.peer_id,
        "local_groups": plan.config.sapo.local_groups,
        "external_groups": plan.config.sapo.external_groups,
        "rounds_done": len(sn.rewards),
        "incarnations": sn.incarnation,
        "resumed_from": sn.resumed_from,
        "gone": sn.gone,
        "cumulative_reward": sum(valued),
        "final_reward": statistics.fmean(tail_values) if tail_values else None,
        "external_used": sum(sn.external.values()),
        "first_external_round": min((r for r, n in sn.external.items() if n), default=None),
        "join_s": plan.group.join_s,
        "external_per_round": sum(sn.external.values()) / max(len(sn.external), 1),
        "policy_version": node.learner.policy_version if node is not None else 0,
        "behavior": plan.group.behavior,
        "drops_last_incarnation": dict(sorted(drops.items())),
        "peer_scores_last_incarnation": scores,
    }


def attacker_summary(sn: SimNode) -> dict[str, Any]:
    """A wire attacker's entry under `attackers` in `run.json`."""
    attacker = sn.attacker
    assert attacker is not None
    return {
        "name": sn.plan.name,
        "group": sn.plan.group.name,
        "behavior": attacker.behavior,
        "peer_ids": [i.peer_id for i in attacker.identities],
        "messages_sent": attacker.sent,
    }
