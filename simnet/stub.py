"""A stub learner for protocol-scale runs: no torch, no model, a toy learning rule.

Invariants:
- Completions are real task answers (correct with probability `skill`) or a wrong
  answer, so receivers re-score them from the task reference like any other group.
- Learning rule: every informative group trained (reward variance > 0, local or
  external) moves skill toward 1 by `rate * (1 - skill)`; so sharing helps exactly by
  raising the number of informative groups, which is the effect SAPO relies on.
- Deterministic for a seed; state is a few numbers (checkpointed as JSON).
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.learner import EvalResult, ExternalGroup, LocalGroup, SampleResult, TrainResult
from node.rescore import Refused
from rewards.registry import score_group
from rewards.tasks import make_task
from swarm.config import RewardsConfig
from swarm.messages import DeltaPacket, TaskRef


class StubLearner:
    model_id = "stub"
    model_family = "stub"
    sample_overlap = False

    def __init__(
        self, group_size: int, rewards: RewardsConfig, skill: float = 0.1, rate: float = 0.02
    ) -> None:
        self.group_size = group_size
        self.rewards = rewards
        self.skill = skill
        self.rate = rate
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def sample(self, refs: list[TaskRef], seed: int) -> SampleResult:
        rng = random.Random(seed)
        groups = []
        for ref in refs:
            task = make_task(ref)
            completions = tuple(
                task.answer if rng.random() < self.skill else f"{task.answer}x"
                for _ in range(self.group_size)
            )
            # Rewards are a pure function of (task, completion): score each distinct
            # completion (here at most two) once.
            distinct = sorted(set(completions))
            scores = dict(zip(distinct, score_group(task, distinct, self.rewards), strict=True))
            rewards = tuple(scores[c] for c in completions)
            groups.append(LocalGroup(ref, task.prompt, completions, rewards))
        return SampleResult(groups, 0.0, 0.0)

    def train(self, local: list[LocalGroup], external: list[ExternalGroup]) -> TrainResult:
        informative = sum(len(set(g.rewards)) > 1 for g in local) + len(external)
        for _ in range(informative):
            self.skill += self.rate * (1.0 - self.skill)
        self._version += 1
        return TrainResult({"informative_groups": informative, "skill": round(self.skill, 6)}, 0.0)

    def evaluate(self, refs: list[TaskRef], max_new_tokens: int) -> EvalResult:
        """The stub's greedy answer is right when its skill is above one half."""
        return EvalResult(accuracy=1.0 if self.skill > 0.5 else 0.0, n=len(refs))

    def receive_delta(
        self, sender: str, sender_version: int, packet: DeltaPacket, arrival_round: int
    ) -> None:
        raise Refused("deltas_disabled")

    def share_deltas(self, own_round: int) -> tuple[DeltaPacket | None, dict[str, Any] | None]:
        return None, None

    def save(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.capture(directory, manifest)()

    def capture(self, directory: Path, manifest: dict[str, Any]) -> Callable[[], None]:
        state = {"skill": self.skill, "version": self._version}
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
        return json.loads((directory / "manifest.json").read_text())
