"""Rewards: answer extraction, correctness by name, optional format reward, time limits.

`score(task, completion, config) = correctness + config.format_weight * format`, where
- the answer is `extract_answer(completion)`: the content of the last complete
  `<answer>...</answer>` pair if the completion has one, else its first line; stripped;
  `None` when empty (scores 0 and fails the format check);
- correctness is the registry entry `config.correctness` (see `CORRECTNESS`), in [0, 1];
- format is 1.0 when the extracted answer fully matches the source's `answer_pattern`.

Invariants:
- Pure: a function of (task, completion, config) only; the task is regenerated from its
  reference by the caller, never taken from a peer.
- A correctness function marked slow (reasoning-gym's scorers, anything that runs code)
  runs in a daemon thread and is abandoned after `config.timeout_s`: it then scores 0 and
  is counted in `reward_counters()["timeouts"]`. A scorer that raises scores 0 and is
  counted in `["errors"]`. Neither ever raises into the caller.
- Returned scores are finite floats.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rewards.tasks import Task, TaskSource, answer_matches_format, get_source
from swarm.config.learning import RewardsConfig

log = logging.getLogger(__name__)

_OPEN, _CLOSE = "<answer>", "</answer>"


def extract_answer(completion: str) -> str | None:
    """The answer a completion gives (see the module docstring), or None."""
    tagged = _last_tagged(completion)
    text = tagged if tagged is not None else completion.split("\n", 1)[0]
    text = text.strip()
    return text or None


def _last_tagged(text: str) -> str | None:
    """The last `<answer>...</answer>` match as `re.findall` would find it, in linear time
    (the regular expression is quadratic on a peer's `<answer>` repeated 8,000 times)."""
    last = None
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            return last
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            return last  # no later opening tag can close either
        last = text[start + len(_OPEN) : end]
        pos = end + len(_CLOSE)


CorrectnessFn = Callable[[TaskSource, Task, str], float]


@dataclass(frozen=True)
class Correctness:
    """A named correctness reward; `slow` ones run under the time limit."""

    fn: CorrectnessFn
    slow: bool | None
    """True/False, or None to follow the task source's `slow_scoring`."""
    doc: str


def _exact(source: TaskSource, task: Task, answer: str) -> float:
    return 1.0 if answer == task.answer.strip() else 0.0


def _numeric(source: TaskSource, task: Task, answer: str) -> float:
    try:
        got, want = float(answer.replace(",", "")), float(task.answer.replace(",", ""))
    except ValueError:
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9) else 0.0


def _closeness(source: TaskSource, task: Task, answer: str) -> float:
    try:
        got, want = float(answer.replace(",", "")), float(task.answer.replace(",", ""))
    except ValueError:
        return 0.0
    return 1.0 / (1.0 + abs(got - want)) if math.isfinite(got) else 0.0


def _source(source: TaskSource, task: Task, answer: str) -> float:
    return float(source.score_answer(task, answer))


CORRECTNESS: dict[str, Correctness] = {
    "exact": Correctness(_exact, False, "1 if the extracted answer equals the ground truth"),
    "numeric": Correctness(_numeric, False, "1 if both parse as equal numbers"),
    "closeness": Correctness(_closeness, False, "numeric partial credit 1 / (1 + |got - want|)"),
    "source": Correctness(_source, None, "the task source's own scorer (reasoning-gym's)"),
}
"""Correctness rewards by name (`RewardsConfig.correctness`)."""


def register_correctness(name: str, fn: CorrectnessFn, *, slow: bool | None, doc: str) -> None:
    """Add a correctness reward; names are unique."""
    if name in CORRECTNESS:
        raise ValueError(f"correctness reward {name!r} is already registered")
    CORRECTNESS[name] = Correctness(fn, slow, doc)


def get_correctness(name: str) -> Correctness:
    try:
        return CORRECTNESS[name]
    except KeyError:
        raise KeyError(
            f"unknown correctness reward {name!r}; known: {', '.join(sorted(CORRECTNESS))}"
        ) from None


_counters = {"calls": 0, "timeouts": 0, "errors": 0}
_counters_lock = threading.Lock()


def _count(key: str) -> None:
    with _counters_lock:
        _counters[key] += 1


def reward_counters() -> dict[str, int]:
    """Process-wide counts: correctness calls, timeouts and errors (for metrics)."""
    with _counters_lock:
        return dict(_counters)


def _run(fn: Callable[[], float], timeout_s: float | None) -> float:
    """`fn()` inline or, with a timeout, in a daemon thread; 0.0 on error or timeout."""
    if timeout_s is None:
        try:
            return fn()
        except Exception:
            _count("errors")
            log.warning("reward function raised; scoring 0", exc_info=True)
            return 0.0
    box: list[float] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except Exception as exc:  # noqa: BLE001 — reported below, in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=target, name="reward", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        _count("timeouts")
        log.warning("reward function exceeded %.3gs; scoring 0", timeout_s)
        return 0.0
    if failed:
        _count("errors")
        log.warning("reward function raised %r; scoring 0", failed[0])
        return 0.0
    return box[0]


def correctness(task: Task, completion: str, config: RewardsConfig) -> float:
    """The correctness part of `score`, in [0, 1]."""
    reward = get_correctness(config.correctness)
    source = get_source(task.ref.source)
    answer = extract_answer(completion)
    _count("calls")
    if answer is None:
        return 0.0
    slow = source.slow_scoring if reward.slow is None else reward.slow
    value = _run(lambda: reward.fn(source, task, answer), config.timeout_s if slow else None)
    return value if math.isfinite(value) else 0.0


def format_reward(task: Task, completion: str) -> float:
    """1.0 when the extracted answer fully matches the source's answer pattern."""
    source = get_source(task.ref.source)
    return 1.0 if answer_matches_format(source, extract_answer(completion)) else 0.0


def score(task: Task, completion: str, config: RewardsConfig) -> float:
    """Correctness plus the weighted format reward (see the module docstring)."""
    value = correctness(task, completion, config)
    if config.format_weight > 0:
        value += config.format_weight * format_reward(task, completion)
    return value


def score_group(task: Task, completions: list[str], config: RewardsConfig) -> list[float]:
    """`score` for each completion of one group."""
    return [score(task, c, config) for c in completions]
