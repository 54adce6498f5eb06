"""What the round loop needs from a policy: the `Learner` protocol and its data types.

Invariant: the round loop talks to models only through this protocol, so simnet can
swap in a stub learner (no torch) for protocol-scale runs. Implementations are
synchronous and may be slow; the node runs them off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from swarm.messages import DeltaPacket, RolloutGroup, TaskRef
from swarm.token_arrays import MAX_LOGPROB_TOKENS


@dataclass(frozen=True)
class LocalGroup:
    """A group this node sampled: text for the wire, tokens and logprobs for training."""

    ref: TaskRef
    prompt: str
    completions: tuple[str, ...]
    rewards: tuple[float, ...]
    token_ids: tuple[tuple[int, ...], ...] | None = None
    sampler_logprobs: tuple[tuple[float, ...], ...] | None = None
    finished: tuple[bool, ...] = ()
    """Per completion: ended with a stop token (EOS). Empty: unknown (all False)."""

    def to_wire(self, model_id: str, policy_version: int, model_family: str = "") -> RolloutGroup:
        """The group for the wire; with `model_family`, its sampler logprobs and token ids
        too (each left out if any completion has more than the wire's
        `MAX_LOGPROB_TOKENS`; the ids also where they do not line up with the logprobs,
        which the wire refuses)."""
        lps = self.sampler_logprobs or ()
        if not model_family or any(len(lp) > MAX_LOGPROB_TOKENS for lp in lps):
            lps = ()
        ids = self.token_ids or ()
        if (
            not model_family
            or len(ids) != len(self.completions)
            or any(len(t) > MAX_LOGPROB_TOKENS for t in ids)
            or (lps and any(len(t) != len(lp) for t, lp in zip(ids, lps, strict=True)))
        ):
            ids = ()
        return RolloutGroup(
            task=self.ref,
            prompt=self.prompt,
            completions=self.completions,
            rewards=self.rewards,
            model_id=model_id,
            policy_version=policy_version,
            finished=self.finished,
            model_family=model_family,
            logprobs=lps,
            token_ids=ids,
        )


@dataclass(frozen=True)
class ExternalGroup:
    """A peer's group, re-scored locally (its advisory rewards are not used)."""

    sender: str
    prompt: str
    completions: tuple[str, ...]
    rewards: tuple[float, ...]
    finished: tuple[bool, ...] = ()
    """The sender's EOS bit per completion (the local EOS is appended where set)."""
    source: str | None = None
    """The task's source (the prompt renderer's few-shot examples are of that source)."""
    model_family: str = ""
    """The sender's model family as it claims it on the wire ("" if not given)."""
    sampler_logprobs: tuple[tuple[float, ...], ...] = ()
    """The sender's sampler logprobs per completion (empty: not carried); comparable with
    ours only where `model_family` is ours."""
    token_ids: tuple[tuple[int, ...], ...] = ()
    """The token ids the sender sampled per completion (empty: not carried); meaningful
    only where `model_family` is ours."""

    @classmethod
    def of(cls, sender: str, group: RolloutGroup, rewards: tuple[float, ...]) -> ExternalGroup:
        """A pool entry's group with the rewards we computed for it."""
        return cls(
            sender,
            group.prompt,
            group.completions,
            rewards,
            group.finished,
            group.task.source,
            group.model_family,
            group.logprobs,
            group.token_ids,
        )


@dataclass
class SampleResult:
    groups: list[LocalGroup]
    sample_s: float
    score_s: float
    policy_version: int | None = None
    """The version of the weights that sampled the groups (None: the learner's current
    one; differs when sampling overlaps training)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Task references left out by reason (their item was not built in time, or its
    generator raised: `rewards.registry.build_tasks`)."""


@dataclass
class TrainResult:
    stats: dict[str, Any] = field(default_factory=dict)
    train_s: float = 0.0


@dataclass
class EvalResult:
    """Greedy (or sampled, `eval.samples`) decoding on held-out tasks."""

    accuracy: float
    """Mean correctness (no format reward) in [0, 1]."""
    n: int
    seconds: float = 0.0
    finished: float = 0.0
    """Share of answers that ended with EOS within the budget."""
    answers: tuple[str | None, ...] = ()
    """The answer each scored completion gives (`rewards.registry.extract_answer`; None:
    none), in order; empty where a learner does not report them."""
    golds: tuple[str, ...] = ()
    """Each held-out task's gold answer, in order (empty where not reported)."""
    constant: tuple[str | None, float] | None = None
    """What one answer given to every task scores (`rewards.registry.best_constant`: the
    best of the tasks' gold answers under the node's correctness, partial credit
    included; pooled over sets: each set's own, weighted by its size, answer None); None
    where not computed."""
    skipped: int = 0
    """Held-out tasks left out of this evaluation because their item was not built
    (`rewards.registry.build_tasks`)."""


class Learner(Protocol):
    sample_overlap: bool
    """True: `sample` may run in a thread while `train` runs in another (the node then
    samples each round ahead, `node.own_samples`)."""

    model_id: str
    model_family: str

    @property
    def policy_version(self) -> int: ...

    def sample(self, refs: list[TaskRef], seed: int) -> SampleResult: ...

    def train(self, local: list[LocalGroup], external: list[ExternalGroup]) -> TrainResult: ...

    def evaluate(self, refs: list[TaskRef], max_new_tokens: int, samples: int = 0) -> EvalResult:
        """Greedy accuracy on `refs` (`samples` = 0), or the mean correctness of `samples`
        sampled completions per task from a fixed seed (no training, no shared RNG drawn)."""
        ...

    def receive_delta(
        self, sender: str, sender_version: int, packet: DeltaPacket, arrival_round: int
    ) -> None:
        """Hold a peer's delta for the next merge, or raise node.rescore.Refused."""
        ...

    def share_deltas(self, own_round: int) -> tuple[DeltaPacket | None, dict[str, Any] | None]:
        """Every K steps: our packet to publish and the merge stats; (None, None) if not due."""
        ...

    def save(self, directory: Path, manifest: dict[str, Any]) -> None:
        """Write an atomic checkpoint directory holding the learner state and `manifest`."""
        ...

    def capture(self, directory: Path, manifest: dict[str, Any]) -> Callable[[], None]:
        """Copy the learner state now; the returned function writes it as `save` would
        (it may run in another thread while the learner trains on)."""
        ...

    def load(self, directory: Path) -> dict[str, Any]:
        """Restore from a checkpoint directory; return its manifest."""
        ...
