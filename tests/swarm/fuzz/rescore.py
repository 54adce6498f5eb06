"""The rollout re-scoring target, in a child process killed when an input hangs.

Part of the fuzz harness; `tests/swarm/fuzz_wire.py` says what it checks and how it runs.
"""

from __future__ import annotations

import importlib
import logging
import math
import multiprocessing
import os
import random
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from functools import cache
from multiprocessing.connection import Connection
from typing import Any

import msgpack

from node.rescore import Refused
from swarm.codec import pack
from swarm.config import RewardsConfig
from swarm.messages import (
    MAX_TEXT_CHARS,
    RolloutGroup,
    TaskRef,
)
from tests.swarm.fuzz.harness import (
    ACCEPTED,
    HANG_KILL_S,
    HANGS_BEFORE_QUARANTINE,
    LONG_CHARS,
    RESCORE_DEFAULT_INPUTS,
    InvariantViolation,
    Outcome,
    RemoteCrash,
    Target,
    _signature,
)

# ---- rollout re-scoring (in a child process) --------------------------------------------

BUILTIN_SOURCES = ("add", "copy", "reverse", "compare", "digit")
WEIRD_SOURCES = (
    "", "rg:", "rg:nope", "RG:ab", "rg:ab ", " add", "add\x00", "Add", "rg:../ab",
    "rg:__init__", "rg:factory", "rg:AB", "rg:" + "a" * 253, "x" * 256, "😀", "rg:😀",
    "rg:rg:ab", "rg:ab\n",
)  # fmt: skip
KNOWN_BAD_RG: dict[str, str] = {
    "acre": "hang: the dataset builds all RG_SIZE (2**31-1) items eagerly",
    "gsm_symbolic": "hang: the dataset never returns with size RG_SIZE",
    "list_functions": "hang: the dataset never returns with size RG_SIZE",
    "futoshiki": "slow: generating some items takes 1-3 s of CPU (e.g. seed 897, index 0)",
    "knight_swap": "slow: generating some items takes 1-3 s of CPU (e.g. seed 0, index 867)",
    "intermediate_integration": "slow: some items take over 1 s of CPU",
    "arc_agi": "slow: building the dataset for a new seed takes 0.4-1.5 s of CPU",
    "number_sequence": "slow: seed 2**32, index 382 takes 11 s of CPU to generate",
    "sokoban": "slow: some items take over 1 s of CPU to generate",
}
"""reasoning-gym datasets whose crashes or slowness this harness found (reported); skipped
with `--skip-known` so that the rest of the target can still show 0 crashes."""
QUADRATIC_ANSWER = "<answer>" * 8192
"""A completion `rewards.registry.extract_answer` once took ~2 s of CPU on (its regex was
quadratic in unclosed `<answer>` tags; found by this harness, now linear)."""
TRUE_ANSWER = "\x00<true answer>\x00"
"""Placeholder in a completion, replaced by the regenerated ground truth in the child."""
REWARD_CONFIGS = (
    RewardsConfig(),
    RewardsConfig(correctness="exact"),
    RewardsConfig(correctness="numeric", format_weight=0.5),
    RewardsConfig(correctness="closeness", format_weight=1.0),
)
HOSTILE_COMPLETIONS = (
    "", "\n", "\x00", "<answer></answer>", "<answer> </answer>", "<answer>1</answer>",
    "</answer><answer>", "<answer><answer>1</answer></answer>", "nan", "inf", "-inf", "-0",
    "1e309", "0x10", "1_000", "1,000,000", "١٢٣", "½", "True", "None", "[1, 2]", '{"a": 1}',
    "__import__('os').system('true')", "lambda: 0", "((((((((((", "\\frac{1}{0}", "x**x**x**x",
    "9" * 4301, "1" + "0" * 400, "-" * 1000, "😀" * 100,
)  # fmt: skip
LONG_COMPLETIONS = (
    QUADRATIC_ANSWER, "</answer>" * 7281, "<answer>1</answer>" * 3855, "9" * MAX_TEXT_CHARS,
    "(" * MAX_TEXT_CHARS, "a\n" * 32768, "<answer>" + "1" * 65000 + "</answer>",
)  # fmt: skip


@cache
def rg_dataset_names() -> tuple[str, ...]:
    from rewards import rg

    return tuple(rg.dataset_names())


def _seed_or_index(rng: random.Random, rg_size: bool) -> int:
    r = rng.random()
    if r < 0.55:
        return rng.randrange(4)
    if r < 0.75:
        return rng.randrange(1000)
    if r < 0.85:
        edges = (2**31 - 2, 2**31 - 1, 2**31) if rg_size else (2**32, 2**53, 2**62)
        return rng.choice(edges)
    if r < 0.92:
        return rng.choice((2**63 - 1, rng.randrange(2**63)))
    return rng.choice((-1, -(2**63), 2**63, 2**64 - 1))  # beyond what the wire admits


def rescore_input(rng: random.Random, skip_known: bool = False) -> bytes:
    """[source, seed, index, prompt, completions, rewards, fix_prompt, config_index]."""
    r = rng.random()
    if r < 0.35:
        source = rng.choice(BUILTIN_SOURCES)
    elif r < 0.80:
        names = rg_dataset_names()
        if skip_known:
            names = tuple(n for n in names if n not in KNOWN_BAD_RG)
        source = "rg:" + rng.choice(names)
    else:
        source = rng.choice(WEIRD_SOURCES)
    is_rg = source.startswith("rg:")
    seed = _seed_or_index(rng, False)
    index = _seed_or_index(rng, is_rg)
    n = rng.choice((1, 2, 2, 4, 4, 8, 16))
    completions = []
    for _ in range(n):
        c = rng.random()
        if c < 0.3:
            completions.append(f"<answer>{TRUE_ANSWER}</answer>")
        elif c < 0.4:
            completions.append(TRUE_ANSWER)
        elif c < 0.5:
            tail = rng.choice(("x", " ", "0", "\n"))
            completions.append(f"<answer>{TRUE_ANSWER}{tail}</answer>")
        elif c < 0.9:
            completions.append(rng.choice(HOSTILE_COMPLETIONS))
        elif c < 0.985:
            completions.append(rng.randbytes(rng.randint(0, 64)).decode("latin-1"))
        else:
            long = rng.choice(LONG_COMPLETIONS)
            completions.append(long)
    rewards = [rng.choice((0.0, 1.0, rng.uniform(-1e9, 1e9))) for _ in completions]
    prompt = rng.choice(("", "3+4=", "x" * 1000))
    fix_prompt = rng.random() < 0.7
    config_index = 0 if rng.random() < 0.7 else rng.randrange(len(REWARD_CONFIGS))
    return pack([source, seed, index, prompt, completions, rewards, fix_prompt, config_index])


TASK_CPU_S: list[float] = [0.0]
"""CPU seconds the last `rescore_case` spent regenerating its task (read by
`rescore_details` in the child, so that a slow input names its slow phase)."""


def rescore_case(data: bytes) -> Outcome:
    """Run one rescore input (in the child process): regenerate the task (timed, and for
    the prompt and the true answers if asked), then rescore. Refused propagates; anything
    else is a crash."""
    from node.rescore import rescore_group
    from rewards.tasks import make_task

    source, seed, index, prompt, completions, rewards, fix_prompt, config_index = msgpack.unpackb(
        data, raw=False
    )
    ref = TaskRef(source, seed, index)
    answer = ""
    t0 = time.process_time()
    try:
        task = make_task(ref)  # rescore_group's own call then hits reasoning-gym's caches
    except Exception:  # noqa: BLE001 - rescore_group refuses these too (unknown_task, task_error)
        task = None
    finally:
        TASK_CPU_S[0] = time.process_time() - t0
    if fix_prompt and task is not None:
        prompt, answer = task.prompt, task.answer
    completions = tuple(c.replace(TRUE_ANSWER, answer) for c in completions)
    group = RolloutGroup(ref, prompt, completions, tuple(rewards), "m", 1)
    rescored = rescore_group(group, REWARD_CONFIGS[config_index])
    if len(rescored.rewards) != len(completions) or not all(
        math.isfinite(x) for x in rescored.rewards
    ):
        raise InvariantViolation("bad_rewards", f"{rescored.rewards}")
    if not math.isfinite(rescored.advisory_gap):
        raise InvariantViolation("bad_gap", f"{rescored.advisory_gap}")
    return ACCEPTED


def rescore_details() -> dict[str, float]:
    return {"task_s": TASK_CPU_S[0]}


def rescore_setup() -> None:
    """Child start-up: reasoning-gym imported before timing, a memory cap, quiet rewards."""
    import resource

    cap = 4 << 30
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    rg_dataset_names()
    # reward errors and timeouts are counted (reward_counters), not printed per input;
    # some reasoning-gym scorers print their own errors to stdout
    logging.getLogger("rewards.registry").setLevel(logging.ERROR)
    sys.stdout = open(os.devnull, "w")  # kept open for the child process's whole life


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class WorkerSpec:
    """What an isolated child runs, as importable `module:name` strings."""

    check: str
    """`(bytes) -> Outcome`, raising `refusal` to refuse."""
    refusal: str
    setup: str = ""
    """Called once at start-up, before the first input (untimed)."""
    details: str = ""
    """`() -> dict` sent back with each answer (per-input facts for the parent)."""


def _worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """Child loop: judge each input sent by the parent, answer with a dict."""
    from rewards.registry import reward_counters

    if spec.setup:
        _resolve(spec.setup)()
    check, refusal = _resolve(spec.check), _resolve(spec.refusal)
    details = _resolve(spec.details) if spec.details else dict
    threads = threading.active_count()
    conn.send({"status": "ready"})
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        before = reward_counters()
        t0 = time.process_time()  # all threads: reward threads run beside this one
        try:
            outcome = check(data)
            answer: dict[str, Any] = {
                "status": "ok", "accepted": outcome.accepted, "refused": outcome.refused,
            }  # fmt: skip
        except refusal as exc:
            answer = {"status": "refused", "reason": str(getattr(exc, "reason", exc))}
        except Exception as exc:  # noqa: BLE001 — sent to the parent, which counts a crash
            text = "".join(traceback.format_exception(exc))
            answer = {"status": "crash", "signature": _signature(exc), "text": text}
        answer["cpu_s"] = time.process_time() - t0
        after = reward_counters()
        answer["counts"] = {
            "reward errors (scored 0)": after["errors"] - before["errors"],
            "reward timeouts (scored 0)": after["timeouts"] - before["timeouts"],
            "leaked threads": max(0, threading.active_count() - threads),
        }
        answer["details"] = details()
        conn.send(answer)


class IsolatedRunner:
    """Runs a check in a spawned child that is killed when an input hangs."""

    def __init__(self, spec: WorkerSpec, *, kill_after_s: float = HANG_KILL_S) -> None:
        self.spec = spec
        self.kill_after_s = kill_after_s
        self.counts: Counter[str] = Counter()
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def running(self) -> bool:
        return self._process is not None

    def _start(self) -> Connection:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(
            target=_worker_main, args=(child, self.spec), daemon=True
        )
        self._process.start()
        child.close()
        if not parent.poll(300.0):
            self.close()
            raise RuntimeError("the isolated worker did not start")
        parent.recv()
        self._conn = parent
        self.counts["worker starts"] += 1
        return parent

    def call(self, data: bytes) -> dict[str, Any]:
        """The child's answer (`status` ok/refused/crash, `cpu_s`, `counts`, `details`);
        `InvariantViolation("hang")` when the child was silent for `kill_after_s` (it is
        then killed, and the next call starts a fresh one)."""
        conn = self._conn if self._conn is not None else self._start()
        conn.send_bytes(data)
        if not conn.poll(self.kill_after_s):
            self.close()
            raise InvariantViolation("hang", f"no answer in {self.kill_after_s} s; killed")
        try:
            answer: dict[str, Any] = conn.recv()
        except EOFError:
            code = self._process.exitcode if self._process is not None else None
            self.close()
            raise InvariantViolation("worker_died", f"exit code {code}") from None
        self.counts.update(answer["counts"])
        if answer["counts"]["leaked threads"]:
            self.close()  # abandoned reward threads would slow every later input
        return answer

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(10.0)
            self._process = None


class TimedRefused(Refused):
    """A refusal from the child, with the CPU seconds it took there."""

    def __init__(self, reason: str, cpu_s: float) -> None:
        super().__init__(reason)
        self.cpu_s = cpu_s


RESCORE_WORKER = WorkerSpec(
    check="tests.swarm.fuzz.rescore:rescore_case",
    refusal="node.rescore:Refused",
    setup="tests.swarm.fuzz.rescore:rescore_setup",
    details="tests.swarm.fuzz.rescore:rescore_details",
)


class RescoreTarget:
    """`rescore_case` through an `IsolatedRunner`, with per-input time limits."""

    def __init__(self, time_limit_s: float, kill_after_s: float) -> None:
        self.time_limit_s = time_limit_s
        self.runner = IsolatedRunner(RESCORE_WORKER, kill_after_s=kill_after_s)
        self.hangs: Counter[str] = Counter()

    def check(self, data: bytes) -> Outcome:
        case = msgpack.unpackb(data, raw=False)
        source, longest = case[0], max(map(len, case[4]))
        # a hang's likely cause: a long completion if there is one, else the task source
        suspect = f"a completion of over {LONG_CHARS} chars" if longest > LONG_CHARS else source
        if self.hangs[suspect] >= HANGS_BEFORE_QUARANTINE:
            raise InvariantViolation(
                f"hang with {suspect!r} (quarantined: not run)",
                f"{self.hangs[suspect]} earlier inputs with it hung",
            )
        try:
            answer = self.runner.call(data)
        except InvariantViolation as exc:
            self.hangs[suspect] += exc.kind == "hang"
            raise InvariantViolation(f"{exc.kind} with {suspect!r}", str(exc)) from None
        if answer["status"] == "crash":
            raise RemoteCrash(answer["signature"], answer["text"])
        cpu_s, task_s = answer["cpu_s"], answer["details"]["task_s"]
        if cpu_s > self.time_limit_s:
            # one root cause per signature: generating the task, or scoring (long text?)
            if task_s > cpu_s / 2:
                cause = f"task generation of {source!r}"
            elif longest > LONG_CHARS:
                cause = f"scoring a completion of {longest} chars"
            else:
                cause = f"scoring {source!r}"
            detail = f"rescore took {cpu_s:.3f} s of CPU ({task_s:.3f} s generating the task)"
            raise InvariantViolation(f"slow: {cause}", f"{detail} > {self.time_limit_s} s")
        if answer["status"] == "refused":
            raise TimedRefused(answer["reason"], cpu_s)
        return Outcome(answer["accepted"], answer["refused"], slowest_s=cpu_s)

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in self.runner.counts.items() if v}


def rescore_target(
    time_limit_s: float, skip_known: bool = False, kill_after_s: float = HANG_KILL_S
) -> Target:
    runner = RescoreTarget(time_limit_s, kill_after_s)
    skipped = f"skips rg:{', rg:'.join(sorted(KNOWN_BAD_RG))}"
    return Target(
        name="rollout_rescore",
        doc="node.rescore.rescore_group in a child process (killed on a hang)",
        generate=lambda rng: rescore_input(rng, skip_known),
        check=runner.check,
        refusal=Refused,
        time_limit_s=None,
        default_inputs=RESCORE_DEFAULT_INPUTS,
        note=skipped if skip_known else "",
        close=runner.runner.close,
        extra=runner.counts,
    )
