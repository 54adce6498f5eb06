"""Config sections owned by `rewards/` and the node's evaluation: the task mixture, how
rewards are computed (and re-computed for peers' groups), and the held-out evaluation.

Invariant: as `swarm.config.learning`'s: the defaults are one set that learns (the
`digit` task, format weight 0.5); every task source named here is checked at load
(`swarm.config.task_sources`), so a node never starts on a source it cannot regenerate
deterministically and in bounded time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from swarm.config.base import StrictModel, refuse_idle
from swarm.config.task_sources import check_task_options, check_task_source


class TaskSpec(StrictModel):
    source: str
    """A task source name: a built-in generator (`add`, `copy`, `reverse`, `compare`, `digit`)
    or `rg:<dataset>` (a reasoning-gym dataset). Only sources that are deterministic across
    processes and bounded in time are accepted: reasoning-gym datasets are checked against
    the measured table in `swarm.config.task_sources` (refused ones name the reason)."""
    weight: float = Field(1.0, gt=0)
    """Relative frequency in the mixture."""
    options: dict[str, Any] = {}
    """reasoning-gym dataset settings (fields of the dataset's config, e.g. `min_terms`;
    empty: its defaults). They are part of the source's identity on the wire
    (`rg:<dataset>@<digest>`): peers using other options never train on these groups,
    nor these nodes on theirs. See `examples/node-sapo-rgym.toml` for the SAPO paper's."""

    @model_validator(mode="after")
    def _usable_options(self) -> TaskSpec:
        check_task_options(self.source, self.options)
        return self

    @field_validator("source")
    @classmethod
    def _usable_source(cls, source: str) -> str:
        check_task_source(source)
        return source


class TasksConfig(StrictModel):
    mixture: list[TaskSpec] = [TaskSpec(source="digit")]
    """Weighted task mixture this node samples its own questions from. The default,
    `digit` (echo a digit, then stop), is what the built-in model learns from scratch."""
    seed: int | None = None
    """Seed of this node's task stream (task references carry it). Unset (the default):
    derived from this node's key like `model.seed`, so two nodes made from one config
    file sample different tasks."""
    accept_foreign: bool = False
    """Also train on peers' groups of task sources outside this node's mixture. Off by
    default: re-scoring runs a task's generator on the task reference a peer chose, so
    only the generators this node already runs for itself are exposed to peers."""

    @model_validator(mode="after")
    def _non_empty(self) -> TasksConfig:
        if not self.mixture:
            raise ValueError("the task mixture needs at least one source")
        return self


class RewardsConfig(StrictModel):
    correctness: str = "source"
    """Correctness reward from `rewards.registry.CORRECTNESS`: `source` (the task source's own
    scorer, e.g. reasoning-gym's `score_answer`), `exact` or `numeric`."""
    format_weight: float = Field(0.5, ge=0, le=1)
    """Weight of the format reward added to correctness (0: correctness alone). It gives
    a policy that answers nothing right yet a signal to learn the answer's form from."""
    answer_format: Literal["auto", "answer_block", "first_line"] = "auto"
    """What the format reward asks for: `answer_block` (a complete `<answer>...</answer>`
    whose content fits the task's answer pattern), `first_line` (the bare first line fits
    it; for models trained without a template), or `auto` (`answer_block` when prompts use
    a chat template, else `first_line`). Reasoning-gym tasks always need the block.
    Correctness reads either form in every mode."""
    timeout_s: float = Field(2.0, gt=0)
    """Time limit for any single reward computation that may run long (it then scores 0;
    the computation runs in a worker process that is killed at the limit)."""
    rescore_workers: int = Field(1, ge=1, le=64)
    """Worker processes that regenerate and re-score peers' groups off the event loop
    (`node.workers.RescoreWorkers`; each is a separate interpreter with reasoning-gym
    loaded, roughly 150 MB)."""
    rescore_timeout_s: float = Field(5.0, ge=2.0, le=600)
    """Hard limit on re-scoring one peer's group (regenerating its task and scoring every
    completion): past it the worker is killed and replaced and the group is refused as
    `task_timeout`, which counts against the peer. At least 2 s: usable task sources take
    at most about 1 s per item (measured, see `swarm.config.task_sources`), so an honest
    peer's group is not blamed on a busy machine."""
    max_queued_rescores: int = Field(256, ge=1, le=1 << 16)
    """Peers' groups waiting for a re-scoring worker; beyond it a group is refused as
    `rescore_queue_full` (counted, not the peer's fault)."""

    @model_validator(mode="after")
    def _rescore_covers_one_reward(self) -> RewardsConfig:
        if self.rescore_timeout_s < self.timeout_s:
            raise ValueError(
                f"rescore_timeout_s ({self.rescore_timeout_s}) must be >= timeout_s "
                f"({self.timeout_s}): re-scoring a group includes at least one reward"
            )
        if self.format_weight == 0:
            refuse_idle(self, ("answer_format",), "format_weight > 0")
        return self


class EvalConfig(StrictModel):
    every: int = Field(25, ge=0, le=1 << 30)
    """Evaluate at the start of round 0 (before any training) and of every `every`-th
    round after it; 0 turns evaluation off."""
    num_tasks: int = Field(32, ge=1, le=4096)
    """Size of the fixed held-out set: task references drawn from this node's mixture (with
    `sources`: per source)."""
    max_new_tokens: int | None = Field(None, ge=1, le=32768)
    """Token budget per held-out answer (default: `sampler.max_new_tokens`)."""
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    """Task seed of the held-out set (default: derived from `tasks.seed`). Peers' groups of
    this seed are never trained on (refused as `held_out_task`)."""
    samples: int = Field(0, ge=0, le=256)
    """Completions per held-out task: 0 decodes greedily (one answer each); k > 0 samples k
    at the sampler's temperature and top_p (a fixed seed per evaluation), and accuracy is
    the mean over all of them: the pass rate the node's own sampling sees, which moves
    with training before the greedy answer does."""
    sources: list[str] | None = None
    """Task sources to evaluate on, one held-out set of `num_tasks` per source, scored
    apart (`eval.sources` in the metrics), including sources this node does not train on
    (what it learned from peers about other specialties). Plain source names (`add`,
    `rg:<dataset>` with its default options). None: one set drawn from this node's own
    mixture, scored as a whole."""

    @field_validator("sources")
    @classmethod
    def _usable_sources(cls, sources: list[str] | None) -> list[str] | None:
        if sources is None:
            return None
        if not sources:
            raise ValueError("sources needs at least one task source (or leave it unset)")
        if len(set(sources)) != len(sources):
            raise ValueError("sources must be unique")
        for source in sources:
            check_task_source(source)
        return sources

    @model_validator(mode="after")
    def _used(self) -> EvalConfig:
        if self.every == 0:
            refuse_idle(
                self, ("num_tasks", "max_new_tokens", "seed", "samples", "sources"), "every > 0"
            )
        return self
