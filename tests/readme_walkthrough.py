"""Run README.md's commands top to bottom in a fresh clone and report each one.

    .venv/bin/python tests/readme_walkthrough.py [--clone DIR] [--skip REGEX]... [--install]

The rules, which README.md is written to:

- Commands come from the fenced blocks opened with ```sh, in the order they appear.
  Every other fence (```text, ```toml, a bare ```) is illustration and never runs.
- In a block, a line ending in a backslash continues on the next line; `#` outside
  quotes, at the start of a line or after a blank, starts a comment (a line that is only
  a comment is dropped, a trailing comment is cut off).
- `12D3KooW...` is the placeholder of a peer id: `ADDR/p2p/12D3KooW...` becomes the
  address the node listening on ADDR printed (`listening on ADDR/p2p/<id>`); a bare
  placeholder becomes the peer id printed last.
- A command that runs until Ctrl-C (`swarm join` without `--rounds`, `swarm dashboard`)
  is started in the background, as in a terminal of its own. The walkthrough waits until
  it is ready: a join has printed its `listening on` line, and a join given `--bootstrap`
  has also trained on a peer's groups (`first external groups used`) and finished 3
  rounds; a dashboard has printed `dashboard on`. At the end of its block it gets SIGINT
  (Ctrl-C) and must exit with status 0.
- Every other command runs in the foreground, in the clone's root, and must exit with
  status 0 within its time limit.

The clone is a `git clone` of the committed HEAD of the repository holding this script
(uncommitted changes are not in it), in a temporary directory removed afterwards unless
a command failed, or in `--clone DIR`, which is kept. Its `.venv` is a symlink to this
checkout's venv (a fresh `make install` downloads and builds for many minutes), with
PYTHONPATH set to the clone so that the clone's code is what runs, and the clone's
`pyproject.toml` dated before the venv's install stamp so that `make` does not reinstall
into the shared venv; a `make` command whose dry run would still run pip is refused.
`--install` gives the clone a venv of its own (`make` creates it) instead.

Exit status: 0 when every command passed (or was skipped with `--skip`), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLACEHOLDER = "12D3KooW..."
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
RUN_LANGUAGE = "sh"

READY_TIMEOUT_S = 300.0
"""How long a background command may take to become ready."""
STOP_TIMEOUT_S = 60.0
"""How long a background command may take to exit after SIGINT."""
MAKE_TIMEOUT_S = 3600.0
COMMAND_TIMEOUT_S = 600.0
ROUND_LINE = re.compile(r"\bround\s+\d+\s+v\d+")
LISTENING = re.compile(r"listening on (\S+)/p2p/(\S+)")
PEER_ID = re.compile(r"^peer id (\S+)")


@dataclass(frozen=True)
class Command:
    block: int
    """Index of the ```sh block it came from (0, 1, ...)."""
    line: int
    """README line number where it starts (1-based)."""
    text: str
    """The command with comments cut and continuations joined."""


# ---- extraction ---------------------------------------------------------------------


def strip_comment(line: str) -> str:
    """`line` without a shell comment (`#` outside quotes, at the start or after a blank)."""
    quote: str | None = None
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def sh_blocks(markdown: str) -> Iterator[tuple[int, int, list[str]]]:
    """(block index, first line number, lines) of each ```sh block, in order."""
    lines = markdown.splitlines()
    index = 0
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i].strip())
        if opened is None:
            i += 1
            continue
        marker, language = opened.groups()
        body_start = i + 1
        j = body_start
        while j < len(lines) and not lines[j].strip().startswith(marker):
            j += 1
        if language == RUN_LANGUAGE:
            yield index, body_start + 1, lines[body_start:j]
            index += 1
        i = j + 1


def extract_commands(markdown: str) -> list[Command]:
    """The commands of `markdown`'s ```sh blocks, by the rules in this module's docstring."""
    commands = []
    for block, first_line, lines in sh_blocks(markdown):
        pending: list[str] = []
        start = 0
        for offset, raw in enumerate(lines):
            text = strip_comment(raw)
            if not pending:
                start = first_line + offset
            if text.endswith("\\"):
                pending.append(text[:-1].strip())
                continue
            pending.append(text.strip())
            joined = " ".join(part for part in pending if part)
            pending = []
            if joined:
                commands.append(Command(block, start, joined))
        if any(pending):
            commands.append(Command(block, start, " ".join(p for p in pending if p)))
    return commands


# ---- what a command is --------------------------------------------------------------


def swarm_subcommand(text: str) -> tuple[str, list[str]] | None:
    """(subcommand, its arguments) when `text` runs the `swarm` command, else None."""
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if Path(word).name == "swarm" and i + 1 < len(words):
            return words[i + 1], words[i + 2 :]
    return None


@dataclass(frozen=True)
class Readiness:
    what: str
    """What the walkthrough waits for, in words."""
    ready: Callable[[list[str]], bool]


def runs_until_stopped(text: str) -> Readiness | None:
    """How to tell a command that runs until Ctrl-C is ready; None for any other."""
    found = swarm_subcommand(text)
    if found is None:
        return None
    sub, args = found
    if sub == "join" and "--rounds" not in args:
        if "--bootstrap" in args:
            return Readiness(
                "listening, trained on a peer's groups, 3 rounds",
                lambda out: (
                    any(LISTENING.search(line) for line in out)
                    and any("first external groups used" in line for line in out)
                    and sum(bool(ROUND_LINE.search(line)) for line in out) >= 3
                ),
            )
        return Readiness("listening", lambda out: any(LISTENING.search(line) for line in out))
    if sub == "dashboard":
        return Readiness("dashboard on", lambda out: any("dashboard on" in x for x in out))
    return None


def fill_placeholders(text: str, listening: dict[str, str], last_id: str | None) -> str:
    """`text` with each `12D3KooW...` replaced (see the module docstring)."""

    def full_address(match: re.Match[str]) -> str:
        prefix = match.group(1)
        if prefix in listening:
            return f"{prefix}/p2p/{listening[prefix]}"
        if last_id is None:
            return match.group(0)
        return f"{prefix}/p2p/{last_id}"

    text = re.sub(r"(\S*)/p2p/" + re.escape(PLACEHOLDER), full_address, text)
    if PLACEHOLDER in text and last_id is not None:
        text = text.replace(PLACEHOLDER, last_id)
    return text


# ---- running ------------------------------------------------------------------------


@dataclass
class Result:
    command: Command
    ran: str
    status: str = "fail"
    """pass, fail or skip."""
    seconds: float = 0.0
    note: str = ""
    log: Path | None = None


@dataclass
class Background:
    result: Result
    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None


class Walkthrough:
    def __init__(self, clone: Path, env: dict[str, str], skips: list[re.Pattern[str]],
                 shared_venv: bool) -> None:  # fmt: skip
        self.clone = clone
        self.env = env
        self.skips = skips
        self.shared_venv = shared_venv
        self.logs = clone / ".walkthrough"
        self.logs.mkdir(exist_ok=True)
        self.results: list[Result] = []
        self.background: list[Background] = []
        self.listening: dict[str, str] = {}
        self.last_id: str | None = None

    def _log_path(self) -> Path:
        return self.logs / f"{len(self.results) + 1:02d}.log"

    def _learn_ids(self, line: str) -> None:
        match = LISTENING.search(line)
        if match:
            self.listening.setdefault(match.group(1), match.group(2))
            self.last_id = match.group(2)
        match = PEER_ID.search(line)
        if match:
            self.last_id = match.group(1)

    def run_one(self, command: Command) -> None:
        text = fill_placeholders(command.text, self.listening, self.last_id)
        result = Result(command, text, log=self._log_path())
        self.results.append(result)
        if any(pattern.search(text) for pattern in self.skips):
            result.status, result.note = "skip", "--skip"
            return
        if PLACEHOLDER in text:
            result.note = "no peer id printed before it to fill in 12D3KooW..."
            return
        if text.split()[0] == "make" and self.shared_venv and not self._make_is_safe(text):
            result.note = "its dry run would pip install into the shared venv: refused"
            return
        readiness = runs_until_stopped(text)
        if readiness is None:
            self._foreground(result)
        else:
            self._start_background(result, readiness)

    def _make_is_safe(self, text: str) -> bool:
        dry = subprocess.run(
            [*shlex.split(text), "-n"], cwd=self.clone, env=self.env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return "pip install" not in dry.stdout

    def _foreground(self, result: Result) -> None:
        assert result.log is not None
        limit = MAKE_TIMEOUT_S if result.ran.startswith("make") else COMMAND_TIMEOUT_S
        start = time.monotonic()
        with result.log.open("w") as log:
            log.write(f"$ {result.ran}\n")
            log.flush()
            process = subprocess.Popen(
                ["bash", "-c", result.ran], cwd=self.clone, env=self.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                code = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                code = None
        result.seconds = time.monotonic() - start
        for line in result.log.read_text(errors="replace").splitlines():
            self._learn_ids(line)
        if code == 0:
            result.status = "pass"
        else:
            result.note = f"timed out after {limit:.0f} s" if code is None else f"exit {code}"

    def _start_background(self, result: Result, readiness: Readiness) -> None:
        assert result.log is not None
        start = time.monotonic()
        process = subprocess.Popen(
            ["bash", "-c", f"exec {result.ran}"], cwd=self.clone, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # a terminal of its own: Ctrl-C reaches its group
        )  # fmt: skip
        job = Background(result, process)
        log = result.log.open("w")
        log.write(f"$ {result.ran}   (background)\n")

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                log.flush()
                job.lines.append(line.rstrip("\n"))
            log.close()

        job.pump = threading.Thread(target=pump, daemon=True)
        job.pump.start()
        self.background.append(job)
        deadline = start + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if readiness.ready(list(job.lines)):
                break
            if process.poll() is not None:
                break
            time.sleep(0.2)
        for line in list(job.lines):
            self._learn_ids(line)
        result.seconds = time.monotonic() - start
        if process.poll() is not None:
            result.note = f"exited ({process.returncode}) before it was ready"
        elif not readiness.ready(list(job.lines)):
            result.note = f"not ready ({readiness.what}) within {READY_TIMEOUT_S:.0f} s"
        else:
            result.status = "pass"
            result.note = f"ready ({readiness.what}) after {result.seconds:.1f} s"

    def stop_background(self) -> None:
        """SIGINT to each background command's process group (Ctrl-C), newest first."""
        for job in reversed(self.background):
            process, result = job.process, job.result
            start = time.monotonic()
            if process.poll() is not None:
                if result.status == "pass":
                    result.status = "fail"
                    result.note += f"; exited ({process.returncode}) before it was stopped"
                continue
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                result.status = "fail"
                result.note += f"; did not stop within {STOP_TIMEOUT_S:.0f} s of SIGINT"
                continue
            if job.pump is not None:
                job.pump.join(10)
            result.seconds += time.monotonic() - start
            if process.returncode != 0:
                result.status = "fail"
                result.note += f"; exit {process.returncode} after SIGINT"
            else:
                result.note += "; stopped by SIGINT, exit 0"
        self.background = []


# ---- the clone ------------------------------------------------------------------------


def make_clone(target: Path, install: bool) -> dict[str, str]:
    """Clone HEAD into `target`; the environment commands run with there."""
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(target)], check=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)
    if install:
        return env
    venv = REPO / ".venv"
    stamp = venv / ".installed"
    if not stamp.is_file():
        raise SystemExit(f"{venv}: no installed venv to share (run `make install`, or --install)")
    (target / ".venv").symlink_to(venv, target_is_directory=True)
    before = stamp.stat().st_mtime - 60
    os.utime(target / "pyproject.toml", (before, before))
    env["PYTHONPATH"] = str(target)
    return env


def table(results: list[Result]) -> str:
    rows = [("#", "line", "result", "seconds", "command", "note")]
    for i, r in enumerate(results, 1):
        shown = r.ran if len(r.ran) <= 96 else r.ran[:93] + "..."
        rows.append((str(i), str(r.command.line), r.status.upper(), f"{r.seconds:.1f}",
                     shown, r.note))  # fmt: skip
    widths = [max(len(row[c]) for row in rows) for c in range(5)]
    out = []
    for row in rows:
        cells = [row[c].ljust(widths[c]) for c in range(5)]
        out.append("  ".join(cells) + ("  " + row[5] if row[5] else ""))
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clone", type=Path, help="clone into DIR (new or empty) and keep it")
    parser.add_argument(
        "--skip", action="append", default=[], metavar="REGEX",
        help="report commands matching REGEX as skipped instead of running them",
    )  # fmt: skip
    parser.add_argument(
        "--install", action="store_true",
        help="give the clone its own venv (make creates it) instead of this checkout's",
    )  # fmt: skip
    args = parser.parse_args()
    if args.clone is not None and args.clone.exists() and any(args.clone.iterdir()):
        raise SystemExit(f"{args.clone}: not empty")
    keep = args.clone is not None
    target = args.clone or Path(tempfile.mkdtemp(prefix="readme-walkthrough-")) / "swarm"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    print(f"cloning {REPO} at {head} into {target}", flush=True)
    env = make_clone(target, args.install)
    if args.install:
        print("venv: the clone's own (created by its first make command)", flush=True)
    else:
        print(f"venv: {target / '.venv'} -> {REPO / '.venv'} (shared, not reinstalled; "
              f"PYTHONPATH={target} so the clone's code runs)", flush=True)  # fmt: skip
    commands = extract_commands((target / "README.md").read_text())
    print(f"{len(commands)} commands from README.md's ```sh blocks", flush=True)
    walk = Walkthrough(target, env, [re.compile(p) for p in args.skip], not args.install)
    start = time.monotonic()
    try:
        for command in commands:
            shown = fill_placeholders(command.text, walk.listening, walk.last_id)
            print(f"-> line {command.line}: {shown}", flush=True)
            if walk.background and command.block != walk.background[0].result.command.block:
                walk.stop_background()
            walk.run_one(command)
            result = walk.results[-1]
            print(f"   {result.status} {result.seconds:.1f} s {result.note}", flush=True)
            if result.status == "fail" and result.log is not None and result.log.exists():
                tail = result.log.read_text(errors="replace").splitlines()[-15:]
                print("\n".join("   | " + line for line in tail), flush=True)
    finally:
        walk.stop_background()
    print(f"\nREADME walkthrough at {head}, {time.monotonic() - start:.0f} s in all:\n")
    print(table(walk.results))
    failed = [r for r in walk.results if r.status == "fail"]
    if failed:
        keep = True
    print(f"\nlogs: {walk.logs}" + ("" if keep else " (removed with the clone)"))
    if not keep:
        shutil.rmtree(target.parent, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
