"""Held-out evaluation: greedy accuracy on fixed sets of task references.

Invariants:
- By default the held-out set is `num_tasks` references drawn from this node's own
  mixture by a task stream of its own seed (`eval.seed`, default derived from
  `tasks.seed`). With `eval.sources`, there is one set of `num_tasks` per source, each
  drawn by a single-source stream of that same seed, so a node can be scored on the
  specialties of other nodes too. Every set is fixed for the node's life and identical
  after a restart: scores are comparable across rounds.
- Never trained on: this node's training stream uses another seed, and peers' groups
  whose task seed is a held-out seed are refused (`held_out_task`, not the peer's fault;
  `is_held_out`), whatever their source. A peer could only collide by choosing our
  derived seed.
- A round's record (`eval_record`) pools every set: `accuracy` and `finished` are means
  over all held-out answers, `n` their count, `samples` how they were decoded (0: one
  greedy answer per task; k: k sampled at the sampler's temperature, `accuracy` then the
  sampled pass rate). With `eval.sources` it adds `sources`:
  per source, its own accuracy and count (`combine_results` is the pure pooling).
- Where the learner reports its answers and the gold ones (`EvalResult.answers`,
  `golds`), the record also says how much of the accuracy a constant answer explains:
  `constant_answer_accuracy` and `constant_answer` (the one answer that, given to every
  task, scores best under the node's own correctness, among the set's gold answers:
  `EvalResult.constant`; partial credit counts, so on spell_backward one task's reversed
  word, given to all, collects 15% in letters in place; pooled over sets, each set's own
  weighted by size, no answer recorded; where a learner did not compute it, the
  exact-match figure, the share of the set's most common gold answer) and
  `modal_answer` / `modal_answer_share` (the policy's most common answer and the share of
  its answers that are it). A policy that learned to answer "1" to every gcd question
  reaches the first figure, with a share near 1.
- A held-out task whose item could not be built in time is left out of that evaluation
  (`rewards.registry.build_tasks`): `n` counts what was scored, `skipped` (present only
  when not 0) what was left out.
- `due(round)` is every `eval.every` rounds (never when 0), at the start of the round.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from node.learner import EvalResult, Learner
from rewards.mixture import TaskStream
from swarm.config import NodeConfig
from swarm.config.tasks import TaskSpec
from swarm.messages import TaskRef

MIXTURE = "mixture"
"""Name of the single held-out set drawn from the node's own mixture (no `eval.sources`)."""

MODAL_ANSWER_CHARS = 80
"""The most common answer is recorded up to this many characters (an answer that is not
one is often a whole line of text)."""


def held_out_seed(config: NodeConfig) -> int:
    """The task seed of the held-out stream (`eval.seed`, or derived from `tasks.seed`)."""
    if config.eval.seed is not None:
        return config.eval.seed
    digest = hashlib.blake2b(f"swarm-eval:{config.tasks.seed}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


def held_out_sets(config: NodeConfig) -> dict[str, list[TaskRef]]:
    """The held-out references by set name: `{MIXTURE: refs}`, or one set per source."""
    seed = held_out_seed(config)
    n = config.eval.num_tasks
    if config.eval.sources is None:
        tasks = config.tasks.model_copy(update={"seed": seed})
        return {MIXTURE: TaskStream(tasks, config.model.seed).next_refs(n)}
    sets = {}
    for source in config.eval.sources:
        tasks = config.tasks.model_copy(update={"seed": seed, "mixture": [TaskSpec(source=source)]})
        sets[source] = TaskStream(tasks, config.model.seed).next_refs(n)
    return sets


class HeldOut:
    """The fixed held-out references of one node."""

    def __init__(self, config: NodeConfig) -> None:
        self.every = config.eval.every
        self.per_source = config.eval.sources is not None
        self.sets = held_out_sets(config)
        self.refs: list[TaskRef] = [ref for refs in self.sets.values() for ref in refs]
        self.seeds = frozenset(ref.seed for ref in self.refs)
        self.max_new_tokens = config.eval.max_new_tokens or config.sampler.max_new_tokens
        self.samples = config.eval.samples

    def due(self, round_done: int) -> bool:
        return self.every > 0 and round_done % self.every == 0

    def is_held_out(self, ref: TaskRef) -> bool:
        return ref.seed in self.seeds

    async def evaluate(
        self, learner: Learner, model_offload: Callable[..., Awaitable[Any]], round_done: int
    ) -> dict[str, Any] | None:
        """Greedy accuracy on every held-out set through `model_offload` (off the loop),
        as the round record's `eval` entry, when `round_done` is due (None otherwise)."""
        if not self.due(round_done):
            return None
        results = {
            name: await model_offload(learner.evaluate, refs, self.max_new_tokens, self.samples)
            for name, refs in self.sets.items()
        }
        return eval_record(results, learner.policy_version, self.per_source, self.samples)


def combine_results(results: Mapping[str, EvalResult]) -> EvalResult:
    """Pool per-set results into one: accuracy and finished weighted by each set's size,
    counts and seconds summed (ValueError when there is no result)."""
    if not results:
        raise ValueError("no evaluation results to combine")
    if len(results) == 1:
        return next(iter(results.values()))
    n = sum(r.n for r in results.values())
    weights = n or 1
    return EvalResult(
        accuracy=sum(r.accuracy * r.n for r in results.values()) / weights,
        n=n,
        seconds=sum(r.seconds for r in results.values()),
        finished=sum(r.finished * r.n for r in results.values()) / weights,
        answers=tuple(a for r in results.values() for a in r.answers),
        golds=tuple(g for r in results.values() for g in r.golds),
        constant=_pooled_constant(results.values()),
        skipped=sum(r.skipped for r in results.values()),
    )


def _pooled_constant(results: Iterable[EvalResult]) -> tuple[str | None, float] | None:
    """Each set's best constant, weighted by its number of tasks (a policy may give one
    answer per source); None unless every set has one."""
    results = list(results)
    if any(r.constant is None for r in results):
        return None
    tasks = sum(len(r.golds) for r in results)
    total = sum(r.constant[1] * len(r.golds) for r in results if r.constant is not None)
    return None, total / tasks if tasks else 0.0


def modal_share(values: Iterable[str | None]) -> tuple[str | None, float]:
    """The most common value that is not None (the first seen among equals) and its share
    of all values, Nones included; `(None, 0.0)` when there is none."""
    values = list(values)
    counts = Counter(v for v in values if v is not None)
    if not counts:
        return None, 0.0
    value, count = counts.most_common(1)[0]
    return value, count / len(values)


def answer_stats(result: EvalResult) -> dict[str, Any]:
    """What a constant answer explains of `result` (see the module doc): empty when the
    learner reported no answers."""
    if not result.answers or not result.golds:
        return {}
    answer, share = modal_share(result.answers)
    # Scored by the node's own correctness where the learner computed it; otherwise the
    # exact-match figure: the share of the most common gold answer.
    constant_answer, constant = result.constant or modal_share(result.golds)
    stats: dict[str, Any] = {
        "constant_answer_accuracy": round(constant, 6),
        "modal_answer": answer if answer is None else answer[:MODAL_ANSWER_CHARS],
        "modal_answer_share": round(share, 6),
    }
    if constant_answer is not None:
        stats["constant_answer"] = constant_answer[:MODAL_ANSWER_CHARS]
    return stats


def eval_record(
    results: Mapping[str, EvalResult],
    policy_version: int,
    per_source: bool = False,
    samples: int = 0,
) -> dict[str, Any]:
    """The `eval` entry of a round's metrics record (with `sources` when `per_source`;
    `samples` says how it was decoded: 0 greedy, k sampled k per task)."""
    pooled = combine_results(results)
    record: dict[str, Any] = {
        "accuracy": round(pooled.accuracy, 6),
        "samples": samples,
        "n": pooled.n,
        "finished": round(pooled.finished, 6),
        "policy_version": policy_version,
        "seconds": round(pooled.seconds, 4),
        **answer_stats(pooled),
    }
    if pooled.skipped:
        record["skipped"] = pooled.skipped
    if per_source:
        record["sources"] = {
            name: {"accuracy": round(r.accuracy, 6), "n": r.n, **answer_stats(r)}
            for name, r in results.items()
        }
    return record
