"""Fixtures for transport tests with real OS processes: a mosquitto broker, peer processes.

Invariants:
- Every process a fixture starts is stopped by its own PID in teardown (terminate, then
  kill after a grace period), whatever the test's outcome.
- The broker listens only on 127.0.0.1 on a free port, anonymous, without persistence.
- Tests needing mosquitto are skipped with a clear reason where it is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).with_name("peer_process.py")


def mosquitto_path() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None


class Broker:
    """A mosquitto process on 127.0.0.1:`port`; restartable on the same port."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.host = "127.0.0.1"
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        )
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout_s} s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            terminate(proc)


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 5 s; returns once the process is gone."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture
def mosquitto_broker(tmp_path: Path) -> Iterator[Broker]:
    binary = mosquitto_path()
    if binary is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto; CI installs it)")
    broker = Broker(binary, tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


class PeerProcess:
    """A running `peer_process.py` (or `script`): its JSON events, commands on its stdin."""

    def __init__(
        self, name: str, args: list[str], log_dir: Path, script: Path = PEER_SCRIPT
    ) -> None:
        self.name = name
        self.stderr_path = log_dir / f"{name}.stderr"
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=REPO,
                env=env,
                text=True,
                bufsize=1,
            )
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()
        self.peer_id = ""
        self.addrs: list[str] = []

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "noise", "line": line.rstrip()}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self.events.append({"event": "exit"})
            self._cond.notify_all()

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str = ""
    ) -> dict[str, Any]:
        """Return the first event (past or future) satisfying `predicate`."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._cond:
            while True:
                for event in self.events[seen:]:
                    if predicate(event):
                        return event
                    if event["event"] == "exit":
                        raise AssertionError(
                            f"{self.name} exited (rc={self.proc.poll()}) while waiting for "
                            f"{what}; stderr:\n{self.stderr_tail()}"
                        )
                seen = len(self.events)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.name}: timed out after {timeout_s} s waiting for {what}; "
                        f"last events {self.events[-5:]}; stderr:\n{self.stderr_tail()}"
                    )
                self._cond.wait(remaining)

    def wait_until(
        self, check: Callable[[list[dict[str, Any]]], bool], timeout_s: float, what: str = ""
    ) -> None:
        """Wait until `check(all events so far)` holds."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not check(self.events):
                if self.events and self.events[-1]["event"] == "exit":
                    raise AssertionError(
                        f"{self.name} exited while waiting for {what}; "
                        f"stderr:\n{self.stderr_tail()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.name}: timed out after {timeout_s} s waiting for {what}; "
                        f"last events {self.events[-5:]}; stderr:\n{self.stderr_tail()}"
                    )
                self._cond.wait(remaining)

    def ready(self, timeout_s: float = 30.0) -> PeerProcess:
        event = self.wait_for(lambda e: e["event"] == "ready", timeout_s, "ready")
        self.peer_id = event["peer_id"]
        self.addrs = event["addrs"]
        return self

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def received(self, sender: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [
                e
                for e in self.events
                if e["event"] == "recv" and (sender is None or e["sender"] == sender)
            ]

    def sent(self) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e["event"] == "sent"]

    def mesh(self) -> list[str]:
        with self._cond:
            meshes = [e["peers"] for e in self.events if e["event"] == "mesh"]
        return meshes[-1] if meshes else []

    def request(self, command: str, event: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """Send a command and wait for the next `event` it produces."""
        with self._cond:
            before = len(self.events)
        self.command(command)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for e in self.events[before:]:
                    if e["event"] == event:
                        return e
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.name}: no {event!r} after {command!r}")
                self._cond.wait(remaining)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.command("quit")
                self.proc.wait(timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                # A broken pipe here only means the process is already gone.
                with contextlib.suppress(OSError):
                    stream.close()


@pytest.fixture
def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_port()


@pytest.fixture
def spawn_peer(tmp_path: Path) -> Iterator[Callable[..., PeerProcess]]:
    """Start `peer_process.py` (or `script=`) with the given arguments; all are stopped
    at teardown."""
    started: list[PeerProcess] = []

    def spawn(name: str, *args: str, script: Path = PEER_SCRIPT) -> PeerProcess:
        peer = PeerProcess(name, list(args), tmp_path, script)
        started.append(peer)
        return peer

    try:
        yield spawn
    finally:
        for peer in started:
            peer.stop()


def wait_all(
    check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05
) -> None:
    """Poll `check` until true; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
