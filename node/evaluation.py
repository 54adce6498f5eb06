"""Held-out evaluation: greedy accuracy on a fixed set of task references.

Invariants:
- The held-out set is `num_tasks` references drawn from this node's own mixture by a
  task stream of its own seed (`eval.seed`, default derived from `tasks.seed`), fixed for
  the node's life and identical after a restart: scores are comparable across rounds.
- Never trained on: this node's training stream uses another seed, and peers' groups
  whose task seed is a held-out seed are refused (`held_out_task`, not the peer's fault;
  `is_held_out`). A peer could only collide by choosing our derived seed.
- `due(round)` is every `eval.every` rounds (never when 0); the round loop also
  evaluates after its last round.
"""

from __future__ import annotations

import hashlib
from typing import Any

from node.learner import EvalResult
from rewards.mixture import TaskStream
from swarm.config import NodeConfig
from swarm.messages import TaskRef


def held_out_seed(config: NodeConfig) -> int:
    """The task seed of the held-out stream (`eval.seed`, or derived from `tasks.seed`)."""
    if config.eval.seed is not None:
        return config.eval.seed
    digest = hashlib.blake2b(f"swarm-eval:{config.tasks.seed}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


class HeldOut:
    """The fixed held-out references of one node."""

    def __init__(self, config: NodeConfig) -> None:
        self.every = config.eval.every
        tasks = config.tasks.model_copy(update={"seed": held_out_seed(config)})
        self.refs: list[TaskRef] = TaskStream(tasks, config.model.seed).next_refs(
            config.eval.num_tasks
        )
        self.seeds = frozenset(ref.seed for ref in self.refs)
        self.max_new_tokens = config.eval.max_new_tokens or config.sampler.max_new_tokens

    def due(self, round_done: int) -> bool:
        return self.every > 0 and round_done % self.every == 0

    def is_held_out(self, ref: TaskRef) -> bool:
        return ref.seed in self.seeds


def eval_record(result: EvalResult, policy_version: int) -> dict[str, Any]:
    """The `eval` entry of a round's metrics record."""
    return {
        "accuracy": round(result.accuracy, 6),
        "n": result.n,
        "finished": round(result.finished, 6),
        "policy_version": policy_version,
        "seconds": round(result.seconds, 4),
    }
