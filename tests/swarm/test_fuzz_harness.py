"""The short run of the fuzz harness `tests/swarm/fuzz_wire.py` (the long run,
`benchmarks/fuzz_wire.py`, is outside CI), and proof that the harness can fail: a broken
decoder is reported as a crash with its input saved.

Invariant under test: every decoder a peer can reach raises only its refusal type, within
its time limit, for a few thousand mutated inputs per target (0 crashes), and each target
reaches both its accepting and its refusing paths.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm.errors import WireError
from tests.swarm.fuzz.corpus import envelope_input
from tests.swarm.fuzz.harness import InvariantViolation, Outcome, Target, judge, run_target
from tests.swarm.fuzz.rescore import IsolatedRunner, WorkerSpec
from tests.swarm.fuzz.wire import check_envelope
from tests.swarm.fuzz_wire import TARGET_NAMES, build_target, main

SHORT_INPUTS = {
    "envelope": 3000,
    "hello": 3000,
    "rollouts": 3000,
    "delta": 3000,
    "chunk": 3000,
    "gossip": 5000,
    "delta_packet": 1500,
    "rollout_rescore": 150,
}


def test_every_target_has_a_short_run() -> None:
    assert set(SHORT_INPUTS) == set(TARGET_NAMES)


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_short_fuzz_run_has_no_crashes(name: str, tmp_path: Path) -> None:
    # skip_known: the rescore crashes already found and reported (see KNOWN_BAD_RG)
    target = build_target(name, skip_known=True)
    try:
        stats = run_target(target, inputs=SHORT_INPUTS[name], seed=7, out=tmp_path)
    finally:
        target.close()
    assert stats.crashes == 0, stats.describe_crashes()
    assert stats.inputs >= SHORT_INPUTS[name]
    assert stats.accepted > 0 and stats.refused > 0, (stats.accepted, stats.reasons)
    assert not list(tmp_path.iterdir())


def _fragile_check(data: bytes) -> Outcome:
    """A decoder with a bug: KeyError on any input holding the byte 0xc1."""
    if b"\xc1" in data:
        raise KeyError("decoder bug")
    return check_envelope(data)


def test_a_broken_decoder_is_reported_as_a_crash_with_its_input_saved(tmp_path: Path) -> None:
    target = Target(
        "fragile", "envelope decoder with a bug", envelope_input, _fragile_check, WireError
    )
    stats = run_target(target, inputs=600, seed=0, out=tmp_path)
    assert stats.crashes > 0
    assert stats.refused > 0  # the harness still tells refusals from crashes
    assert all(sig.startswith("KeyError at test_fuzz_harness.py") for sig in stats.signatures)
    assert len(stats.saved) == min(stats.crashes, 50)
    for path in stats.saved:
        data = path.read_bytes()
        assert b"\xc1" in data
        assert "KeyError: 'decoder bug'" in path.with_suffix(".txt").read_text()
        outcome, crash, _ = judge(target, data)  # the saved input reproduces the crash
        assert outcome is None and isinstance(crash, KeyError)


def _burns_cpu(data: bytes) -> Outcome:
    if data[:1] == b"\x98":
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.02:
            pass
    return Outcome()


def test_an_input_over_the_time_limit_is_a_crash() -> None:
    target = Target("burner", "slow on envelopes", envelope_input, _burns_cpu, WireError)
    target.time_limit_s = 0.01
    stats = run_target(target, inputs=20, seed=0)
    assert stats.crashes > 0 and set(stats.signatures) == {"slow"}
    assert stats.accepted + stats.crashes == 20


def _hangs(data: bytes) -> Outcome:
    time.sleep(60)
    return Outcome()


def test_a_hanging_child_is_killed_and_counted() -> None:
    spec = WorkerSpec("tests.swarm.test_fuzz_harness:_hangs", "swarm.errors:WireError")
    runner = IsolatedRunner(spec, kill_after_s=0.5)
    try:
        with pytest.raises(InvariantViolation, match="hang"):
            runner.call(b"x")
        assert not runner.running  # killed; the next call starts a fresh child
    finally:
        runner.close()


HUNG_RUN = """
import time
from pathlib import Path
from tests.swarm.fuzz.corpus import envelope_input
from tests.swarm.fuzz.harness import Outcome, Target, run_target
from swarm.errors import WireError

def hang(data: bytes) -> Outcome:
    time.sleep(60)
    return Outcome()

run_target(Target("hung", "", envelope_input, hang, WireError), inputs=5, out=Path({out!r}),
           hang_s=0.5)
"""


def test_a_hung_in_process_input_ends_the_run_with_the_input_saved(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    code = HUNG_RUN.format(out=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert "hang: no result after 0.5 s" in done.stderr
    saved = list(tmp_path.glob("hung-s0-*.bin"))
    assert len(saved) == 1 and saved[0].read_bytes()
    assert ", in hang" in saved[0].with_suffix(".txt").read_text()  # the hung frame


def test_generation_is_deterministic_for_a_seed() -> None:
    for name in ("envelope", "gossip", "delta_packet", "rollout_rescore"):
        target = build_target(name)

        def sample(seed: int, target: Target = target) -> list[bytes]:
            rng = random.Random(seed)
            return [target.generate(rng) for _ in range(5)]

        assert sample(3) == sample(3) != sample(4)


def test_command_line_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "hello,chunk", "--inputs", "300", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "| hello | 300 |" in out and "| chunk | 300 |" in out
