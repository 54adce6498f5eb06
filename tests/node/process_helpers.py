"""Starting real `swarm join` processes and waiting on them by what they write (their
metrics.jsonl)."""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from node.demo import JOIN_ENV, join_command
from node.metrics import read_metrics


def start_join(
    config: Path,
    rounds: int,
    *,
    stdout: Any,
    stderr: Any,
    wait_peers: int = 0,
    own_process_group: bool = False,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> subprocess.Popen:
    """`node.demo.spawn_join` with what only tests need: with `own_process_group`, the
    node leads a process group of its own (its workers join it), as a command started at
    a terminal does; `env` adds to its environment; `extra_args` to its command line."""
    return subprocess.Popen(
        [*join_command(config, rounds, wait_peers), *extra_args],
        stdout=stdout,
        stderr=stderr,
        text=True,
        env={**os.environ, **JOIN_ENV, **(env or {})},
        process_group=0 if own_process_group else None,
    )


def wait_rounds(metrics: Path, rounds: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until `metrics` holds `rounds` records; fails if `proc` exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while len(read_metrics(metrics)) < rounds:
        assert proc.poll() is None, f"exited with {proc.returncode} before round {rounds}"
        assert time.monotonic() < deadline, f"fewer than {rounds} rounds in {timeout} s"
        time.sleep(0.2)


def senders(records: list[dict]) -> set[str]:
    """Every peer whose groups these rounds trained on."""
    return {sender for record in records for sender in record["external_by_sender"]}


def wait_used(
    metrics: Path, sender: str, after: int, proc: subprocess.Popen, timeout: float
) -> None:
    """Until a round of `metrics` past its first `after` trained on `sender`'s groups;
    fails if `proc` exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while sender not in senders(read_metrics(metrics)[after:]):
        assert proc.poll() is None, f"exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"no groups of {sender} in {timeout} s"
        time.sleep(0.2)


def set_config(path: Path, **sections: dict[str, Any]) -> None:
    """Set keys of a config file, section by section (a demo config writes only a
    node's own keys: the rest are the config models' defaults)."""
    data = tomllib.loads(path.read_text())
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path.write_text(tomli_w.dumps(data))


def edit_config(text: str, *edits: tuple[str, str]) -> str:
    """`text` with each `(old, new)` line replaced, each `old` found exactly once (a
    template whose formatting changed fails here, not silently in the test's premise)."""
    for old, new in edits:
        found = text.count(old)
        if found != 1:
            raise AssertionError(f"config edit {old!r}: found {found} times, expected once")
        text = text.replace(old, new)
    return text
