"""Killable worker processes for work that may never return (task generators, scorers).

A thread cannot be stopped, so any work whose running time a peer or a dataset's bug can
choose runs in a worker process that is killed at its time limit. This module has the
worker side (`serve`), a handle on one worker (`WorkerProcess`, used by the asynchronous
pool in `node.workers`) and `Sandbox`, one worker used synchronously (by
`rewards.registry` for reward time limits in the node's own process).

Invariants:
- A worker is a fresh interpreter: the 'forkserver' start method where the platform has
  it (the server is started from a clean interpreter and preloads `PRELOAD`, so a
  replacement is a fork of a single-threaded process, not of ours), else 'spawn'. Never a
  fork of a process with threads.
- Each worker runs in its own empty temporary working directory, removed when the worker
  is closed or killed.
- A job is `(function, args)` pickled by reference: the function must be importable by
  the worker (module-level), and anything it looks up in a registry must be registered
  by a module the worker imports (`preload`).
- A job past its time limit has its worker killed (SIGKILL) and replaced by a new one:
  nothing of it keeps running. The limit counts from the moment the job is sent to a
  worker that said it is ready (start-up is never charged to a job).
- Inside a worker, reward time limits use threads (`rewards.registry` thread mode); a
  worker whose job left such a thread running reports it, and its owner retires it after
  that job, so no thread outlives the job that started it by more than the worker's kill.
- A job's own exception travels back and is re-raised in the caller (with the worker's
  traceback as a note); a worker that dies (crash, out of memory) is `WorkerDied`.
- Workers ignore SIGINT, and so does the fork server from its start where `context` is
  called on the main thread (it is then started at once, inheriting SIGINT ignored,
  rather than by the first worker). Ctrl-C at a terminal interrupts the whole process
  group: the node stops on it and stops its workers itself, where an interrupted worker
  or a fork server still importing its preload printed a KeyboardInterrupt traceback
  each. SIGTERM and SIGKILL still end them.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import shutil
import signal
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

PRELOAD: tuple[str, ...] = ("rewards.registry", "rewards.rg", "reasoning_gym")
"""Imported by every worker before it says it is ready (and by the fork server)."""

START_TIMEOUT_S = 120.0
"""A worker that is not ready this long after it was started is killed; start-up imports
reasoning-gym (about 2 s on an idle core)."""


class JobTimeout(Exception):
    """A job ran past its time limit; its worker was killed."""


class WorkerDied(Exception):
    """A worker exited (or was killed by the system) while running a job."""


def start_method(preferred: str | None = None) -> str:
    """`preferred`, else 'forkserver' where available, else 'spawn' ('fork' is refused)."""
    methods = multiprocessing.get_all_start_methods()
    if preferred is not None:
        if preferred not in ("forkserver", "spawn") or preferred not in methods:
            raise ValueError(f"start method must be 'forkserver' or 'spawn', got {preferred!r}")
        return preferred
    return "forkserver" if "forkserver" in methods else "spawn"


def context(method: str | None = None, preload: Sequence[str] = ()) -> BaseContext:
    """The multiprocessing context workers start from. For 'forkserver' the server's
    preload list is set to `__main__`, `PRELOAD` and `preload` (the server is one per
    process: a server already running keeps its list, which only makes starts slower)."""
    name = start_method(method)
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        ctx.set_forkserver_preload(list(dict.fromkeys(["__main__", *PRELOAD, *preload])))
        _start_fork_server_ignoring_interrupts()
    return ctx


def _start_fork_server_ignoring_interrupts() -> None:
    """Start the fork server now with SIGINT ignored, which it inherits (Python keeps an
    inherited SIG_IGN) through its preload imports. Only the main thread may change a
    signal's handling; elsewhere the server starts with the first worker, as before. A
    Ctrl-C in the few milliseconds of the start is ignored by this process too."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGINT)
    if handler is None:  # installed outside Python: it could not be put back
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, handler)


# ---- worker side -------------------------------------------------------------------------


def serve(conn: Connection, workdir: str, preload: Sequence[str]) -> None:
    """A worker's main loop: run `(function, args)` jobs until the pipe closes or `None`.

    Replies `("ready", pid)` once, then per job `(status, value, leaked_threads,
    reward_counters)`, status `ok` (value: the result) or `raised` (value: the exception,
    or a `RuntimeError` describing one that does not pickle)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner stops us (see the invariants)
    os.chdir(workdir)
    for module in (*PRELOAD, *preload):
        importlib.import_module(module)
    from rewards import registry

    registry.set_time_limit_mode("thread")
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        function, args = job
        try:
            reply: tuple[str, Any] = ("ok", function(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller re-raises it
            reply = ("raised", _portable(exc))
        conn.send((*reply, registry.live_reward_threads(), registry.reward_counters()))


def _portable(exc: BaseException) -> BaseException:
    """`exc` with its traceback text as a note, or a `RuntimeError` if it does not pickle."""
    text = "".join(traceback.format_exception(exc))
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any pickling failure
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    exc.add_note(f"in a worker process:\n{text}")
    return exc


# ---- owner side --------------------------------------------------------------------------


class WorkerProcess:
    """One started worker: its process, pipe and temporary directory."""

    def __init__(self, ctx: BaseContext, preload: Sequence[str] = ()) -> None:
        self.workdir = tempfile.mkdtemp(prefix="swarm-worker-")
        parent, child = ctx.Pipe()
        self.process: Any = ctx.Process(  # type: ignore[attr-defined]
            target=serve,
            args=(child, self.workdir, tuple(preload)),
            daemon=True,
            name="swarm-worker",
        )
        try:
            self.process.start()
        except BaseException:
            parent.close()
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        finally:
            child.close()
        self.conn: Connection = parent
        self.pid: int | None = None

    def check_ready(self, message: Any) -> None:
        if not (isinstance(message, tuple) and message[:1] == ("ready",)):
            raise RuntimeError(f"unexpected first message from a worker: {message!r}")
        self.pid = message[1]

    def send_job(self, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.conn.send((function, args))

    def kill(self) -> None:
        """SIGKILL the worker (if alive), reap it, remove its directory. Idempotent."""
        with contextlib.suppress(Exception):
            if self.process.is_alive():
                self.process.kill()
            self.process.join(10.0)
        with contextlib.suppress(Exception):
            self.conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def stop(self, wait_s: float = 5.0) -> None:
        """Ask the worker to exit, then kill it if it has not within `wait_s`."""
        with contextlib.suppress(Exception):
            self.conn.send(None)
            self.process.join(wait_s)
        self.kill()


class Sandbox:
    """One worker used synchronously: `call(function, args, timeout_s)`. Thread-safe (one
    job at a time); the worker starts on first use and is replaced after a kill."""

    def __init__(self, *, method: str | None = None, preload: Sequence[str] = ()) -> None:
        self._method = method
        self._preload = tuple(preload)
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        self.counts = {"jobs": 0, "timeouts": 0, "deaths": 0, "starts": 0, "retired": 0}

    def _ready_worker(self) -> WorkerProcess:
        if self._worker is not None:
            return self._worker
        worker = WorkerProcess(context(self._method, self._preload), self._preload)
        self.counts["starts"] += 1
        try:
            if not worker.conn.poll(START_TIMEOUT_S):
                raise RuntimeError(f"a sandbox worker was not ready in {START_TIMEOUT_S} s")
            worker.check_ready(worker.conn.recv())
        except BaseException:
            worker.kill()
            raise
        self._worker = worker
        return worker

    def call(self, function: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
        """`function(*args)` in the worker; `JobTimeout` (worker killed) past `timeout_s`,
        `WorkerDied` if it exits, else its result or its exception."""
        with self._lock:
            worker = self._ready_worker()
            self.counts["jobs"] += 1
            try:
                worker.send_job(function, args)
                if not worker.conn.poll(timeout_s):
                    self.counts["timeouts"] += 1
                    self._discard()
                    raise JobTimeout(f"no result in {timeout_s:.3g} s; worker killed")
                reply = worker.conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self.counts["deaths"] += 1
                self._discard()
                raise WorkerDied(f"the sandbox worker exited ({worker.process.exitcode})") from None
            status, value, leaked, _ = reply
            if leaked:  # a reward thread still runs in it: retire the worker
                self.counts["retired"] += 1
                self._discard()
            if status == "raised":
                raise value
            return value

    def _discard(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None
