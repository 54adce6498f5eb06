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
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from swarm.messages import (
    PAYLOAD_TYPES,
)
from tests.swarm.fuzz.deltas import delta_packet_target
from tests.swarm.fuzz.gossip_target import gossip_target
from tests.swarm.fuzz.harness import (
    DEFAULT_INPUTS,
    DEFAULT_TIME_LIMIT_S,
    KINDS,
    Stats,
    Target,
    _signature,
    judge,
    run_target,
)
from tests.swarm.fuzz.rescore import KNOWN_BAD_RG, rescore_target
from tests.swarm.fuzz.wire import envelope_target, payload_target

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
