"""The harness: outcomes, targets, running a target over inputs, saving crashes.

Part of the fuzz harness; `tests/swarm/fuzz_wire.py` says what it checks and how it runs.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gossip.layer import WIRE_MARGIN, envelope_limits, payload_limits
from swarm.codec import Limits
from swarm.config.network import MemoryTransportConfig
from swarm.identity import Identity
from swarm.messages import (
    PAYLOAD_TYPES,
)

DEFAULT_INPUTS = 100_000
PROGRESS_EVERY_S = 10.0
MAX_SAVED_PER_TARGET = 50
MAX_INPUT_BYTES = 1 << 18
DEFAULT_TIME_LIMIT_S = 1.0
"""CPU seconds per input (per transport message for `gossip`; of the whole child process
for `rollout_rescore`): more counts as a `slow` crash. CPU time, not wall time, so that a
loaded machine does not report false slow inputs."""
HANG_KILL_S = 10.0
"""A rescore child silent for this long on one input is killed (`hang`)."""
IN_PROCESS_HANG_S = 60.0
"""Wall seconds after which the watchdog ends the run on a hung in-process input."""
HANGS_BEFORE_QUARANTINE = 3
"""After this many rescore hangs with one suspect (a task source, or any completion over
`LONG_CHARS`), later inputs with that suspect count as hangs without being run."""
LONG_CHARS = 4096
RESCORE_DEFAULT_INPUTS = 20_000
"""The rescore target's cap: reasoning-gym datasets cost ms to s per input."""

SWARM_ID = "fuzz-swarm"
FAMILY = "fam"
SIGNERS = tuple(Identity.from_seed(bytes([0x5A + i]) * 32) for i in range(3))
"""Identities that sign the corpus; an envelope from anyone else cannot verify."""
ATTACKERS = SIGNERS + tuple(Identity.from_seed(bytes([0x70 + i]) * 32) for i in range(17))
"""Peers in `gossip` sequences (enough of them to fill the reassembly bound)."""
ME = Identity.from_seed(b"\x01" * 32)
"""The `gossip` target's own node."""
BY_PEER = {identity.peer_id: identity for identity in (*ATTACKERS, ME)}

WIRE_MAX = MemoryTransportConfig().max_message_bytes + WIRE_MARGIN
ENVELOPE_LIMITS = envelope_limits(WIRE_MAX)
PAYLOAD_LIMITS = payload_limits(WIRE_MAX)
CORPUS_LIMITS = Limits(max_message_bytes=1 << 24, max_str_len=1 << 24, max_bin_len=1 << 24)
KINDS = tuple(sorted(PAYLOAD_TYPES))


# ---- outcomes and targets ---------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one input came to when no crash happened (sub-inputs for `gossip`)."""

    accepted: int = 1
    refused: int = 0
    reasons: Mapping[str, int] = field(default_factory=dict)
    slowest_s: float | None = None
    """CPU seconds of its slowest part, when not the whole check (a gossip message)."""


ACCEPTED = Outcome()


class InvariantViolation(AssertionError):
    """A target's own check failed; counted as a crash like an unexpected exception.

    `kind` is a short token for the crash signature; `done` counts the sub-inputs judged
    before the violation (messages earlier in a `gossip` sequence).
    """

    def __init__(self, kind: str, detail: str, done: Outcome | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.done = done if done is not None else Outcome(0, 0)


class RemoteCrash(Exception):
    """An exception other than the refusal type, raised in an isolated child process."""

    def __init__(self, signature: str, text: str) -> None:
        super().__init__(text)
        self.signature = signature


@dataclass
class Target:
    """One decoder under test: how to make an input, and how to judge it."""

    name: str
    doc: str
    generate: Callable[[random.Random], bytes]
    check: Callable[[bytes], Outcome]
    """Judge one input; raise `refusal` to refuse it, anything else is a crash."""
    refusal: type[Exception]
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S
    """Per-input limit measured by the harness; None when `check` measures its own."""
    default_inputs: int | None = None
    """A smaller count than `--inputs` for a slow target (stated in the table)."""
    note: str = ""
    close: Callable[[], None] = lambda: None
    extra: Callable[[], Mapping[str, int]] = dict
    """Target-specific counters for the summary (reward errors, worker restarts, ...)."""


@dataclass
class Stats:
    target: str
    accepted: int = 0
    refused: int = 0
    crashes: int = 0
    cases: int = 0
    seconds: float = 0.0
    slowest_s: float = 0.0
    reasons: Counter[str] = field(default_factory=Counter)
    signatures: Counter[str] = field(default_factory=Counter)
    first_crash: dict[str, str] = field(default_factory=dict)
    """Signature -> the traceback text of its first occurrence."""
    saved: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def inputs(self) -> int:
        return self.accepted + self.refused + self.crashes

    def describe_crashes(self) -> str:
        lines = [f"{self.target}: {self.crashes} crashes"]
        for signature, count in self.signatures.most_common():
            lines.append(f"--- {count} x {signature}\n{self.first_crash[signature]}")
        return "\n".join(lines)


def _signature(exc: BaseException) -> str:
    if isinstance(exc, InvariantViolation):
        return exc.kind
    if isinstance(exc, RemoteCrash):
        return exc.signature
    return _frame_signature(type(exc).__name__, traceback.extract_tb(exc.__traceback__))


def _frame_signature(name: str, frames: traceback.StackSummary) -> str:
    if not frames:
        return name
    last = frames[-1]
    return f"{name} at {Path(last.filename).name}:{last.lineno} ({last.name})"


def _save(out: Path, target: Target, seed: int, case: int, data: bytes, text: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{target.name}-s{seed}-{case:07d}"
    stem.with_suffix(".bin").write_bytes(data)
    replay = (
        f"replay: .venv/bin/python -m benchmarks.fuzz_wire --only {target.name} "
        f"--replay {stem.with_suffix('.bin')}\n"
    )
    header = f"target {target.name}, seed {seed}, case {case}, {len(data)} bytes\n{replay}\n"
    stem.with_suffix(".txt").write_text(header + text)
    return stem.with_suffix(".bin")


def judge(target: Target, data: bytes) -> tuple[Outcome | None, BaseException | None, float]:
    """Run one input: (outcome, None, CPU seconds) or (None, the crash, CPU seconds)."""
    t0 = time.thread_time()
    try:
        outcome = target.check(data)
    except target.refusal as exc:
        reason = str(getattr(exc, "reason", type(exc).__name__))
        outcome = Outcome(0, 1, {reason: 1}, getattr(exc, "cpu_s", None))
    except Exception as exc:  # noqa: BLE001 — the harness's job: any other exception is a crash
        return None, exc, time.thread_time() - t0
    elapsed = time.thread_time() - t0
    if target.time_limit_s is not None and elapsed > target.time_limit_s:
        slow = InvariantViolation("slow", f"input took {elapsed:.3f} s > {target.time_limit_s} s")
        return None, slow, elapsed
    return outcome, None, elapsed


class Watchdog:
    """Ends the process if one in-process input runs longer than `hang_s` of wall time.

    An in-process decoder cannot be interrupted, so a hang is fatal to the run; before
    exiting (status 3) the watchdog saves the input and prints every thread's stack.
    It runs in a thread, so a hang in C code that never releases the GIL goes unseen.
    """

    def __init__(self, target: Target, seed: int, out: Path | None, hang_s: float) -> None:
        self.target, self.seed, self.out, self.hang_s = target, seed, out, hang_s
        self.current: tuple[float, int, bytes] | None = None
        """(wall start, case, input) of the input being judged."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fuzz-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.hang_s / 4)):
            current = self.current
            if current is None or time.monotonic() - current[0] <= self.hang_s:
                continue
            _, case, data = current
            stacks = "".join(
                f"thread {ident}:\n" + "".join(traceback.format_stack(frame))
                for ident, frame in sys._current_frames().items()
            )
            text = f"hang: no result after {self.hang_s} s of wall time\n{stacks}"
            if self.out is not None:
                path = _save(self.out, self.target, self.seed, case, data, text)
                text += f"\ninput saved: {path}"
            print(f"[fuzz_wire] {self.target.name}: {text}", file=sys.stderr, flush=True)
            os._exit(3)


def run_target(
    target: Target,
    *,
    inputs: int,
    seed: int = 0,
    seconds: float | None = None,
    out: Path | None = None,
    progress: bool = False,
    hang_s: float = IN_PROCESS_HANG_S,
) -> Stats:
    """Feed `target` about `inputs` generated inputs (fewer if `seconds` runs out)."""
    with Watchdog(target, seed, out, hang_s) as watchdog:
        return _run(target, inputs, seed, seconds, out, progress, watchdog)


def _run(
    target: Target,
    inputs: int,
    seed: int,
    seconds: float | None,
    out: Path | None,
    progress: bool,
    watchdog: Watchdog,
) -> Stats:
    rng = random.Random(f"fuzz_wire:{seed}:{target.name}")
    stats = Stats(target.name)
    start = last_report = time.perf_counter()
    while stats.inputs < inputs:
        if seconds is not None and time.perf_counter() - start >= seconds:
            stats.notes.append(f"stopped by --seconds {seconds:g}")
            break
        data = target.generate(rng)
        case = stats.cases
        stats.cases += 1
        watchdog.current = (time.monotonic(), case, data)
        outcome, crash, elapsed = judge(target, data)
        watchdog.current = None
        if crash is None:
            assert outcome is not None
            slowest = outcome.slowest_s
            stats.slowest_s = max(stats.slowest_s, elapsed if slowest is None else slowest)
            stats.accepted += outcome.accepted
            stats.refused += outcome.refused
            stats.reasons.update(outcome.reasons)
        else:
            done = crash.done if isinstance(crash, InvariantViolation) else Outcome(0, 0)
            stats.accepted += done.accepted
            stats.refused += done.refused
            stats.reasons.update(done.reasons)
            stats.crashes += 1
            stats.slowest_s = max(stats.slowest_s, elapsed)
            signature = _signature(crash)
            stats.signatures[signature] += 1
            text = "".join(traceback.format_exception(crash))
            if signature not in stats.first_crash:
                stats.first_crash[signature] = text
                print(f"[fuzz_wire] {target.name}: new crash {signature}", file=sys.stderr)
            if out is not None and len(stats.saved) < MAX_SAVED_PER_TARGET:
                stats.saved.append(_save(out, target, seed, case, data, text))
        now = time.perf_counter()
        if progress and now - last_report >= PROGRESS_EVERY_S:
            last_report = now
            rate = stats.inputs / (now - start)
            print(
                f"[fuzz_wire] {target.name}: {stats.inputs}/{inputs} inputs, "
                f"{stats.crashes} crashes, {rate:.0f}/s",
                file=sys.stderr,
                flush=True,
            )
    stats.seconds = time.perf_counter() - start
    for key, value in sorted(target.extra().items()):
        stats.notes.append(f"{key} {value}")
    return stats
