"""A stub learner for protocol-scale runs: no torch, no model, a toy learning rule.

Invariants:
- Completions are real task answers or a wrong answer, so receivers re-score them from
  the task reference like any other group.
- Two learning rules (`StubSpec.rule` in scenarios):
  - `count` (the old rule, kept for the protocol benchmarks): a completion is correct
    with probability `skill`; every informative group trained (reward variance > 0,
    local or external) moves skill toward 1 by `rate * (1 - skill)`. Sharing then helps
    exactly by raising the number of informative groups: it holds by construction.
  - `competence`: each task has a difficulty `d` (`task_difficulty`, from a hash of its
    prompt: the same on every node); the node has a general skill `s` (a logit) and a
    per-task knowledge `k[t]`, and answers task t correctly with probability
    `sigmoid(s + k[t] - d)`. A trained group of task t carries `group_signal` (2 x the
    std of its 0/1 outcomes: 0 without variance, 1 at a pass rate of 1/2) and teaches
    the node `learning_gain` = signal x 4 p (1 - p), p the node's own probability on
    t: nothing on tasks it has mastered (p near 1) or that are far beyond it (p near 0).
    Per step the gains are summed and divided by n^`batch_exponent` (n the groups with
    a gain; 0: every group adds fully, as the `count` rule; 1: a step learns the mean,
    like a mean-normalised loss); `general_rate` of that goes to `s`, `task_rate` of each
    group's share to its task's `k[t]`. So peers' groups help only if they carry signal
    on tasks the node has not mastered, and stub results can come out either way.
- Deterministic for a seed; state is a few numbers and at most `MAX_TASKS_KNOWN` task
  knowledges (least recently trained forgotten first), checkpointed as JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from node.learner import EvalResult, ExternalGroup, LocalGroup, SampleResult, TrainResult
from node.rescore import Refused
from rewards.registry import score_group
from rewards.tasks import make_task
from simnet.scenario import StubSpec
from swarm.config import RewardsConfig
from swarm.messages import DeltaPacket, TaskRef

MAX_TASKS_KNOWN = 4096


@dataclass(frozen=True)
class Competence:
    """Parameters of the `competence` rule (see the module docstring)."""

    difficulty_mean: float = 0.0
    """Mean task difficulty (logits)."""
    difficulty_spread: float = 2.0
    """Difficulties are uniform in `difficulty_mean` +- this."""
    general_rate: float = 0.05
    """Share of a step's gain that goes to general skill (transfers to every task)."""
    task_rate: float = 0.5
    """Share of a group's gain that goes to its own task's knowledge."""
    batch_exponent: float = 0.5
    """A step's gains are divided by n ** batch_exponent (n: groups with a gain)."""


def competence_of(spec: StubSpec) -> Competence | None:
    """The `competence` rule's parameters from a scenario's stub spec (None: `count`)."""
    if spec.rule != "competence":
        return None
    return Competence(
        spec.difficulty_mean,
        spec.difficulty_spread,
        spec.general_rate,
        spec.task_rate,
        spec.batch_exponent,
    )


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def task_difficulty(prompt: str, mean: float, spread: float) -> float:
    """A task's difficulty: uniform in [mean - spread, mean + spread], from a hash of the
    prompt (the same on every node, independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
    unit = int.from_bytes(digest, "big") / 2**64
    return mean + spread * (2 * unit - 1)


def p_correct(skill: float, knowledge: float, difficulty: float) -> float:
    """Probability of a correct answer: sigmoid(skill + knowledge - difficulty)."""
    return sigmoid(skill + knowledge - difficulty)


def group_signal(outcomes: Sequence[float]) -> float:
    """2 x the std of a group's 0/1 outcomes (0: no variance, 1: half right)."""
    if len(outcomes) < 2 or max(outcomes) == min(outcomes):
        return 0.0
    q = sum(1.0 for o in outcomes if o >= max(outcomes)) / len(outcomes)
    return 2.0 * math.sqrt(q * (1.0 - q))


def learning_gain(p_own: float, signal: float) -> float:
    """What a group teaches: its signal times 4 p (1 - p) of the node's own p on its task."""
    return signal * 4.0 * p_own * (1.0 - p_own)


def step_update(gains: Sequence[float], batch_exponent: float) -> list[float]:
    """Each group's share of one step: gain / n ** batch_exponent (n: gains > 0)."""
    n = sum(1 for g in gains if g > 0)
    scale = 1.0 / n**batch_exponent if n else 0.0
    return [g * scale for g in gains]


class StubLearner:
    model_id = "stub"
    model_family = "stub"
    sample_overlap = False

    def __init__(
        self,
        group_size: int,
        rewards: RewardsConfig,
        skill: float = 0.1,
        rate: float = 0.02,
        *,
        competence: Competence | None = None,
    ) -> None:
        self.group_size = group_size
        self.rewards = rewards
        self.skill = skill
        """`count`: the probability of a correct answer. `competence`: the general skill
        logit (initially: a task of mean difficulty is solved with probability `skill`)."""
        self.rate = rate
        self.competence = competence
        if competence is not None:
            self.skill = logit(skill) + competence.difficulty_mean
        self.knowledge: OrderedDict[str, float] = OrderedDict()
        """`competence`: per-task knowledge logits, by prompt (bounded)."""
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def p_task(self, prompt: str) -> float:
        """Probability that this node answers the task `prompt` correctly."""
        if self.competence is None:
            return self.skill
        c = self.competence
        d = task_difficulty(prompt, c.difficulty_mean, c.difficulty_spread)
        return p_correct(self.skill, self.knowledge.get(prompt, 0.0), d)

    def sample(self, refs: list[TaskRef], seed: int) -> SampleResult:
        rng = random.Random(seed)
        groups = []
        for ref in refs:
            task = make_task(ref)
            p = self.p_task(task.prompt)
            completions = tuple(
                task.answer if rng.random() < p else f"{task.answer}x"
                for _ in range(self.group_size)
            )
            # Rewards are a pure function of (task, completion): score each distinct
            # completion (here at most two) once.
            distinct = sorted(set(completions))
            scores = dict(zip(distinct, score_group(task, distinct, self.rewards), strict=True))
            rewards = tuple(scores[c] for c in completions)
            # Each completion is a whole answer: it ended (trainable by a peer's `ended` rule).
            finished = (True,) * len(completions)
            groups.append(LocalGroup(ref, task.prompt, completions, rewards, finished=finished))
        return SampleResult(groups, 0.0, 0.0)

    def train(self, local: list[LocalGroup], external: list[ExternalGroup]) -> TrainResult:
        if self.competence is None:
            informative = sum(len(set(g.rewards)) > 1 for g in local) + len(external)
            for _ in range(informative):
                self.skill += self.rate * (1.0 - self.skill)
            stats = {"informative_groups": informative, "skill": round(self.skill, 6)}
        else:
            stats = self._train_competence(
                [(g.prompt, g.rewards) for g in local] + [(e.prompt, e.rewards) for e in external]
            )
        self._version += 1
        return TrainResult(stats, 0.0)

    def _train_competence(self, groups: list[tuple[str, tuple[float, ...]]]) -> dict[str, Any]:
        c = self.competence
        assert c is not None
        gains = [learning_gain(self.p_task(prompt), group_signal(r)) for prompt, r in groups]
        shares = step_update(gains, c.batch_exponent)
        for (prompt, _), share in zip(groups, shares, strict=True):
            if share > 0:
                self.knowledge[prompt] = self.knowledge.get(prompt, 0.0) + c.task_rate * share
                self.knowledge.move_to_end(prompt)
        self.skill += c.general_rate * sum(shares)
        while len(self.knowledge) > MAX_TASKS_KNOWN:
            self.knowledge.popitem(last=False)
        informative = sum(1 for _, r in groups if len(set(r)) > 1)
        return {
            "informative_groups": informative,
            "skill": round(self.skill, 6),
            "gain": round(sum(shares), 6),
        }

    def evaluate(self, refs: list[TaskRef], max_new_tokens: int, samples: int = 0) -> EvalResult:
        """The stub's greedy answer is right when its probability is above one half; sampled
        (`samples` > 0), its accuracy is the expected one, the mean probability."""
        if not refs:
            return EvalResult(accuracy=0.0, n=0)
        p = [self.p_task(make_task(ref).prompt) for ref in refs]
        right = sum(p) if samples else sum(x > 0.5 for x in p)
        return EvalResult(accuracy=right / len(refs), n=len(refs))

    def receive_delta(
        self, sender: str, sender_version: int, packet: DeltaPacket, arrival_round: int
    ) -> None:
        raise Refused("deltas_disabled")

    def share_deltas(self, own_round: int) -> tuple[DeltaPacket | None, dict[str, Any] | None]:
        return None, None

    def save(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.capture(directory, manifest)()

    def capture(self, directory: Path, manifest: dict[str, Any]) -> Callable[[], None]:
        state: dict[str, Any] = {"skill": self.skill, "version": self._version}
        if self.competence is not None:
            state["knowledge"] = list(self.knowledge.items())
            state["competence"] = asdict(self.competence)
        return functools.partial(self._write, directory, dict(manifest), state)

    @staticmethod
    def _write(directory: Path, manifest: dict[str, Any], state: dict[str, Any]) -> None:
        tmp = directory.parent / f".tmp-{directory.name}"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "stub.json").write_text(json.dumps(state))
        with (tmp / "manifest.json").open("w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(directory)

    def load(self, directory: Path) -> dict[str, Any]:
        state = json.loads((directory / "stub.json").read_text())
        self.skill = float(state["skill"])
        self._version = int(state["version"])
        self.knowledge = OrderedDict((str(k), float(v)) for k, v in state.get("knowledge", []))
        return json.loads((directory / "manifest.json").read_text())
