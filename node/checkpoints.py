"""Where checkpoints live, which one to resume from, and cleaning up after failed writes.

Invariants:
- Checkpoints are directories `<data_dir>/checkpoints/round-<8 digits>`, written by one
  node process at a time (the one owning the data dir). The learner writes its files into
  a hidden temporary sibling and renames it into place (atomic on POSIX); the node then
  writes `node.json` (its own state) inside, atomically, last.
- A checkpoint is valid only if its `node.json` parses and matches the schema below
  (right types, `rounds_done` equal to the directory's round) and every learner file it
  lists still has the size it was written with: a write cut short, a garbage file or a
  truncated weights file is never resumed from, never counted among the checkpoints
  `prune` keeps, and never taken for "already written" (the round is written anew). The
  learner also verifies its own files on load (hashes: corruption that keeps the size),
  and the node falls back to an older checkpoint if they are torn.
- `prune` never deletes the newest valid checkpoint. It keeps the newest `keep` valid
  ones, deletes hidden temporary directories (writes that were cut short) and round
  directories without `node.json` that are older than the newest valid one. Directories
  whose `node.json` is present but invalid are ignored, never pruned (they may be from
  another version of swarm). A torn or invalid directory of a round that is written
  again is replaced (`remove_torn`).
- Nothing here raises on a failed removal: it is logged and the next prune tries again
  (a checkpoint that cannot be cleaned up must not stop training).

`node.json` schema: `rounds_done` (int >= 0), `tasks` ({"cursor": int >= 0,
"seed": int}), `pool` ({"rng": a `random.getstate()` as JSON, "arrivals": int >= 0}),
`senders` ({peer id: [highest seq, policy version]}, ints >= 0: each sender's newest
envelope, the replay floor and version-lag reference after a restart), `peer_id`,
`model_id`, `model_family` (strings), optionally `own_seq_reserved` (int >= 0: every seq
this node sent until the next checkpoint is below it; see `node.resume`) and `files`
({relative path: size in bytes} of the learner's files; absent in older checkpoints). (Protocol-1
checkpoints also had `swarm_round` and no `senders`: they still load, with an empty
sender table.)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

from swarm.errors import ConfigError

log = logging.getLogger("swarm.node.checkpoints")

_NAME = re.compile(r"^round-(\d{8})$")
NODE_STATE = "node.json"
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Errnos for which deleting older checkpoints can make room for the next write."""


def checkpoint_root(data_dir: Path) -> Path:
    return data_dir / "checkpoints"


def checkpoint_dir(data_dir: Path, rounds_done: int) -> Path:
    return checkpoint_root(data_dir) / f"round-{rounds_done:08d}"


def round_of(directory: Path) -> int | None:
    """The round in a checkpoint directory's name, or None if it is not one."""
    found = _NAME.match(directory.name)
    return int(found.group(1)) if found else None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_rng_state(value: Any) -> bool:
    if not isinstance(value, list) or len(value) != 3 or not isinstance(value[1], list):
        return False
    version, internal, gauss = value
    if gauss is not None and not isinstance(gauss, float):
        return False
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in [version, *internal]):
        return False
    try:
        random.Random().setstate((version, tuple(internal), gauss))
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def node_state_problem(state: Any, directory: Path | None = None) -> str | None:
    """Why `state` is not a usable `node.json` (see the schema above); None if it is."""
    if not isinstance(state, dict):
        return "not a JSON object"
    if not _is_count(state.get("rounds_done")):
        return f"rounds_done is {state.get('rounds_done')!r}, not a count"
    senders = state.get("senders", {})
    if not isinstance(senders, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(_is_count(x) for x in v)
        for k, v in senders.items()
    ):
        return "senders is not {peer id: [seq, policy_version]}"
    expected = round_of(directory) if directory is not None else None
    if expected is not None and state["rounds_done"] != expected:
        return f"rounds_done {state['rounds_done']} in the directory of round {expected}"
    tasks = state.get("tasks")
    if not isinstance(tasks, dict) or not _is_count(tasks.get("cursor")):
        return f"tasks is {tasks!r}"
    if not isinstance(tasks.get("seed"), int) or isinstance(tasks.get("seed"), bool):
        return f"tasks is {tasks!r}"
    pool = state.get("pool")
    if not isinstance(pool, dict) or not _is_count(pool.get("arrivals")):
        return "pool is not {'rng': ..., 'arrivals': count}"
    if not _is_rng_state(pool.get("rng")):
        return "pool.rng is not a random.getstate()"
    for key in ("peer_id", "model_id", "model_family"):
        if not isinstance(state.get(key), str):
            return f"{key} is {state.get(key)!r}, not a string"
    if "own_seq_reserved" in state and not _is_count(state["own_seq_reserved"]):
        return f"own_seq_reserved is {state['own_seq_reserved']!r}, not a count"
    files = state.get("files", {})
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and _is_count(v) for k, v in files.items()
    ):
        return "files is not {path: size}"
    return None


def _load_node_state(directory: Path) -> tuple[dict | None, str | None]:
    """(state, None) if `directory/node.json` is valid, else (None, why not)."""
    try:
        state = json.loads((directory / NODE_STATE).read_text())
    except FileNotFoundError:
        return None, f"no {NODE_STATE}"
    except (OSError, ValueError) as exc:
        return None, f"unreadable {NODE_STATE} ({exc})"
    problem = node_state_problem(state, directory)
    if problem:
        return None, f"bad {NODE_STATE}: {problem}"
    torn = _files_problem(directory, state)
    return (None, f"learner files changed since written: {torn}") if torn else (state, None)


def read_node_state(directory: Path) -> dict | None:
    """The node state in `directory`, or None if it is missing, unreadable or invalid."""
    return _load_node_state(directory)[0]


def is_valid(directory: Path) -> bool:
    return read_node_state(directory) is not None


def file_sizes(directory: Path) -> dict[str, int]:
    """Size of every file the learner wrote in `directory` (relative POSIX paths)."""
    sizes = {}
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if path.is_file() and name != NODE_STATE and not path.name.startswith("."):
            sizes[name] = path.stat().st_size
    return sizes


def _files_problem(directory: Path, state: dict) -> str | None:
    """Why the learner files recorded in `state["files"]` do not match the directory's."""
    for name, size in state.get("files", {}).items():
        path = directory / name
        if ".." in Path(name).parts or not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
    return None


def write_node_state(directory: Path, state: dict) -> None:
    """Write `node.json` atomically (temp file, fsync, rename, fsync dir), recording the
    size of every learner file already in `directory` (`files`)."""
    state = {**state, "files": file_sizes(directory)}
    tmp = directory / f".{NODE_STATE}.tmp"
    with tmp.open("w") as f:
        json.dump(state, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(directory / NODE_STATE)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def valid_newest_first(data_dir: Path) -> list[Path]:
    """Valid checkpoints, newest first; each invalid one is logged with the reason."""
    found = []
    for path in reversed(list_checkpoints(data_dir)):
        state, problem = _load_node_state(path)
        if state is None:
            log.warning("ignoring checkpoint %s: %s", path, problem)
        else:
            found.append(path)
    return found


def list_checkpoints(data_dir: Path) -> list[Path]:
    root = checkpoint_root(data_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name)


def latest_valid(data_dir: Path) -> Path | None:
    found = valid_newest_first(data_dir)
    return found[0] if found else None


def _remove(path: Path) -> bool:
    """Delete a directory tree; log (not raise) if that fails. True if it is gone."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.error("could not delete %s: %s", path, exc)
        return False
    return True


def remove_torn(directory: Path) -> None:
    """Delete `directory` if it exists but is not a valid checkpoint (before rewriting it)."""
    if directory.exists() and not is_valid(directory):
        _remove(directory)


def describe(error: OSError) -> str:
    """`ENOSPC: [Errno 28] No space left on device: '<path>'` for logs and the CLI."""
    return f"{errno.errorcode.get(error.errno or 0, 'error')}: {error}"


def prune(data_dir: Path, keep: int = 2) -> None:
    """Delete all but the newest `keep` (>= 1) valid checkpoints, the leftovers of writes
    that were cut short (hidden temp dirs; round dirs without `node.json` older than the
    newest valid one). The newest valid checkpoint is never deleted."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, not {keep}")
    all_dirs = list_checkpoints(data_dir)
    valid = [p for p in all_dirs if is_valid(p)]
    for old in valid[:-keep]:
        _remove(old)
    if valid:
        newest = valid[-1].name
        for torn in all_dirs:
            if torn.name < newest and not (torn / NODE_STATE).exists():
                _remove(torn)
    root = checkpoint_root(data_dir)
    if root.is_dir():
        for leftover in root.iterdir():
            if leftover.name.startswith(".") and leftover.is_dir():
                _remove(leftover)  # temp dirs of writes that were cut short


def discard_failed(data_dir: Path, directory: Path, error: OSError) -> Path | None:
    """After a write of `directory` failed with `error`: delete what it left (the
    directory, which is not valid, and temp dirs) so a full disk is not filled further.
    If the disk is full, also delete older valid checkpoints but the newest, to make
    room for the next try. Returns the newest valid checkpoint (kept), if any."""
    remove_torn(directory)
    prune(data_dir, keep=1 if error.errno in NO_SPACE else 2)
    valid = [p for p in list_checkpoints(data_dir) if is_valid(p)]
    return valid[-1] if valid else None


def foreign_model_error(data_dir: Path, newest: Path, theirs: str, ours: str) -> ConfigError:
    """Why a node refuses a data dir whose newest checkpoint is another model's that ours
    cannot load: resuming past it would start from scratch and, rounds later, prune that
    model's training."""
    return ConfigError(
        f"{data_dir} holds checkpoints of another model ({theirs!r}, newest {newest.name}) "
        f"that this node's model ({ours!r}) cannot load: give this node its own "
        "node.data_dir, or set model.name_or_path back to continue that training"
    )
