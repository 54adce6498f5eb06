"""Test-only task sources and rewards that never return, crash or report where they run.

Registered on import, so a worker process that imports this module (`preload=` of
`node.workers.RescoreWorkers`, `rewards.sandbox.Sandbox`) knows them too; everything is
module-level so that it pickles by reference.
"""

from __future__ import annotations

import os
import random
import threading
import time
from functools import lru_cache

from rewards.tasks import BUILTIN_SOURCES, BuiltinSource, Task, TaskSource
from swarm.messages import TaskRef

MODULE = __name__
HANG = "test-hang"
"""A source whose generator loops forever (pure Python, holding the GIL between ticks)."""
CRASH = "test-crash"
"""A source whose generator kills its process (as a segfault or the OOM killer would)."""
RAISE = "test-raise"
"""A source whose generator raises."""

RELEASE = threading.Event()
"""Ends `hang_reward` in this process (never set in a worker, which is killed instead)."""


def _forever(rng: random.Random) -> tuple[str, str]:
    while True:
        time.sleep(0.01)


def _crash(rng: random.Random) -> tuple[str, str]:
    os._exit(3)


def _raise(rng: random.Random) -> tuple[str, str]:
    raise RuntimeError("a dataset bug")


for _name, _generate in ((HANG, _forever), (CRASH, _crash), (RAISE, _raise)):
    BUILTIN_SOURCES.setdefault(_name, BuiltinSource(_name, _generate, r".*"))


SLOW_BUILD = "test-slow-build"
"""A source whose item takes `BUILD_S` to build, once per process, and whose scorer
rebuilds it (as a reasoning-gym dataset does): a fast scorer behind a slow build."""
BUILD_S = 0.8


@lru_cache(maxsize=64)
def _slow_item(seed: int, index: int) -> tuple[str, str]:
    time.sleep(BUILD_S)
    return f"say {seed + index}", str(seed + index)


class SlowBuildSource:
    name = SLOW_BUILD
    answer_pattern = r".*"
    needs_answer_block = False
    slow_scoring = True
    max_index = 1000

    def make(self, seed: int, index: int) -> Task:
        prompt, answer = _slow_item(seed, index)
        return Task(TaskRef(SLOW_BUILD, seed, index), prompt, answer)

    def score_answer(self, task: Task, answer: str) -> float:
        return 1.0 if answer == _slow_item(task.ref.seed, task.ref.index)[1] else 0.0


BUILTIN_SOURCES.setdefault(SLOW_BUILD, SlowBuildSource())  # type: ignore[arg-type]

HANG_BUILD = "test-hang-build"
"""A source marked slow (as reasoning-gym's are) whose item never builds for an odd index
and whose build raises for an index that is a multiple of 10."""


class HangBuildSource(SlowBuildSource):
    name = HANG_BUILD

    def make(self, seed: int, index: int) -> Task:
        if index % 10 == 0:
            raise RuntimeError("a dataset bug")
        while index % 2:
            time.sleep(0.01)
        return Task(TaskRef(HANG_BUILD, seed, index), f"say {index}", str(index))

    def score_answer(self, task: Task, answer: str) -> float:
        return 1.0 if answer == self.make(task.ref.seed, task.ref.index).answer else 0.0


BUILTIN_SOURCES.setdefault(HANG_BUILD, HangBuildSource())  # type: ignore[arg-type]


def hang_reward(source: TaskSource, task: Task, answer: str) -> float:
    """A correctness reward that waits until `RELEASE` is set (forever in a worker)."""
    RELEASE.wait()
    return 1.0


def raising_reward(source: TaskSource, task: Task, answer: str) -> float:
    raise RuntimeError("scorer bug")


def where(source: TaskSource, task: Task, answer: str) -> float:
    """1.0 if this runs in an empty working directory other than the test's own."""
    return 1.0 if os.listdir(".") == [] and os.getcwd() != answer else 0.0
