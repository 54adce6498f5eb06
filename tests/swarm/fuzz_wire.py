"""Fuzz harness for every decoder a peer can reach; a long job, run outside CI.

Its short run is a test (`tests/swarm/test_fuzz_harness.py`); the long run is started
from the repository's root through `benchmarks/fuzz_wire.py`:

    .venv/bin/python -m benchmarks.fuzz_wire [--inputs 100000] [--seed 0] [--only NAME,...]
        [--out DIR] [--seconds S] [--time-limit S] [--skip-known]
    .venv/bin/python -m benchmarks.fuzz_wire --only envelope --replay DIR/envelope-s0-0000123.bin

Targets (one table row each):
- `envelope`: `decode_envelope` with the gossip layer's wire limits, then the payload
  decoder of the envelope's kind (what `Gossip` does with an unchunked envelope).
- `hello`, `rollouts`, `delta`, `chunk`: `decode_payload(kind, ...)` with `payload_limits`.
- `gossip`: `Gossip.accept` over a memory transport (no network started), fed sequences
  of transport messages: random, mutated, re-signed, replayed, our own, floods of partial
  chunk sets, and whole chunk sets with set-level mutations, so that reassembly and the
  decoders behind it are reached. One input is one transport message.
- `delta_packet`: `policy.delta_codec.decode_packet` of safetensors bytes made from real
  compressed deltas (tiny shapes), then `decompress` of what it accepts.
- `rollout_rescore`: `node.rescore.rescore_group` of groups with hostile task references
  and completions, run in a child process that is killed when an input hangs.

Inputs start from a corpus of valid encodings (envelopes sealed by fixed identities,
payloads, delta packets) and are mutated: bit flips, interesting bytes, msgpack headers
claiming huge lengths, truncation, insertion, deletion, duplicated ranges, splices of two
corpus items, pure random bytes, and structure-aware mutations (the msgpack value is
decoded with `swarm.codec`, a field replaced by a hostile value, re-encoded, and the
envelope re-signed, so the mutation reaches the payload decoder instead of dying at the
signature check).

Invariants; a violation is a *crash*, counted, its input and traceback saved under `--out`:
- A decoder raises only its documented refusal type: `WireError` for the wire decoders,
  `DeltaCodecError` for delta packets, `node.rescore.Refused` for re-scoring.
- No input takes more CPU time than its target's time limit (`slow`); a rescore child
  that does not answer within `HANG_KILL_S` of wall time is killed (`hang`); an
  in-process input hung for `IN_PROCESS_HANG_S` ends the run (exit status 3) with the
  input saved.
- `envelope`: an accepted envelope was signed by a corpus identity (no forgery).
  Payloads: an accepted payload has its kind's type and re-encodes to an equal value.
- `gossip`: `accept` never raises, never counts `internal_error` (nor logs an error),
  counts each message at most once, returns only others' messages of the right type,
  and `pending_reassembly_bytes` stays within `max_reassembly_bytes`.
- `delta_packet`: an accepted packet decompresses without error to finite tensors of
  the local shapes.
- `rollout_rescore`: a returned `Rescored` has one finite reward per completion.

Deterministic for `--seed`: each target draws from its own `random.Random` seeded with
(seed, target name), so `--only` does not change what a target sees; only the time
checks depend on the machine. Exit status 1 if any target crashed.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import json
import logging
import math
import multiprocessing
import os
import random
import struct
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgpack

from gossip.chunking import sha256, split
from gossip.layer import WIRE_MARGIN, Gossip, Received, envelope_limits, payload_limits
from gossip.memory import MemoryNetwork, MemoryTransport
from node.rescore import Refused
from swarm.codec import Limits, pack, unpack
from swarm.config import RewardsConfig
from swarm.config.network import GossipConfig, MemoryTransportConfig, ScoringConfig
from swarm.envelope import Envelope, decode_envelope, seal
from swarm.errors import WireError
from swarm.identity import Identity
from swarm.messages import (
    MAX_TEXT_CHARS,
    PAYLOAD_TYPES,
    Chunk,
    DeltaPacket,
    Hello,
    Payload,
    RolloutBatch,
    RolloutGroup,
    TaskRef,
    decode_payload,
    encode_payload,
)
from swarm.transport import TransportMessage, deltas_topic, peers_topic, rollouts_topic

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


# ---- mutation engine --------------------------------------------------------------------

INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0x8F, 0x9F, 0xBF, 0xE0, 0xC0, 0xC1, 0xC2)
HOSTILE_HEADERS: tuple[bytes, ...] = (
    b"\xdc\xff\xff",  # array16 of 65535 items
    b"\xdd\xff\xff\xff\xff",  # array32 of 2**32-1 items
    b"\xde\xff\xff",  # map16 of 65535 pairs
    b"\xdf\xff\xff\xff\xff",  # map32 of 2**32-1 pairs
    b"\xd9\xff",  # str8 of 255
    b"\xda\xff\xff",  # str16
    b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
    b"\xc4\xff",  # bin8
    b"\xc5\xff\xff",  # bin16
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xc7\xff\x01",  # ext8
    b"\xc9\xff\xff\xff\xff\x01",  # ext32 of 4 GiB
    b"\xd4\x01\x00",  # fixext1
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp32
    b"\xd7\xff" + b"\xff" * 8,  # timestamp64, out of range nanoseconds
    b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # float64 NaN
    b"\xcb\xff\xf0\x00\x00\x00\x00\x00\x00",  # float64 -inf
    b"\xca\x7f\xc0\x00\x00",  # float32 NaN
    b"\xcf" + b"\xff" * 8,  # uint64 max
    b"\xd3\x80" + b"\x00" * 7,  # int64 min
    b"\xc1",  # the one byte msgpack never uses
    b"\x91" * 64,  # arrays nested 64 deep
    b"\x81\xa1k" * 32,  # maps nested 32 deep
    b"\x81\x01\x02",  # a map with an int key
    b"\x81\xc4\x01k\x02",  # a map with a bytes key
    b"\xa3\xed\xa0\x80",  # a str holding a UTF-16 surrogate (invalid UTF-8)
    b"\xa2\xc3\x28",  # a str of invalid UTF-8
)
EDGE_INTS = (
    0, 1, -1, 2, 3, 7, 255, 256, 4095, 4096, 4097, 65535, 65536, 65537, 2**24, 2**31 - 1,
    2**31, 2**32, 2**34, 2**34 + 1, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -(2**31),
    -(2**63),
)  # fmt: skip
EDGE_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 0.5, -1.0, 1e308, 5e-324, 2.0**63)
EDGE_TEXTS = (
    "", "x", "\x00", "é", "\u202e", "😀", "\ufeff", "add", "rg:acre", "topk", "dense_fp16",
    "<answer>1</answer>", "a" * 64, "a" * 65, "a" * 256, "a" * 257, "a" * 4097,
)  # fmt: skip
LONG_TEXT_CHARS = (1025, 4097, 65536, 65537, 70_000)


def random_bytes(rng: random.Random) -> bytes:
    size = rng.choice((0, 1, 2, 3, 8, 16, 64, 100, 256, 1000, 2048, 65_536))
    return rng.randbytes(rng.randint(0, size))


def mutate_bytes(rng: random.Random, data: bytes, others: Sequence[bytes] = ()) -> bytes:
    """1 to 8 stacked byte-level mutations of `data` (splicing draws from `others`)."""
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 5, 8))):
        n = len(out)
        op = rng.randrange(10) if n else 0
        if op == 0:  # insert random bytes or a hostile msgpack header
            pos = rng.randint(0, n)
            insert = (
                rng.choice(HOSTILE_HEADERS)
                if rng.random() < 0.5
                else rng.randbytes(rng.randint(1, 16))
            )
            out[pos:pos] = insert
        elif op == 1:  # flip bits
            for _ in range(rng.randint(1, 4)):
                out[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 2:
            out[rng.randrange(n)] = rng.choice(INTERESTING_BYTES)
        elif op == 3:
            out[rng.randrange(n)] = rng.randint(0xC0, 0xDF)  # a msgpack type byte
        elif op == 4:  # truncate
            del out[rng.randrange(n) :]
        elif op == 5:  # overwrite with a hostile header
            header = rng.choice(HOSTILE_HEADERS)
            pos = rng.randrange(n)
            out[pos : pos + len(header)] = header
        elif op == 6:  # duplicate a range
            begin = rng.randrange(n)
            piece = out[begin : begin + rng.randint(1, 64)] * rng.choice((1, 1, 2, 16))
            pos = rng.randint(0, n)
            out[pos:pos] = piece
        elif op == 7:  # delete a range
            begin = rng.randrange(n)
            del out[begin : begin + rng.randint(1, 32)]
        elif op == 8 and others:  # splice with another corpus item
            other = rng.choice(others)
            out = out[: rng.randint(0, n)] + bytearray(other[rng.randint(0, len(other)) :])
        else:
            out[rng.randrange(n)] = rng.randrange(256)
    return bytes(out[:MAX_INPUT_BYTES])


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    """A msgpack-able value of a random type, often at an edge (never unpackable)."""
    kind = rng.randrange(15)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(EDGE_INTS)
    if kind == 3:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 4:
        return rng.choice(EDGE_FLOATS)
    if kind == 5:
        return rng.choice(EDGE_TEXTS)
    if kind == 6:
        return rng.choice("a\x00é😀<") * rng.choice(LONG_TEXT_CHARS)
    if kind == 7:
        return rng.randbytes(rng.choice((0, 1, 31, 32, 33, 64, 1000)))
    if kind == 8 and depth < 3:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == 9 and depth < 3:
        keys = (rng.choice(EDGE_TEXTS) for _ in range(rng.randint(0, 4)))
        return {key: hostile_value(rng, depth + 1) for key in keys}
    if kind == 10:  # nested deeper than any limit
        value: Any = rng.choice((0, "x", {}))
        for _ in range(rng.choice((7, 8, 9, 10, 64, 300))):
            value = [value]
        return value
    if kind == 11:  # longer than the container limits
        return [rng.choice((0, 1.5, "x"))] * rng.choice((257, 4096, 4097, 5000))
    if kind == 12:
        return {f"k{i}": i for i in range(rng.choice((16, 17, 256, 257, 300)))}
    if kind == 13:  # non-string map keys (refused by strict_map_key)
        return {rng.choice((1, b"k", -1)): hostile_value(rng, 3)}
    return rng.uniform(-1e9, 1e9)


def _paths(obj: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[Any, ...]]:
    """Key paths into lists and maps (a few items of long lists; not too deep)."""
    if depth > 12:
        return
    if isinstance(obj, dict):
        items: list[tuple[Any, Any]] = list(obj.items())
    elif isinstance(obj, list):
        indexes = list(range(min(len(obj), 6)))
        if len(obj) > 6:
            indexes.append(len(obj) - 1)
        items = [(i, obj[i]) for i in indexes]
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key), depth + 1)


def _tweak(rng: random.Random, value: Any) -> Any:
    """A near miss of `value`: off by one, negated, one char more or less, emptied."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):  # kept within msgpack's int range
        near = rng.choice((value + 1, value - 1, -value, value * 2**32, value + 2**63))
        return min(max(near, -(2**63)), 2**64 - 1)
    if isinstance(value, float):
        whole = int(value) if math.isfinite(value) and abs(value) < 2**63 else 0
        return rng.choice((-value, value * 1e308, math.nan, float(whole), whole))
    if isinstance(value, str):
        return rng.choice((value + "x", value[:-1], value.upper(), value * 2, value.encode()))
    if isinstance(value, bytes):
        return rng.choice((value + b"\x00", value[:-1], value * 2, value.decode("latin-1")))
    if isinstance(value, list):
        return rng.choice(([], value + value[-1:], value[:-1], [value]))
    if isinstance(value, dict):
        return rng.choice(({}, [value], list(value.values())))
    return hostile_value(rng)


def mutate_value(rng: random.Random, obj: Any) -> Any:
    """Structure-aware mutation of a decoded msgpack value (a mutated deep copy)."""
    obj = copy.deepcopy(obj)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        paths = list(_paths(obj))
        if not paths or rng.random() < 0.03:
            return hostile_value(rng)
        path = rng.choice(paths)
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = rng.randrange(8)
        if op <= 2:
            parent[key] = hostile_value(rng)
        elif op == 3:
            parent[key] = _tweak(rng, parent[key])
        elif op == 4:
            del parent[key]
        elif op == 5:  # an extra field or item
            if isinstance(parent, dict):
                parent[rng.choice(("extra", "", "\x00", f"{key}_"))] = hostile_value(rng)
            else:
                parent.insert(key, copy.deepcopy(parent[key]))
        elif op == 6 and isinstance(parent, dict):  # a field under another name
            parent[rng.choice((str(key).upper(), f" {key}", f"{key}\x00"))] = parent.pop(key)
        else:  # a list grown past a bound, or a value repeated
            value = parent[key]
            if isinstance(value, list) and value:
                reps = rng.choice((2, 64, 257, 4097)) // len(value) + 1
                parent[key] = (value * reps)[:5000]
            else:
                parent[key] = [value] * rng.choice((2, 33, 257))
    return obj


# ---- corpus -----------------------------------------------------------------------------


def _group(source: str, seed: int, index: int, prompt: str, n: int) -> RolloutGroup:
    completions = tuple(f"<answer>{i}</answer>" if i % 2 else str(i) for i in range(n))
    rewards = tuple(float(i % 2) for i in range(n))
    return RolloutGroup(TaskRef(source, seed, index), prompt, completions, rewards, "tiny", 4)


@cache
def corpus_payloads() -> dict[str, tuple[Payload, ...]]:
    """Valid payloads of every kind, from small to near their bounds."""
    inner = seal(
        SIGNERS[0], kind="hello", swarm_id=SWARM_ID, seq=1, policy_version=1,
        payload=encode_payload(Hello("m", FAMILY, 1)),
    ).encode() * 3  # fmt: skip
    return {
        "hello": (
            Hello("tiny", FAMILY, 3, ("rollouts", "deltas")),
            Hello("", "", 0),
            Hello("m" * 256, "f" * 256, 2**63 - 1, tuple("c" * 64 for _ in range(32))),
        ),
        "rollouts": (
            RolloutBatch((_group("add", 1, 2, "3+4=", 2),)),
            RolloutBatch(
                (
                    _group("rg:basic_arithmetic", 0, 5, "What is 2+2?", 4),
                    _group("copy", 2**63 - 1, 2**63 - 1, "copy abc=\u00e9😀", 8),
                )
            ),
            RolloutBatch(()),
        ),
        "delta": (
            DeltaPacket(FAMILY, 7, "topk", bytes(range(256)) * 2, {"k": "v"}),
            DeltaPacket(FAMILY, 0, "dense_fp16", b"", {}),
            DeltaPacket("other", 2**63 - 1, "x" * 64, b"\x00" * 40, {"a" * 256: "b" * 4096}),
        ),
        "chunk": (*split(inner, 97, sha256(inner))[:3], Chunk(b"\x00" * 32, 0, 1, 1, b"")),
    }


@dataclass(frozen=True)
class WireCorpus:
    envelopes: tuple[Envelope, ...]
    envelope_bytes: tuple[bytes, ...]
    payload_bytes: dict[str, tuple[bytes, ...]]
    payload_values: dict[str, tuple[Any, ...]]
    all_payload_bytes: tuple[bytes, ...]


@cache
def wire_corpus() -> WireCorpus:
    payloads = corpus_payloads()
    envelopes = []
    for i, (kind, messages) in enumerate(sorted(payloads.items())):
        for j, message in enumerate(messages):
            signer = SIGNERS[(i + j) % len(SIGNERS)]
            seq, rnd = (2**63 - 1, 2**63 - 1) if j == 2 else (10 * i + j + 1, 5)
            envelopes.append(
                seal(signer, kind=kind, swarm_id=SWARM_ID, seq=seq, policy_version=rnd,
                     payload=encode_payload(message))
            )  # fmt: skip
    payload_bytes = {k: tuple(encode_payload(m) for m in ms) for k, ms in payloads.items()}
    # the structure-aware mutations start from values decoded by swarm.codec itself
    values = {k: tuple(unpack(b, CORPUS_LIMITS) for b in bs) for k, bs in payload_bytes.items()}
    return WireCorpus(
        envelopes=tuple(envelopes),
        envelope_bytes=tuple(e.encode() for e in envelopes),
        payload_bytes=payload_bytes,
        payload_values=values,
        all_payload_bytes=tuple(b for bs in payload_bytes.values() for b in bs),
    )


def payload_input(rng: random.Random, kind: str) -> bytes:
    """A mutated payload of `kind` (or another kind's, or garbage)."""
    corpus = wire_corpus()
    r = rng.random()
    if r < 0.50:
        return pack(mutate_value(rng, rng.choice(corpus.payload_values[kind])))
    if r < 0.80:
        base = rng.choice(corpus.payload_bytes[kind])
        return mutate_bytes(rng, base, corpus.all_payload_bytes)
    if r < 0.86:
        other = rng.choice(corpus.payload_values[rng.choice(KINDS)])
        return pack(other if rng.random() < 0.5 else mutate_value(rng, other))
    if r < 0.94:
        return pack(hostile_value(rng))
    return random_bytes(rng)


def _resign(fields: list[Any]) -> list[Any]:
    """Fields with a valid signature by the identity their sender field names, if any."""
    signer = BY_PEER.get(fields[3]) if isinstance(fields[3], str) else None
    if signer is None:
        return fields
    try:
        signing_input = Envelope(*fields[:7]).signed_bytes()
    except (struct.error, AttributeError, TypeError, ValueError, UnicodeError):
        return fields  # outside the wire's types or ranges: nothing can sign it
    return [*fields[:7], signer.sign(signing_input)]


def envelope_input(rng: random.Random, base: Envelope | None = None) -> bytes:
    """A hostile envelope: garbage, mutated bytes, mutated fields or a re-signed payload."""
    corpus = wire_corpus()
    base = base if base is not None else rng.choice(corpus.envelopes)
    r = rng.random()
    if r < 0.06:
        return random_bytes(rng)
    if r < 0.10:
        return pack(hostile_value(rng))
    if r < 0.32:  # byte damage to a signed envelope: dies at the signature check at best
        return mutate_bytes(rng, base.encode(), corpus.envelope_bytes)
    if r < 0.50:  # fields of another type or value, mostly re-signed
        fields: Any = mutate_value(
            rng, [base.version, base.kind, base.swarm_id, base.sender, base.seq,
                  base.policy_version, base.payload, base.signature],
        )  # fmt: skip
        if isinstance(fields, list) and len(fields) == 8 and rng.random() < 0.8:
            fields = _resign(fields)
        return pack(fields)
    # a mutated payload, validly signed: reaches the payload decoder
    kind = base.kind if rng.random() < 0.92 else rng.choice((*KINDS, "bogus"))
    signer = BY_PEER[base.sender]
    envelope = seal(
        signer,
        kind=kind,
        swarm_id=SWARM_ID,
        seq=rng.choice((base.seq, 0, 2**63 - 1, rng.randrange(2**63))),
        policy_version=rng.choice((0, base.policy_version, 2**63 - 1)),
        payload=payload_input(rng, base.kind),
    )
    data = envelope.encode()
    return mutate_bytes(rng, data) if rng.random() < 0.05 else data


# ---- wire decoder targets ---------------------------------------------------------------


def check_payload(kind: str, data: bytes) -> Outcome:
    message = decode_payload(kind, data, PAYLOAD_LIMITS)
    if not isinstance(message, PAYLOAD_TYPES[kind]):
        raise InvariantViolation("wrong_type", f"{kind} decoded to {type(message).__name__}")
    again = decode_payload(kind, encode_payload(message), PAYLOAD_LIMITS)
    if again != message:
        raise InvariantViolation("not_canonical", f"{kind} changed on re-encoding")
    return ACCEPTED


def check_envelope(data: bytes) -> Outcome:
    envelope = decode_envelope(data, ENVELOPE_LIMITS, SWARM_ID)
    if envelope.sender not in BY_PEER:
        raise InvariantViolation("forgery", f"accepted an envelope from {envelope.sender}")
    return check_payload(envelope.kind, envelope.payload)


def envelope_target() -> Target:
    return Target(
        name="envelope",
        doc="decode_envelope (wire limits), then the payload decoder of its kind",
        generate=envelope_input,
        check=check_envelope,
        refusal=WireError,
    )


def payload_target(kind: str) -> Target:
    return Target(
        name=kind,
        doc=f"decode_payload({kind!r}) with payload_limits",
        generate=lambda rng: payload_input(rng, kind),
        check=lambda data: check_payload(kind, data),
        refusal=WireError,
    )


# ---- gossip target ----------------------------------------------------------------------

_SMALL = {"max_envelope_bytes": 64 * 1024, "max_reassembly_bytes": 1 << 20, "seen_cache_size": 128}
GOSSIP_CONFIGS = (
    # peer scoring off, so one attacker's garbage does not get its later messages ignored
    GossipConfig(
        **_SMALL, reassembly_timeout_s=30.0, rate_limit_per_s=1000.0, rate_burst=100_000,
        scoring=ScoringConfig(enabled=False),
    ),
    GossipConfig(
        **_SMALL, reassembly_timeout_s=5.0, rate_limit_per_s=1.0, rate_burst=20,
        scoring=ScoringConfig(enabled=False),
    ),
    GossipConfig(**_SMALL, rate_burst=100_000),  # default scoring: attackers get ignored
)  # fmt: skip
CONFIG_WEIGHTS = (0.6, 0.15, 0.25)
MAX_SET_CHUNKS = 300
"""Chunk sets are cut into at most this many pieces (a sequence stays short)."""
TRANSPORT_SIZES = (1024, 2048, 16384)
TOPICS = (
    peers_topic(SWARM_ID),
    rollouts_topic(SWARM_ID),
    deltas_topic(SWARM_ID, FAMILY),
    deltas_topic(SWARM_ID, "other"),
    "free",
    rollouts_topic("another-swarm"),
)
TOPIC_OF = {"hello": TOPICS[0], "rollouts": TOPICS[1], "delta": TOPICS[2], "chunk": TOPICS[2]}


class ManualClock:
    """A clock the input moves (reassembly expiry and rate limits read it)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def fresh_gossip(transport_size: int, config_index: int) -> tuple[Gossip, ManualClock]:
    config = MemoryTransportConfig(network="fuzz", max_message_bytes=transport_size)
    transport = MemoryTransport(config, ME, network=MemoryNetwork("fuzz"))
    clock = ManualClock()
    gossip = Gossip(transport, ME, SWARM_ID, GOSSIP_CONFIGS[config_index], clock, initial_seq=1)
    return gossip, clock


@cache
def chunk_data_bytes(transport_size: int) -> int:
    return fresh_gossip(transport_size, 0)[0].chunk_data_bytes


class _Sequence:
    """Builds one `gossip` input: [transport_size, config_index, [[topic, data, via, dt]]]."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.flood = rng.random() < 0.03
        self.transport_size = 16384 if self.flood else rng.choice(TRANSPORT_SIZES)
        self.config_index = rng.choices(range(len(GOSSIP_CONFIGS)), CONFIG_WEIGHTS)[0]
        self.chunk_data = chunk_data_bytes(self.transport_size)
        self.messages: list[list[Any]] = []
        self.seqs = {a.peer_id: rng.choice((0, 1, rng.randrange(2**40))) for a in ATTACKERS}

    def encode(self) -> bytes:
        return pack([self.transport_size, self.config_index, self.messages])

    def next_seq(self, identity: Identity) -> int:
        seq = self.seqs[identity.peer_id]
        self.seqs[identity.peer_id] = seq + 1
        r = self.rng.random()
        if r < 0.005:  # rare: the floor of the seen cache then refuses this sender's rest
            return self.rng.choice((0, 2**63 - 1))
        return max(seq - 1, 0) if r < 0.03 else seq  # a reused seq now and then

    def add(self, topic: str, data: bytes, sender: Identity | None) -> None:
        rng = self.rng
        r = rng.random()
        if sender is None or r < 0.7:
            via = None
        elif r < 0.9:
            via = sender.peer_id
        else:
            via = rng.choice(ATTACKERS).peer_id
        dt = 0.0 if rng.random() < 0.95 else rng.choice((0.5, 4.0, 6.0, 31.0, 1000.0))
        if rng.random() < 0.1:
            topic = rng.choice(TOPICS)
        self.messages.append([topic, data, via, dt])

    def seal(self, identity: Identity, kind: str, payload: bytes, seq: int | None = None) -> bytes:
        return self.seal_envelope(identity, kind, payload, seq).encode()

    def seal_envelope(
        self, identity: Identity, kind: str, payload: bytes, seq: int | None = None
    ) -> Envelope:
        seq = self.next_seq(identity) if seq is None else seq
        round = self.rng.choice((0, 1, 5, 2**63 - 1))
        return seal(
            identity, kind=kind, swarm_id=SWARM_ID, seq=seq, policy_version=round, payload=payload
        )

    def big_payload(self, kind: str) -> bytes:
        rng = self.rng
        size = rng.choice((500, 3000, 3000, 20_000, 60_000)) if rng.random() < 0.95 else 70_000
        if kind == "rollouts":
            n = rng.randint(1, 8)
            text = "x" * min(size // n, MAX_TEXT_CHARS)
            group = _group("add", 1, 2, "3+4=", n)
            group = dataclasses.replace(group, completions=(text,) * n)
            return encode_payload(RolloutBatch((group,)))
        if kind == "delta":
            return encode_payload(DeltaPacket(FAMILY, 1, "topk", rng.randbytes(size), {}))
        return encode_payload(rng.choice(corpus_payloads()["hello"]))

    def noise(self) -> None:
        rng = self.rng
        sender = rng.choice(SIGNERS)
        bases = [e for e in wire_corpus().envelopes if e.sender == sender.peer_id]
        base = rng.choice(bases)
        self.add(TOPIC_OF[base.kind], envelope_input(rng, base), sender)

    def valid(self, identity: Identity | None = None) -> None:
        rng = self.rng
        identity = identity or rng.choice(ATTACKERS)
        kind = rng.choice(("hello", "rollouts", "delta"))
        payload = encode_payload(rng.choice(corpus_payloads()[kind]))
        self.add(TOPIC_OF[kind], self.seal(identity, kind, payload), identity)

    def chunk_set(self) -> None:
        """One chunked message, often with one set-level mutation."""
        rng = self.rng
        sender = rng.choice(ATTACKERS[:6])
        kind = rng.choice(("rollouts", "delta", "hello"))
        r = rng.random()
        payload = (
            self.big_payload(kind) if r < 0.55
            else payload_input(rng, kind) if r < 0.9
            else random_bytes(rng)
        )  # fmt: skip
        inner_kind = kind if rng.random() < 0.95 else "chunk"
        inner_signer = sender if rng.random() < 0.93 else rng.choice(ATTACKERS)
        sealed = self.seal_envelope(inner_signer, inner_kind, payload)
        inner, digest = sealed.encode(), sealed.signing_digest
        if rng.random() < 0.08:  # damage before hashing: reassembles, then fails to decode
            inner = mutate_bytes(rng, inner)
        if not inner:
            inner = b"\x00"
        size = self.chunk_data if rng.random() < 0.7 else rng.randint(1, 400)
        size = max(size, -(-len(inner) // MAX_SET_CHUNKS))
        chunks: list[Any] = split(inner, size, digest)
        mutation = rng.randrange(14)
        if mutation == 0 and len(chunks) > 1:
            del chunks[rng.randrange(len(chunks))]
        elif mutation == 1:
            chunks.insert(rng.randrange(len(chunks) + 1), rng.choice(chunks))
        elif mutation == 2:
            rng.shuffle(chunks)
        elif mutation == 3:  # corrupted data (each chunk validly signed by its sender)
            i = rng.randrange(len(chunks))
            chunks[i] = dataclasses.replace(chunks[i], data=mutate_bytes(rng, chunks[i].data))
        elif mutation == 4:  # two chunks' data swapped
            i, j = rng.randrange(len(chunks)), rng.randrange(len(chunks))
            di, dj = chunks[i].data, chunks[j].data
            chunks[i] = dataclasses.replace(chunks[i], data=dj)
            chunks[j] = dataclasses.replace(chunks[j], data=di)
        elif mutation == 5:  # a hostile number in one chunk
            i = rng.randrange(len(chunks))
            name = rng.choice(("index", "count", "total_size"))
            value = rng.choice((*EDGE_INTS, len(inner) + 1, len(chunks) + 1))
            chunks[i] = dataclasses.replace(chunks[i], **{name: value})
        elif mutation == 6:  # any field of one chunk, structure-aware
            i = rng.randrange(len(chunks))
            chunks[i] = mutate_value(rng, chunks[i].to_wire())
        elif mutation == 7:  # the same content named as another envelope
            fake = sha256(rng.randbytes(8))
            chunks = [dataclasses.replace(c, inner_digest=fake) for c in chunks]
        for i, chunk in enumerate(chunks):
            payload = encode_payload(chunk) if isinstance(chunk, Chunk) else pack(chunk)
            signer = sender
            if mutation == 8 and i == 0:  # one piece signed by someone else
                signer = rng.choice(ATTACKERS)
            data = self.seal(signer, "chunk", payload)
            if mutation == 9 and i == len(chunks) - 1:
                data = mutate_bytes(rng, data)
            topic = TOPIC_OF[kind]
            if mutation == 10 and i == len(chunks) - 1:
                topic = rng.choice(TOPICS)
            self.add(topic, data, signer)

    def flood_partials(self) -> None:
        """Many senders each start two big chunk sets and never finish them: fills the
        per-sender and the global reassembly bounds (20 x 60 KB > 1 MiB)."""
        rng = self.rng
        size = 12_000  # 5 pieces make 60 KB, under max_envelope_bytes
        for sender in ATTACKERS:
            for _ in range(2):
                content = sha256(rng.randbytes(8))
                for index in rng.sample(range(5), 4):
                    data = rng.randbytes(size)
                    chunk = Chunk(content, index, 5, 5 * size, data)
                    payload = encode_payload(chunk)
                    self.add(TOPICS[2], self.seal(sender, "chunk", payload), sender)

    def replay(self) -> None:
        if self.messages:
            topic, data, _, _ = self.rng.choice(self.messages)
            self.add(topic, data, None)

    def own(self) -> None:
        payload = encode_payload(self.rng.choice(corpus_payloads()["hello"]))
        data = seal(ME, kind="hello", swarm_id=SWARM_ID, seq=1, policy_version=1, payload=payload)
        self.add(TOPICS[0], data.encode(), ME)


def gossip_input(rng: random.Random) -> bytes:
    sequence = _Sequence(rng)
    if sequence.flood:
        sequence.flood_partials()
    steps = rng.choice((1, 2, 5, 10, 20, 40))
    for _ in range(steps):
        r = rng.random()
        if r < 0.30:
            sequence.noise()
        elif r < 0.45:
            sequence.valid()
        elif r < 0.75:
            sequence.chunk_set()
        elif r < 0.85:
            sequence.replay()
        elif r < 0.90:
            sequence.own()
        else:
            sequence.add(rng.choice(TOPICS), random_bytes(rng), None)
    return sequence.encode()


class _ErrorLog(logging.Handler):
    """Collects ERROR records (with tracebacks) of one logger while installed."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.records.append(text)


class _captured_errors:
    """Route a logger's errors into an `_ErrorLog` (not to stderr) for a while."""

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)
        self.handler = _ErrorLog()

    def __enter__(self) -> _ErrorLog:
        self.propagate = self.logger.propagate
        self.logger.addHandler(self.handler)
        self.logger.propagate = False
        return self.handler

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = self.propagate


def _message_violation(
    gossip: Gossip,
    received: Received | None,
    new: Counter[str],
    errors: _ErrorLog,
    via: str | None,
    elapsed: float,
    time_limit_s: float | None,
) -> tuple[str, str] | None:
    """(kind, detail) of the first invariant one `accept` call broke, or None."""
    if errors.records or new["internal_error"]:
        return "internal_error", "\n".join(errors.records) or "counted"
    if time_limit_s is not None and elapsed > time_limit_s:
        return "slow", f"accept took {elapsed:.3f} s > {time_limit_s} s"
    bound = gossip.config.max_reassembly_bytes
    if gossip.pending_reassembly_bytes > bound:
        return "reassembly_bound", f"{gossip.pending_reassembly_bytes} > {bound}"
    if sum(new.values()) > 1 or (received is not None and new):
        return "counted_twice", f"{dict(new)}, received {received is not None}"
    if received is not None:
        sender, kind = received.envelope.sender, received.envelope.kind
        if sender == ME.peer_id or via not in (None, sender):
            return "wrong_sender", f"accepted from {sender} via {via}"
        message = received.message
        if isinstance(message, Chunk) or not isinstance(message, PAYLOAD_TYPES[kind]):
            return "wrong_type", f"{kind} -> {type(message).__name__}"
    return None


def check_gossip(data: bytes, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S) -> Outcome:
    transport_size, config_index, messages = msgpack.unpackb(data, raw=False)
    gossip, clock = fresh_gossip(transport_size, config_index)
    accepted = refused = 0
    slowest = 0.0
    reasons: Counter[str] = Counter()
    with _captured_errors("gossip.layer") as errors:
        for i, (topic, wire, via, dt) in enumerate(messages):
            clock.t += dt
            expired = gossip.expire_partials()  # what `receive` does before each message
            if expired:
                reasons["(partial sets expired)"] += expired
            before = Counter(gossip.counters.dropped)
            t0 = time.thread_time()
            received = gossip.accept(TransportMessage(topic, wire, via))
            elapsed = time.thread_time() - t0
            new = gossip.counters.dropped - before
            slowest = max(slowest, elapsed)
            violation = _message_violation(
                gossip, received, new, errors, via, elapsed, time_limit_s
            )
            if violation is not None:
                done = Outcome(accepted, refused, dict(reasons))
                raise InvariantViolation(violation[0], f"message {i}: {violation[1]}", done)
            if received is not None:
                accepted += 1
                reasons[f"(accepted {received.envelope.kind})"] += 1
            elif new:
                refused += 1
                reasons.update(new)
            else:
                accepted += 1
                reasons["(chunk held)"] += 1
    return Outcome(accepted, refused, dict(reasons), slowest)


def gossip_target(time_limit_s: float) -> Target:
    return Target(
        name="gossip",
        doc="Gossip.accept over a memory transport; one input = one transport message",
        generate=gossip_input,
        check=lambda data: check_gossip(data, time_limit_s),
        refusal=WireError,
        time_limit_s=None,
        note="per message",
    )


# ---- delta packets ----------------------------------------------------------------------

DELTA_SHAPES: dict[str, tuple[int, ...]] = {"w": (12, 40), "b": (40,), "t": (3,)}
META_VALUES = (
    "", "0", "1", "2", "3", "4", "8", "16", "63", "64", "65", "128", "523", "524", "1048576",
    "1048577", "007", "-1", "1e3", " 1", "1 ", "９", "999999999999999", "9999999999999999",
    "topk", "dense_fp16", "swarm-delta/1", "0" * 32, "f" * 32, "F" * 32,
)  # fmt: skip
BIG_INT_MARK = "\x00big int\x00"
"""Stands for an integer literal of 4400 digits in a header (more than Python's default
int/str conversion limit, so `json` cannot write it itself)."""
BF16_SPECIALS = (b"\xc0\x7f", b"\x80\x7f", b"\x80\xff", b"\x00\x80", b"\x80\xbf", b"\x7f\x7f")


@cache
def delta_corpus() -> tuple[bytes, ...]:
    """Real packets: top-k at several densities and widths, dense, and other shapes."""
    import torch

    from policy.compression import DENSE_FP16, compress
    from policy.delta_codec import encode_packet

    def delta(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {n: torch.randn(s, generator=g) * 1e-3 for n, s in shapes.items()}

    packets = []
    for i, (bits, density, chunk_size) in enumerate(
        [(2, 1 / 16, 64), (3, 1 / 8, 64), (4, 1 / 2, 64), (8, 1.0, 64), (2, 1 / 64, 128)]
    ):
        compressed, _ = compress(
            delta(DELTA_SHAPES, i), None, density=density, bits=bits, chunk_size=chunk_size
        )
        packets.append(encode_packet(compressed))
    packets.append(encode_packet(compress(delta(DELTA_SHAPES, 9), None, encoding=DENSE_FP16)[0]))
    other = {"w": (8, 8), "t": (3,)}
    packets.append(encode_packet(compress(delta(other, 1), None, chunk_size=64)[0]))
    return tuple(packets)


def _json_bytes(value: Any) -> bytes:
    """JSON text of a msgpack-able value (bytes as hex, non-string keys skipped)."""
    text = json.dumps(value, separators=(",", ":"), default=bytes.hex, skipkeys=True)
    return text.encode()


def _json_hostile(rng: random.Random) -> Any:
    """A JSON-able hostile value (as a peer's safetensors header could hold)."""
    value = hostile_value(rng)
    r = rng.random()
    if r < 0.1:
        return BIG_INT_MARK
    if r < 0.2:
        return rng.choice(EDGE_INTS)
    if r < 0.3:
        return [rng.choice(EDGE_INTS), rng.choice(EDGE_INTS)]
    return json.loads(_json_bytes(value))


def _split_packet(data: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _join_packet(header: dict[str, Any], body: bytes, rng: random.Random) -> bytes:
    raw = _json_bytes(header)
    raw = raw.replace(json.dumps(BIG_INT_MARK).encode(), b"9" * 4400)
    r = rng.random()
    if r < 0.05:  # a duplicated key
        key = json.dumps(rng.choice([k for k in header if isinstance(k, str)] or ["x"]))
        raw = raw[:1] + f"{key}:1,".encode() + raw[1:] if len(raw) > 2 else raw
    elif r < 0.08:
        raw = mutate_bytes(rng, raw)
    elif r < 0.10:
        raw = b"[" * rng.choice((100, 5000, 16_000)) + raw
    raw += b" " * ((-len(raw)) % 8)
    length = len(raw)
    if rng.random() < 0.04:
        length = rng.choice((0, 1, max(length - 1, 0), length + 1, 2**63, 2**64 - 1, 16_385))
    return struct.pack("<Q", length) + raw + body


def _mutate_entry(rng: random.Random, entry: dict[str, Any]) -> None:
    """One field of a tensor entry: a near miss or a hostile JSON value."""
    key = rng.choice(("dtype", "shape", "data_offsets"))
    value = entry.get(key)
    near = rng.random() < 0.5
    if key == "dtype" and near:
        entry[key] = rng.choice(("U8", "BF16", "F16", "F32", "I64", "BOOL", "", "u8"))
    elif key == "shape" and near and isinstance(value, list) and len(value) == 1:
        n = value[0] if isinstance(value[0], int) else 0
        entry[key] = rng.choice(([n + 1], [n - 1], [0], [-1], [n, 1], [], [2**63], [True]))
    elif key == "data_offsets" and near and isinstance(value, list) and len(value) == 2:
        a, b = (v if isinstance(v, int) else 0 for v in value)
        entry[key] = rng.choice(([a + 1, b + 1], [b, a], [a, b + 2], [a - 1, b], [a], [a, b, b]))
    else:
        entry[key] = _json_hostile(rng)


def _mutate_body(rng: random.Random, entry: dict[str, Any], body: bytearray) -> None:
    """Special values (NaN, Inf, -0, negative bf16; runs of 0x00/0xff) inside one tensor."""
    offsets = entry.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2):
        return
    begin, end = offsets
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin < end <= len(body)):
        return
    pos = rng.randrange(begin, end)
    fill = rng.choice((*BF16_SPECIALS, b"\x00" * 64, b"\xff" * 64, b"\x01"))
    if rng.random() < 0.3:
        fill = bytes([rng.choice((0, 0xFF, 0x55))]) * (end - pos)
    body[pos : min(end, pos + len(fill))] = fill[: end - pos]


def delta_packet_input(rng: random.Random) -> bytes:
    """A mutated safetensors delta packet (header fields, tensor bytes, lengths) or garbage."""
    packets = delta_corpus()
    base = rng.choice(packets)
    r = rng.random()
    if r < 0.03:
        return random_bytes(rng)
    if r < 0.30:
        return mutate_bytes(rng, base, packets)
    header, body = _split_packet(base)
    body_out = bytearray(body)
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.randrange(6)
        meta = header.get("__metadata__")
        entries = [v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
        if op == 0 and isinstance(meta, dict) and meta:  # a metadata value
            key = rng.choice(sorted(meta))
            choice = rng.random()
            if choice < 0.6:
                meta[key] = rng.choice(META_VALUES)
            elif choice < 0.7:
                del meta[key]
            elif choice < 0.8:
                meta[rng.choice(("extra", key.upper()))] = "1"
            else:
                meta[key] = _json_hostile(rng)
        elif op == 1 and entries:
            _mutate_entry(rng, rng.choice(entries))
        elif op == 2 and len(header) > 1:  # drop, rename or add a tensor entry
            name = rng.choice([k for k in header if k != "__metadata__"])
            choice = rng.random()
            if choice < 0.4:
                del header[name]
            elif choice < 0.7:
                header[name + "x"] = header.pop(name)
            else:
                header["values" if name != "values" else "scales"] = copy.deepcopy(header[name])
        elif op == 3 and entries:
            _mutate_body(rng, rng.choice(entries), body_out)
        elif op == 4:  # the header as a whole
            header = rng.choice(({}, {"__metadata__": meta}, header))
            if rng.random() < 0.2:
                mutated = mutate_value(rng, header)
                if not isinstance(mutated, dict):
                    return _json_bytes(mutated)
                header = mutated
        elif rng.random() < 0.5 and body_out:  # body length
            del body_out[rng.randrange(len(body_out)) :]
        else:
            body_out += rng.randbytes(rng.choice((1, 2, 8, 64)))
    return _join_packet(header, bytes(body_out), rng)


def check_delta_packet(data: bytes) -> Outcome:
    import torch

    from policy.compression import decompress
    from policy.delta_codec import decode_packet

    compressed = decode_packet(data, DELTA_SHAPES)
    delta = decompress(compressed, DELTA_SHAPES)  # documented never to fail once accepted
    for name, shape in DELTA_SHAPES.items():
        tensor = delta.get(name)
        if tensor is None or tuple(tensor.shape) != shape:
            raise InvariantViolation("wrong_shape", f"{name} decompressed to a wrong shape")
        if not bool(torch.isfinite(tensor).all()):
            raise InvariantViolation("non_finite", f"{name} decompressed to NaN/Inf")
    return ACCEPTED


def delta_packet_target() -> Target:
    from policy.delta_codec import DeltaCodecError

    return Target(
        name="delta_packet",
        doc="policy.delta_codec.decode_packet (tiny shapes), then decompress",
        generate=delta_packet_input,
        check=check_delta_packet,
        refusal=DeltaCodecError,
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
    check="tests.swarm.fuzz_wire:rescore_case",
    refusal="node.rescore:Refused",
    setup="tests.swarm.fuzz_wire:rescore_setup",
    details="tests.swarm.fuzz_wire:rescore_details",
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


# ---- command line -----------------------------------------------------------------------

TARGET_NAMES = ("envelope", *KINDS, "gossip", "delta_packet", "rollout_rescore")


def build_target(
    name: str, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, skip_known: bool = False
) -> Target:
    """The target called `name` (its corpus is built on first use)."""
    if name == "envelope":
        target = envelope_target()
    elif name in PAYLOAD_TYPES:
        target = payload_target(name)
    elif name == "gossip":
        return gossip_target(time_limit_s)
    elif name == "delta_packet":
        target = delta_packet_target()
    elif name == "rollout_rescore":
        return rescore_target(time_limit_s, skip_known)
    else:
        raise KeyError(f"unknown target {name!r}; known: {', '.join(TARGET_NAMES)}")
    target.time_limit_s = time_limit_s
    return target


def print_table(rows: Sequence[Stats], targets: Mapping[str, Target]) -> None:
    print(
        "| target | inputs | refused | accepted | crashes | seconds | inputs/s | "
        "slowest CPU ms | note |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for s in rows:
        rate = s.inputs / s.seconds if s.seconds else 0.0
        note = "; ".join(x for x in (targets[s.target].note, *s.notes) if x)
        print(
            f"| {s.target} | {s.inputs} | {s.refused} | {s.accepted} | {s.crashes} | "
            f"{s.seconds:.1f} | {rate:.0f} | {1000 * s.slowest_s:.1f} | {note} |"
        )
    print("\nMost common refusal reasons (and, for gossip, what was accepted):\n")
    for s in rows:
        top = ", ".join(f"{reason} {count}" for reason, count in s.reasons.most_common(8))
        print(f"- {s.target}: {top}")
    crashed = [s for s in rows if s.crashes]
    if crashed:
        print("\nCrashes by signature:\n")
        for s in crashed:
            for signature, count in s.signatures.most_common():
                print(f"- {s.target}: {count} x {signature}")
            if s.saved:
                print(f"  inputs saved: {s.saved[0].parent} ({len(s.saved)} files)")


def _names(values: Sequence[str] | None) -> list[str]:
    if not values:
        return list(TARGET_NAMES)
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGET_NAMES]
    if unknown:
        raise SystemExit(f"unknown target(s) {unknown}; known: {', '.join(TARGET_NAMES)}")
    return names


def replay(target: Target, path: Path) -> int:
    """Run one saved input through `target`; 1 if it still crashes."""
    outcome, crash, elapsed = judge(target, path.read_bytes())
    if crash is None:
        print(f"{path}: no crash ({outcome}, {elapsed:.3f} s)")
        return 0
    print("".join(traceback.format_exception(crash)))
    print(f"{path}: CRASH {_signature(crash)} ({elapsed:.3f} s)")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--inputs", type=int, default=DEFAULT_INPUTS,
        help="inputs per target (rollout_rescore: at most its cap unless --uncapped)",
    )  # fmt: skip
    parser.add_argument("--uncapped", action="store_true", help="no cap for slow targets")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only", action="append", help=f"target(s), repeatable or comma-separated: "
        f"{', '.join(TARGET_NAMES)}",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="save each crashing input and traceback here")
    parser.add_argument("--seconds", type=float, help="time budget per target")
    parser.add_argument(
        "--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
        help="seconds one input may take before it counts as a crash",
    )  # fmt: skip
    parser.add_argument(
        "--skip-known", action="store_true",
        help=f"rollout_rescore: skip the reasoning-gym datasets in KNOWN_BAD_RG "
        f"({', '.join(sorted(KNOWN_BAD_RG))})",
    )  # fmt: skip
    parser.add_argument("--replay", type=Path, help="run one saved input (with one --only)")
    args = parser.parse_args(argv)
    names = _names(args.only)
    if args.replay is not None:
        if len(names) != 1:
            raise SystemExit("--replay needs exactly one --only target")
        target = build_target(names[0], time_limit_s=args.time_limit, skip_known=False)
        try:
            return replay(target, args.replay)
        finally:
            target.close()
    rows: list[Stats] = []
    targets: dict[str, Target] = {}
    for name in names:
        target = build_target(name, time_limit_s=args.time_limit, skip_known=args.skip_known)
        targets[name] = target
        count = args.inputs
        if target.default_inputs is not None and not args.uncapped:
            if count > target.default_inputs:
                target.note = "; ".join(
                    x
                    for x in (
                        f"capped at {target.default_inputs}: slow, see --uncapped",
                        target.note,
                    )
                    if x
                )
            count = min(count, target.default_inputs)
        print(f"[fuzz_wire] {name}: {count} inputs ({target.doc})", file=sys.stderr, flush=True)
        try:
            rows.append(
                run_target(
                    target, inputs=count, seed=args.seed, seconds=args.seconds, out=args.out,
                    progress=True,
                )
            )  # fmt: skip
        finally:
            target.close()
    print(f"\nfuzz_wire: seed {args.seed}, time limit {args.time_limit} s per input\n")
    print_table(rows, targets)
    return 1 if any(s.crashes for s in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
