"""Task sources: a task reference (source, seed, index) -> the same question and ground
truth on every machine.

Invariants:
- `make_task(ref)` is a pure function of `ref`: no global RNG, no clock, no network, no
  file. Built-in generators seed a private `random.Random` with a string built from
  (source, seed, index) (CPython's string seeding is sha512-based and stable across
  platforms and versions); reasoning-gym datasets are procedural and need no download.
- A reference a peer sent is untrusted: an unknown source raises `KeyError`, a negative
  or out-of-range seed/index (above the source's `max_index`) raises `ValueError`, before
  anything is generated.
- Only sources the measured table `swarm.config.task_sources` allows are served: a
  refused reasoning-gym dataset raises `UnusableSource` (a `KeyError` with a `reason`,
  `nondeterministic_task` when our own generator could disagree with an honest peer's).
- Built-in tasks are small enough for a ~1M-parameter character-level model to learn
  from scratch on a CPU: prompts and answers use only lowercase letters, digits,
  `+ = < > ?` and spaces, and answers have no newline.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, runtime_checkable

from swarm.messages import TaskRef

MAX_SEED = 2**63 - 1
"""Largest seed or index a reference may carry (the wire's int bound)."""

RG_PREFIX = "rg:"
"""Sources named `rg:<dataset>` are reasoning-gym datasets."""


@dataclass(frozen=True)
class Task:
    """One verifiable problem, regenerated locally from its reference."""

    ref: TaskRef
    prompt: str
    answer: str


class UnusableSource(KeyError):
    """A task source this node refuses to run; `reason` is a refusal reason for a peer's
    group (`unknown_task`, or `nondeterministic_task` when the fault is our generator's)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message


@runtime_checkable
class TaskSource(Protocol):
    """A deterministic generator of tasks.

    `answer_pattern` is a regular expression a well-formed answer fully matches (used by
    the optional format reward); `needs_answer_block` says the question itself asks for
    the `<answer>` block, so the format reward requires it in every mode.
    `score_answer(task, answer)` is the source's own correctness in [0, 1] for an already
    extracted answer; `slow_scoring` says whether it may run long and so needs a time
    limit. `max_index` is the largest index `make`
    accepts (task streams wrap to a new derived seed beyond it).
    """

    name: str
    answer_pattern: str
    needs_answer_block: bool
    slow_scoring: bool
    max_index: int

    def make(self, seed: int, index: int) -> Task: ...

    def score_answer(self, task: Task, answer: str) -> float: ...


def _check_range(seed: int, index: int, max_index: int = MAX_SEED) -> None:
    for label, value, hi in (("seed", seed, MAX_SEED), ("index", index, max_index)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
            raise ValueError(f"task {label} must be an int in [0, {hi}], got {value!r}")


class BuiltinSource:
    """A built-in generator: `generate(rng) -> (prompt, answer)` over a private RNG."""

    slow_scoring = False
    needs_answer_block = False
    max_index = MAX_SEED

    def __init__(
        self, name: str, generate: Callable[[random.Random], tuple[str, str]], answer_pattern: str
    ) -> None:
        self.name = name
        self.answer_pattern = answer_pattern
        self._generate = generate

    def make(self, seed: int, index: int) -> Task:
        _check_range(seed, index)
        rng = random.Random(f"swarm-task:{self.name}:{seed}:{index}")
        prompt, answer = self._generate(rng)
        return Task(TaskRef(self.name, seed, index), prompt, answer)

    def score_answer(self, task: Task, answer: str) -> float:
        return 1.0 if answer.strip() == task.answer else 0.0

    def __repr__(self) -> str:
        return f"BuiltinSource({self.name!r})"


LETTERS = "abcde"
"""Alphabet of the copy/reverse tasks (small, so a tiny model sees every letter often)."""


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    return f"{a}+{b}=", str(a + b)


def _word(rng: random.Random, lo: int = 1, hi: int = 3) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(lo, hi)))


def _copy(rng: random.Random) -> tuple[str, str]:
    word = _word(rng)
    return f"copy {word}=", word


def _reverse(rng: random.Random) -> tuple[str, str]:
    word = _word(rng, 2, 3)
    return f"rev {word}=", word[::-1]


def _compare(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    return f"{a}?{b}=", "<" if a < b else (">" if a > b else "=")


def _digit(rng: random.Random) -> tuple[str, str]:
    d = rng.randrange(10)
    return f"{d}=", str(d)


BUILTIN_SOURCES: dict[str, BuiltinSource] = {
    s.name: s
    for s in (
        BuiltinSource("add", _add, r"\d{1,2}"),
        BuiltinSource("copy", _copy, rf"[{LETTERS}]{{1,3}}"),
        BuiltinSource("reverse", _reverse, rf"[{LETTERS}]{{2,3}}"),
        BuiltinSource("compare", _compare, r"[<>=]"),
        BuiltinSource("digit", _digit, r"\d"),
    )
}
"""Built-in generators: `add` ("3+4=" -> "7"), `copy` ("copy abc=" -> "abc"),
`reverse` ("rev abc=" -> "cba"), `compare` ("3?7=" -> "<"), `digit` ("3=" -> "3")."""


def known_sources() -> list[str]:
    """Names `get_source` accepts (usable reasoning-gym datasets as `rg:<name>`)."""
    from rewards import rg  # local: keeps reasoning-gym off the import path of built-ins

    return sorted(BUILTIN_SOURCES) + [RG_PREFIX + n for n in rg.usable_dataset_names()]


def get_source(name: str) -> TaskSource:
    """The source called `name`; `KeyError` listing the known names otherwise
    (`UnusableSource` for a reasoning-gym dataset the measured table refuses)."""
    if not isinstance(name, str):
        raise KeyError(f"task source name must be a string, got {type(name).__name__}")
    if name in BUILTIN_SOURCES:
        return BUILTIN_SOURCES[name]
    if name.startswith(RG_PREFIX):
        from rewards import rg

        return rg.get_rg_source(name[len(RG_PREFIX) :])
    raise KeyError(
        f"unknown task source {name!r}; built-in: {', '.join(sorted(BUILTIN_SOURCES))}; "
        f"or 'rg:<dataset>' for a reasoning-gym dataset (see rewards.tasks.known_sources())"
    )


def make_task(ref: TaskRef) -> Task:
    """Regenerate a task from its reference (KeyError: unknown source; ValueError: range)."""
    return get_source(ref.source).make(ref.seed, ref.index)


def answer_matches_format(source: TaskSource, answer: str | None) -> bool:
    """Whether an extracted answer fully matches the source's answer pattern."""
    return answer is not None and re.fullmatch(source.answer_pattern, answer) is not None


EXAMPLE_SEED = 0x5EED_E8A3_91E5
"""The task seed of solved examples shown in prompts (`solved_examples`): a fixed seed
that no node's task stream draws (those are 63-bit hashes)."""

MAX_EXAMPLES = 8


@lru_cache(maxsize=256)
def _examples(source: str) -> tuple[tuple[str, str], ...]:
    src = get_source(source)
    tasks = (src.make(EXAMPLE_SEED, i) for i in range(min(MAX_EXAMPLES, src.max_index + 1)))
    return tuple((t.prompt, t.answer) for t in tasks if _is_solution(src, t))


def _is_solution(source: TaskSource, task: Task) -> bool:
    """Whether the task's answer is one its own scorer accepts in full: some
    reasoning-gym datasets have no single gold answer (`None`, which scores 0), and an
    example showing `<answer>None</answer>` would teach an answer that scores 0."""
    try:
        return float(source.score_answer(task, task.answer)) >= 1.0
    except Exception:  # noqa: BLE001 - a dataset's scorer failing on its own answer
        return False


def solved_examples(source: str) -> list[tuple[str, str]]:
    """Up to `MAX_EXAMPLES` (question, answer) pairs of `source` whose answer its own
    scorer accepts in full (possibly none), the same everywhere."""
    return list(_examples(source))
