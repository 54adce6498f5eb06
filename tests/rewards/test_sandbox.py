"""The killable worker: a job past its limit is killed, the next job runs in a new one."""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rewards.sandbox import JobTimeout, Sandbox, WorkerDied, start_method

ENOUGH_S = 120.0
"""Limit for jobs that return at once (never reached; no timing is asserted)."""


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox()
    yield box
    box.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_start_method_is_never_fork() -> None:
    assert start_method() in ("forkserver", "spawn")
    with pytest.raises(ValueError, match="fork"):
        start_method("fork")


def test_a_job_past_its_limit_is_killed_and_the_next_job_runs(sandbox: Sandbox) -> None:
    first_pid = sandbox.call(os.getpid, (), ENOUGH_S)
    assert first_pid != os.getpid()
    with pytest.raises(JobTimeout):
        sandbox.call(time.sleep, (3600,), 0.2)
    assert _gone(first_pid)  # killed and reaped, not abandoned
    assert sandbox.call(operator.add, (2, 3), ENOUGH_S) == 5
    assert sandbox.call(os.getpid, (), ENOUGH_S) != first_pid
    assert sandbox.counts["timeouts"] == 1 and sandbox.counts["starts"] == 2


def test_runs_in_its_own_empty_directory_removed_on_close() -> None:
    box = Sandbox()
    cwd = box.call(os.getcwd, (), ENOUGH_S)
    assert cwd != os.getcwd() and Path(cwd).is_dir()
    assert box.call(os.listdir, (".",), ENOUGH_S) == []
    box.close()
    assert not Path(cwd).exists()


def test_a_jobs_exception_is_re_raised_with_the_workers_traceback(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError) as info:
        sandbox.call(int, ("not a number",), ENOUGH_S)
    assert any("in a worker process" in note for note in info.value.__notes__)
    assert sandbox.call(operator.mul, (6, 7), ENOUGH_S) == 42  # the worker survived
    assert sandbox.counts["starts"] == 1


def test_a_worker_that_dies_is_replaced(sandbox: Sandbox) -> None:
    with pytest.raises(WorkerDied):
        sandbox.call(os._exit, (3,), ENOUGH_S)
    assert sandbox.call(operator.add, (1, 1), ENOUGH_S) == 2
    assert sandbox.counts["deaths"] == 1 and sandbox.counts["starts"] == 2


def test_a_terminals_ctrl_c_leaves_the_worker_to_its_owner(sandbox: Sandbox) -> None:
    """Ctrl-C interrupts a terminal's whole process group: the worker must not die of it
    (nor print a traceback); the node stops it when it stops."""
    ours = signal.getsignal(signal.SIGINT)
    pid = sandbox.call(os.getpid, (), ENOUGH_S)
    os.kill(pid, signal.SIGINT)
    time.sleep(0.2)  # a SIGINT that ends the worker has done so by now
    assert sandbox.call(os.getpid, (), ENOUGH_S) == pid
    assert sandbox.counts["starts"] == 1 and sandbox.counts["deaths"] == 0
    assert signal.getsignal(signal.SIGINT) is ours  # this process's handling is untouched


FORK_SERVER_PROBE = """
import multiprocessing.forkserver, sys
from rewards.sandbox import context
context("forkserver")
pid = multiprocessing.forkserver._forkserver._forkserver_pid
ignored = [l for l in open(f"/proc/{pid}/status") if l.startswith("SigIgn:")][0].split()[1]
print(int(ignored, 16) >> (2 - 1) & 1)  # SIGINT is signal 2
"""


@pytest.mark.skipif(
    start_method() != "forkserver" or not Path("/proc/self/status").exists(),
    reason="needs the forkserver start method and /proc (Linux)",
)
def test_the_fork_server_ignores_ctrl_c_from_its_start() -> None:
    """Its preload imports take seconds of a node's start-up; a Ctrl-C then printed a
    KeyboardInterrupt traceback from it. Started from the main thread, it ignores SIGINT
    from the start (a fresh process: the fork server is one per process)."""
    probe = subprocess.run(
        [sys.executable, "-c", FORK_SERVER_PROBE], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "1"
