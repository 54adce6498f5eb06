"""Rewards: answer extraction, correctness by name, optional format reward, time limits.

`score(task, completion, config) = correctness + config.format_weight * format`, where
- the answer is `extract_answer(completion)`: the content of the last complete
  `<answer>...</answer>` pair if the completion has one (stripped; an empty block is the
  answer "", which some tasks expect), else its stripped first line, `None` when that is
  empty (no answer: scores 0);
- correctness is the registry entry `config.correctness` (see `CORRECTNESS`), in [0, 1];
- format (`format_reward`) is 1.0 only for a well-formed answer in the configured
  `answer_format`: `answer_block` needs a complete block whose stripped content fully
  matches the source's `answer_pattern`; `first_line` needs the bare first line to match
  it (no block). A source whose question asks for the block (`needs_answer_block`,
  reasoning-gym) always needs it. `auto` must be resolved by the caller
  (`resolve_answer_format`); unresolved it means `first_line`.

Invariants:
- Pure: a function of (task, completion, config) only; the task is regenerated from its
  reference by the caller, never taken from a peer.
- A correctness function marked slow (reasoning-gym's scorers, anything that runs code)
  runs under `config.timeout_s`; past it, it scores 0 and is counted in
  `reward_counters()["timeouts"]`. A scorer that raises scores 0 and is counted in
  `["errors"]`. Neither ever raises into the caller.
- No reward runs forever. In the default `process` mode a slow reward runs in a killable
  worker process (`rewards.sandbox.Sandbox`, one per process, started on first use) that
  is killed at the limit; so a slow correctness function must be picklable by reference
  (a module-level function: `register_correctness` checks). In `thread` mode (set inside
  worker processes, `set_time_limit_mode`) it runs in a daemon thread that is abandoned at
  the limit and counted in `live_reward_threads()` until it ends; the worker's owner
  retires a worker whose job left one running (`rewards.sandbox`), so the thread dies
  with it.
- A slow scorer's limit times the scorer alone: in process mode `score_group` first has
  the worker build the group's item (`_build`, what a reasoning-gym scorer would do
  on its first call there), under the group's limit `rescore_timeout_s`; an item that
  cannot be built within it scores 0 for every completion, counted as timeouts (under
  load, puzzle24's build alone outran the 2 s `timeout_s` and a correct answer scored 0).
- Returned scores are finite floats.
- A node's own tasks are built under a limit too (`build_tasks`): a slow source's item is
  built in the scoring worker under `rescore_timeout_s` (where the scorer will find it
  cached) and its task sent back; an item that is not built within it, or whose build
  raises, is left out and counted by reason (`task_build_timeout`, `task_build_error`),
  never raised into the caller. A fast source's task is built in this process.
"""

from __future__ import annotations

import atexit
import logging
import math
import pickle
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from rewards.sandbox import JobTimeout, Sandbox
from rewards.tasks import Task, TaskSource, answer_matches_format, get_source, make_task
from swarm.config.tasks import RewardsConfig
from swarm.messages import TaskRef

log = logging.getLogger(__name__)

_OPEN, _CLOSE = "<answer>", "</answer>"


def extract_answer(completion: str) -> str | None:
    """The answer a completion gives (see the module docstring), or None."""
    tagged = _last_tagged(completion)
    if tagged is not None:
        return tagged.strip()
    return completion.split("\n", 1)[0].strip() or None


def answer_block(completion: str) -> str | None:
    """The stripped content of the last complete answer block, or None."""
    tagged = _last_tagged(completion)
    return tagged.strip() if tagged is not None else None


def canonical_completion(completion: str) -> str:
    """The part of `completion` that `score` reads, whatever the config: with a complete
    answer block, the text up to the end of the last one; without, the first line; either
    stripped. `score(task, canonical_completion(c), config) == score(task, c, config)` for
    every task, completion and config (correctness reads `extract_answer`, format reads
    the same block or first line), so a receiver can train a peer's completion in this
    form without changing its reward, and a peer cannot teach what the reward ignores
    (trailing whitespace, lines after the answer: the `signal_bait` attacks)."""
    span = _last_tagged_span(completion)
    if span is not None:
        return completion[: span[1] + len(_CLOSE)].strip()
    return completion.split("\n", 1)[0].strip()


def resolve_answer_format(config: RewardsConfig, chat: bool) -> RewardsConfig:
    """`config` with `answer_format = auto` resolved for a node whose prompts use a chat
    template (`chat`) or not."""
    if config.answer_format != "auto":
        return config
    return config.model_copy(update={"answer_format": "answer_block" if chat else "first_line"})


def _last_tagged(text: str) -> str | None:
    """The last `<answer>...</answer>` match as `re.findall` would find it, in linear time
    (the regular expression is quadratic on a peer's `<answer>` repeated 8,000 times)."""
    span = _last_tagged_span(text)
    return text[span[0] : span[1]] if span is not None else None


def _last_tagged_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the last answer block's content, or None (see `_last_tagged`)."""
    last = None
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            return last
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            return last  # no later opening tag can close either
        last = (start + len(_OPEN), end)
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
    """Add a correctness reward; names are unique. One that may be slow (`slow` True or
    None) runs in a worker process, so it must be a module-level function; register it in
    a module the workers import (`rewards.sandbox`) if peers' groups are scored with it."""
    if name in CORRECTNESS:
        raise ValueError(f"correctness reward {name!r} is already registered")
    if slow is not False:
        try:
            pickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 - any pickling failure
            raise ValueError(
                f"correctness reward {name!r} may be slow, so it runs in a worker process "
                f"and must be a module-level function (picklable by reference): {exc}"
            ) from None
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


TimeLimitMode = Literal["process", "thread"]
_mode: TimeLimitMode = "process"
_abandoned: list[threading.Thread] = []
_sandbox_lock = threading.Lock()
_sandbox: Sandbox | None = None


def set_time_limit_mode(mode: TimeLimitMode) -> None:
    """How slow rewards are limited in this process (see the module docstring)."""
    global _mode
    if mode not in ("process", "thread"):
        raise ValueError(f"time limit mode must be 'process' or 'thread', got {mode!r}")
    _mode = mode


def live_reward_threads() -> int:
    """Reward threads abandoned at their time limit (thread mode) that still run."""
    with _counters_lock:
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        return len(_abandoned)


def _get_sandbox() -> Sandbox:
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            _sandbox = Sandbox()
            atexit.register(_sandbox.close)
        return _sandbox


def _failed(exc: BaseException) -> float:
    _count("errors")
    log.warning("reward function raised %r; scoring 0", exc)
    return 0.0


def _timed_out(timeout_s: float) -> float:
    _count("timeouts")
    log.warning("reward function exceeded %.3gs; scoring 0", timeout_s)
    return 0.0


def _run(
    reward: Correctness, source: TaskSource, task: Task, answer: str, timeout_s: float | None
) -> float:
    """`reward.fn(source, task, answer)` inline, or under `timeout_s` in the sandbox
    (process mode) or a daemon thread (thread mode); 0.0 on error or timeout."""
    if timeout_s is None:
        try:
            return reward.fn(source, task, answer)
        except Exception as exc:  # noqa: BLE001 - a scorer bug scores 0
            return _failed(exc)
    if _mode == "process":
        try:
            return _get_sandbox().call(reward.fn, (source, task, answer), timeout_s)
        except JobTimeout:
            return _timed_out(timeout_s)
        except Exception as exc:  # noqa: BLE001 - the scorer's error, or its worker died
            return _failed(exc)
    box: list[float] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            box.append(reward.fn(source, task, answer))
        except Exception as exc:  # noqa: BLE001 — reported below, in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=target, name="reward", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        with _counters_lock:
            _abandoned.append(worker)
        return _timed_out(timeout_s)
    if failed:
        return _failed(failed[0])
    return box[0]


def _is_slow(reward: Correctness, source: TaskSource) -> bool:
    """Whether `reward` on `source` runs under the time limit (see `Correctness.slow`)."""
    return bool(source.slow_scoring if reward.slow is None else reward.slow)


def correctness(task: Task, completion: str, config: RewardsConfig) -> float:
    """The correctness part of `score`, in [0, 1]."""
    reward = get_correctness(config.correctness)
    source = get_source(task.ref.source)
    answer = extract_answer(completion)
    _count("calls")
    if answer is None:
        return 0.0
    value = _run(
        reward, source, task, answer, config.timeout_s if _is_slow(reward, source) else None
    )
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


def format_reward(task: Task, completion: str, answer_format: str = "first_line") -> float:
    """1.0 for a well-formed answer in `answer_format` (see the module docstring)."""
    source = get_source(task.ref.source)
    if answer_format == "answer_block" or source.needs_answer_block:
        answer = answer_block(completion)
    elif _last_tagged(completion) is not None:
        return 0.0  # first_line asks for a bare answer
    else:
        answer = extract_answer(completion)
    return 1.0 if answer_matches_format(source, answer) else 0.0


def score(task: Task, completion: str, config: RewardsConfig) -> float:
    """Correctness plus the weighted format reward (see the module docstring)."""
    value = correctness(task, completion, config)
    if config.format_weight > 0:
        value += config.format_weight * format_reward(task, completion, config.answer_format)
    return value


def _build(source: TaskSource, ref: TaskRef) -> Task:
    """`ref`'s task, built in this process (the scoring worker): for `build_tasks`, and
    so that the item is cached there before a scorer that regenerates it runs under its
    own limit (`_built_in_worker`)."""
    return source.make(ref.seed, ref.index)


def _built_in_worker(task: Task, config: RewardsConfig) -> bool:
    """False if the item could not be built in the scoring worker within the group's
    limit (see the module docstring); True otherwise, and where nothing needs it."""
    reward = get_correctness(config.correctness)
    source = get_source(task.ref.source)
    if not _is_slow(reward, source) or _mode != "process":
        return True
    try:
        _get_sandbox().call(_build, (source, task.ref), config.rescore_timeout_s)
    except JobTimeout:
        log.warning("building %s took over %.3gs; scoring 0", task.ref, config.rescore_timeout_s)
        return False
    except Exception as exc:  # noqa: BLE001 - the scorer's own call meets it again and counts it
        log.warning("building %s in the scoring worker raised %r", task.ref, exc)
    return True


def build_tasks(refs: Sequence[TaskRef], config: RewardsConfig) -> tuple[list[Task], Counter[str]]:
    """The tasks of `refs` that could be built (in order), and how many were left out by
    reason (see the module docstring)."""
    tasks: list[Task] = []
    skipped: Counter[str] = Counter()
    for ref in refs:
        try:
            source = get_source(ref.source)
            if source.slow_scoring and _mode == "process":
                task = _get_sandbox().call(_build, (source, ref), config.rescore_timeout_s)
            else:
                task = make_task(ref)
        except JobTimeout:
            log.warning("building %s took over %.3gs; left out", ref, config.rescore_timeout_s)
            skipped["task_build_timeout"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - a generator's failure loses one task, not the round
            log.warning("building %s raised %r; left out", ref, exc)
            skipped["task_build_error"] += 1
            continue
        tasks.append(task)
    return tasks, skipped


CONSTANT_CANDIDATES = 64
"""`best_constant` tries at most this many distinct gold answers (the most common first)."""


def _mean_scores(
    fn: CorrectnessFn, sources: list[TaskSource], tasks: list[Task], candidates: list[str]
) -> list[float]:
    """Each candidate answer's mean correctness over `tasks` (a scorer that raises or
    returns a non-number scores 0, as in `correctness`)."""
    means = []
    for answer in candidates:
        total = 0.0
        for source, task in zip(sources, tasks, strict=True):
            try:
                value = float(fn(source, task, answer))
            except Exception:  # noqa: BLE001 - counted as 0, as correctness does
                value = 0.0
            total += value if math.isfinite(value) else 0.0
        means.append(total / len(tasks))
    return means


def best_constant(tasks: Sequence[Task], config: RewardsConfig) -> tuple[str, float] | None:
    """The one answer that, given to every task, scores best under the configured
    correctness, among the tasks' own gold answers (the most common first on ties), and its
    mean score; None when there are no tasks or the scoring ran out of time.

    Under an exact-match scorer this is the share of the most common gold answer. Under
    partial credit it can be far above it: under a letters-in-place score one task's reversed
    word collects credit on the tasks whose answer it is not. A slow correctness runs as one
    job in the scoring worker, limited to `timeout_s` per task."""
    if not tasks:
        return None
    reward = get_correctness(config.correctness)
    sources = [get_source(t.ref.source) for t in tasks]
    golds = Counter(t.answer.strip() for t in tasks)
    candidates = [answer for answer, _ in golds.most_common(CONSTANT_CANDIDATES)]
    args = (reward.fn, sources, list(tasks), candidates)
    if _mode == "process" and any(_is_slow(reward, s) for s in sources):
        try:
            means = _get_sandbox().call(_mean_scores, args, config.timeout_s * len(tasks))
        except Exception as exc:  # noqa: BLE001 - an unknown baseline, not a failed evaluation
            log.warning("scoring constant answers failed: %r", exc)
            return None
    else:
        means = _mean_scores(*args)
    best = max(range(len(candidates)), key=lambda i: (means[i], -i))
    return candidates[best], means[best]


def score_group(task: Task, completions: list[str], config: RewardsConfig) -> list[float]:
    """`score` for each completion of one group (its item built first: see the module
    docstring)."""
    if completions and not _built_in_worker(task, config):
        for _ in completions:
            _count("calls")
            _count("timeouts")
        return [0.0] * len(completions)
    return [score(task, c, config) for c in completions]
