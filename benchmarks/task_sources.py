"""Measure which reasoning-gym datasets are usable task sources; prints the table that
`swarm.config.task_sources` checks in (a long job, run outside CI).

    .venv/bin/python -m benchmarks.task_sources [--jobs 2] [--only NAME,...]
        [--timeout 120] [--slow-s 1.0] [--json OUT.json]

For every dataset the installed reasoning-gym registers, three child processes each
regenerate the same fixed probe references (`PROBES`: 5 seeds x 5 indices, a few larger
indices, and the references earlier fuzzing found slow) through `rewards.rg.raw_entry`,
printing one line per item (a digest of question and answer, and its wall time):
- run A with `PYTHONHASHSEED=1`, run B with `PYTHONHASHSEED=2`, run C with
  `PYTHONHASHSEED=1` again. A != C: nondeterministic even under one hash seed; A != B:
  depends on `PYTHONHASHSEED` (set or dict order of strings). Either is refused.
- Each run is killed after `--timeout` s of wall time; a dataset whose run is killed
  before its first item is `hang` under the `lazy` rule (build at size 2**31-1) and is
  re-measured under the `sized` rule (build at size index + 1), which also scans indices
  99, 999, 9999, 99999 and caps the dataset at the largest one built in under
  `CAP_BUDGET_S`. A dataset found nondeterministic or broken under the `lazy` rule is
  measured again under the `sized` rule, and usable if it passes there (a dataset that
  draws its items from one generator made in its constructor can be; list_functions,
  said to be, still differs between two processes built so: seed 0 index 867 and seed
  2**32 index 4, 2026-12-07).
- A dataset where every probe raises is `broken`; one where any item (or the dataset's
  first build) takes over `--slow-s` of wall time is `slow`. Both are refused.
- Everything else is usable: `lazy` (built once per seed, exactly as before the table)
  or `sized` with its cap.

Wall time, on whatever machine runs it: the table's slow verdicts carry the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEEDS = (0, 1, 897, 2**32, 2**62 + 5)
PROBES: tuple[tuple[int, int], ...] = (
    *((seed, index) for seed in SEEDS for index in range(5)),
    (0, 100),
    (0, 867),  # knight_swap: 1-3 s (fuzz_wire's KNOWN_BAD_RG)
    (0, 4095),
    (2**32, 382),  # number_sequence: 11 s (ditto)
    (7, 99),
)
"""(seed, index) references every dataset is measured on."""
LAZY_FAR_INDEX = 2**31 - 2
"""Also probed under the `lazy` rule: an item's cost must not grow with its index."""
CAP_SCAN = (99, 999, 9999, 99999)
CAP_BUDGET_S = 0.25
"""A `sized` dataset is capped at the largest scanned index built in under this."""
ROOT = Path(__file__).resolve().parents[1]


def _digest(entry: dict[str, Any]) -> str:
    text = json.dumps([str(entry["question"]), str(entry["answer"])])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_out: Any = None
"""The child's result file (datasets print their own chatter to stdout and stderr)."""


def _emit(row: list[Any]) -> None:
    _out.write(json.dumps(row) + "\n")
    _out.flush()


def child(name: str, rule: str, out: Path) -> None:
    """Write one JSON line per probe to `out`: [seed, index, digest or 'error:<type>',
    seconds] (and `first`, `cap` lines)."""
    global _out
    _out = out.open("w")
    import reasoning_gym  # noqa: F401 - imported before timing, as a worker preloads it

    from rewards.rg import raw_entry

    start = time.perf_counter()
    try:  # the first use may import modules or load data files: reported apart
        raw_entry(name, 0, 0, rule)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - measured, not handled
        pass
    _emit(["first", time.perf_counter() - start])
    probes = list(PROBES)
    if rule == "lazy":
        probes.append((0, LAZY_FAR_INDEX))
    else:
        cap = -1
        for index in CAP_SCAN:
            start = time.perf_counter()
            try:
                raw_entry(name, 0, index, "sized")
            except Exception:  # noqa: BLE001 - measured, not handled
                break
            seconds = time.perf_counter() - start
            _emit(["cap", index, seconds])
            if seconds >= CAP_BUDGET_S:
                break
            cap = index
        probes = [(s, i) for s, i in probes if i <= cap]
    for seed, index in probes:
        start = time.perf_counter()
        try:
            digest = _digest(raw_entry(name, seed, index, rule))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - measured, not handled
            digest = f"error:{type(exc).__name__}"
        _emit([seed, index, digest, time.perf_counter() - start])


@dataclass
class Run:
    items: dict[tuple[int, int], str] = field(default_factory=dict)
    seconds: dict[tuple[int, int], float] = field(default_factory=dict)
    caps: list[tuple[int, float]] = field(default_factory=list)
    first_s: float | None = None
    killed: bool = False
    wall_s: float = 0.0


def run_child(name: str, rule: str, hash_seed: int, timeout_s: float) -> Run:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        command = [sys.executable, "-m", "benchmarks.task_sources", "--child", name]
        proc = subprocess.Popen(
            [*command, "--rule", rule, "--out", str(out)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            proc.wait(timeout=timeout_s)
            killed = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed = True
        lines = out.read_text().splitlines() if out.exists() else []
    run = Run(killed=killed, wall_s=time.perf_counter() - start)
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by the kill
            continue
        if row[0] == "first":
            run.first_s = row[1]
        elif row[0] == "cap":
            run.caps.append((row[1], row[2]))
        else:
            run.items[(row[0], row[1])] = row[2]
            run.seconds[(row[0], row[1])] = row[3]
    return run


@dataclass
class Verdict:
    name: str
    status: str  # lazy | sized | nondeterministic | slow | broken | hang
    detail: str
    cap: int | None = None
    max_item_s: float = 0.0
    first_s: float = 0.0
    items: int = 0


def _slowest(run: Run) -> tuple[float, tuple[int, int] | None]:
    if not run.seconds:
        return 0.0, None
    key = max(run.seconds, key=run.seconds.__getitem__)
    return run.seconds[key], key


def measure(name: str, timeout_s: float, slow_s: float) -> Verdict:
    try:
        return _measure(name, timeout_s, slow_s)
    except Exception as exc:  # noqa: BLE001 - one dataset's failure must not end the run
        return Verdict(name, "broken", f"measuring failed: {type(exc).__name__}: {exc}")


def _measure(name: str, timeout_s: float, slow_s: float) -> Verdict:
    rule = "lazy"
    a = run_child(name, rule, 1, timeout_s)
    if a.first_s is None:
        rule = "sized"
        a = run_child(name, rule, 1, timeout_s)
        if a.first_s is None:
            return Verdict(name, "hang", f"no item within {timeout_s:.0f} s under either rule")
    verdict = _judge(name, rule, a, timeout_s, slow_s)
    if rule == "lazy" and verdict.status in ("nondeterministic", "broken"):
        # A dataset that draws every item from one generator in its constructor differs
        # (or fails) when built at size 2**31-1 and may be sound built at index + 1.
        sized = run_child(name, "sized", 1, timeout_s)
        if sized.first_s is not None:
            retry = _judge(name, "sized", sized, timeout_s, slow_s)
            # Usable built sized; or refused for what its items do rather than for
            # failing to build at all (word_ladder: too large to build lazily).
            if retry.status == "sized" or (verdict.status == "broken" and retry.status != "broken"):
                return retry
    return verdict


def _judge(name: str, rule: str, a: Run, timeout_s: float, slow_s: float) -> Verdict:
    """The verdict on `name` under `rule`, from run `a` (hash seed 1) and two more runs."""
    b = run_child(name, rule, 2, timeout_s)
    c = run_child(name, rule, 1, timeout_s)
    common = set(a.items) & set(b.items) & set(c.items)
    slowest, where = _slowest(a)
    cap = max((i for i, s in a.caps if s < CAP_BUDGET_S), default=None)
    base = Verdict(name, rule, "", cap, slowest, a.first_s or 0.0, len(a.items))
    if any(a.items[k] != c.items[k] for k in common):
        base.status, base.detail = "nondeterministic", "differs between two processes"
        return base
    if any(a.items[k] != b.items[k] for k in common):
        base.status, base.detail = "nondeterministic", "depends on PYTHONHASHSEED"
        return base
    if all(v.startswith("error:") for v in a.items.values()):
        errors = sorted({v.removeprefix("error:") for v in a.items.values()})
        base.status, base.detail = "broken", f"every probe raises {', '.join(errors)}"
        return base
    if a.killed or slowest > slow_s:
        if a.killed:
            detail = f"killed after {timeout_s:.0f} s at {len(a.items)} of the probes"
        else:
            detail = f"seed {where[0]}, index {where[1]} took {slowest:.1f} s"  # type: ignore[index]
        base.status, base.detail = "slow", detail
        return base
    errors = sum(v.startswith("error:") for v in a.items.values())
    base.detail = f"max {slowest * 1000:.0f} ms/item, first {base.first_s:.2f} s" + (
        f", {errors}/{len(a.items)} probes raise" if errors else ""
    )
    return base


BAD_SCORERS: dict[str, str] = {
    "game_of_life_halting": "its scorer gives 1.0 to any non-empty answer",
}
"""Datasets whose generator passes but whose scorer does not judge answers (found by
hand: this harness measures generation only); refused as `broken`."""


def print_table(verdicts: list[Verdict]) -> None:
    for v in verdicts:
        if v.name in BAD_SCORERS:
            v.status, v.detail = "broken", BAD_SCORERS[v.name]
    lazy = sorted(v.name for v in verdicts if v.status == "lazy")
    sized = sorted((v for v in verdicts if v.status == "sized"), key=lambda v: v.name)
    refused = sorted(
        (v for v in verdicts if v.status not in ("lazy", "sized")), key=lambda v: v.name
    )
    print(
        "# "
        + ", ".join(
            f"{s}: {sum(v.status == s for v in verdicts)}"
            for s in ("lazy", "sized", "nondeterministic", "slow", "broken", "hang")
        )
    )
    print("RG_LAZY: frozenset[str] = frozenset(")
    print("    {")
    for name in lazy:
        print(f'        "{name}",')
    print("    }")
    print(")")
    print("RG_SIZED: dict[str, int] = {")
    for v in sized:
        print(f'    "{v.name}": {v.cap},  # {v.detail}')
    print("}")
    print("RG_REFUSED: dict[str, tuple[RefusalKind, str]] = {")
    for v in refused:
        print(f'    "{v.name}": ("{v.status}", "{v.detail}"),')
    print("}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child")
    parser.add_argument("--rule", default="lazy")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", default="")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--slow-s", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rule, args.out)
        return
    from rewards.rg import dataset_names

    names = [n for n in args.only.split(",") if n] or dataset_names()
    start = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        verdicts = []
        for verdict in pool.map(lambda n: measure(n, args.timeout, args.slow_s), names):
            print(f"{verdict.name:32s} {verdict.status:16s} {verdict.detail}", flush=True)
            verdicts.append(verdict)
    print(f"# {len(names)} datasets in {time.perf_counter() - start:.0f} s", flush=True)
    print_table(verdicts)
    if args.json:
        args.json.write_text(json.dumps([v.__dict__ for v in verdicts], indent=1))


if __name__ == "__main__":
    main()
