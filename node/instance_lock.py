"""One running process per node: exclusive locks on its data dir and its key file.

Two processes started on one config (a second terminal, a service restarted while the
old process lingers) would interleave their checkpoints and metrics in one data dir and
put one peer id on the network twice, where its peers refuse half of its messages as
replays. So `swarm join`, `swarm train` and `swarm peers` hold the node's lock while
they run, and a second process on the same node refuses to start.

Invariants:
- The lock is an exclusive `flock` on `<data_dir>/node.lock`, and, when the key lives
  outside the data dir (one identity, one process), on the key file itself, opened
  read-only (so a key on a read-only mount works; nothing is ever written to it), or on
  `<key file>.lock` while the key does not exist yet. Taken before the process reads its
  checkpoint or key. The kernel drops a `flock` with the process's
  last descriptor, so a node killed in any way (SIGKILL included) leaves no stale lock:
  the next start takes it.
- A process that finds a lock held raises `ConfigError` naming the path, the holder's
  pid and command (which a holder writes into its writable lock files once it holds
  them all; for a key file, read from /proc/locks) and the fix; it writes into no lock
  file.
- A data dir (or key file folder) that cannot be created or written is a `ConfigError`
  naming the setting, before anything else touches it.
- Lock files are never deleted: deleting a held one would let a second process lock a
  new file of the same name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from swarm.config import NodeConfig
from swarm.errors import ConfigError

LOCK_NAME = "node.lock"


def lock_paths(config: NodeConfig) -> list[Path]:
    """The files locked for `config`'s node: its data dir's lock file, and, when the key
    lies outside the data dir, the key file (or its `.lock` sibling while the key does
    not exist yet)."""
    data_dir = config.node.data_dir
    paths = [data_dir / LOCK_NAME]
    key = config.node.resolved_key_file
    if key.resolve().parent != data_dir.resolve():
        paths.append(key if key.is_file() else key.with_name(key.name + ".lock"))
    return paths


@contextlib.contextmanager
def hold_node(config: NodeConfig, command: str) -> Iterator[None]:
    """Hold the node's locks (`lock_paths`) for the duration of the block, or raise
    `ConfigError` if another process holds one."""
    held: list[tuple[int, bool]] = []
    key = config.node.resolved_key_file
    try:
        fields = ("node.data_dir", "node.key_file")  # in lock_paths' order
        for path, field in zip(lock_paths(config), fields, strict=False):
            held.append(_lock(path, field, writable=path != key))
        for fd, writable in held:  # all taken: say who holds them
            if writable:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} swarm {command}\n".encode(), 0)
        yield
    finally:
        for fd, _ in held:
            os.close(fd)  # releases its flock


def _lock(path: Path, field: str, *, writable: bool) -> tuple[int, bool]:
    """A descriptor of `path` holding its exclusive flock, or ConfigError (also for a
    folder that cannot be made or written: `field` names the setting to change). A file
    not `writable` (the key itself) is opened read-only and never created."""
    try:
        if writable:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        else:
            fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ConfigError(
            f"{field}: cannot use {path.parent} ({exc.strerror}: {exc.filename}); "
            "give a folder this user can create and write"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        written = os.pread(fd, 512, 0).decode(errors="replace").strip() if writable else ""
        holder = written or _flock_holder(fd) or "unknown"
        os.close(fd)
        # The data dir, or the key file (also when its `.lock` sibling is what is held).
        what = path.parent if writable and path.name == LOCK_NAME else path
        what = what.with_name(what.name.removesuffix(".lock")) if what != path.parent else what
        raise ConfigError(
            f"{what} is in use by another running node (pid and command: "
            f"{holder}); stop that process first, or give this node its own "
            f"node.data_dir (and node.key_file: one peer id per running node)"
        ) from None
    return fd, writable


def _flock_holder(fd: int) -> str | None:
    """`pid (command line)` of the process holding a flock on `fd`'s file, from
    /proc/locks (Linux); None where it cannot be told."""
    st = os.fstat(fd)
    inode = f":{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].endswith(inode):
            pid = fields[4]
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                return pid
            return f"{pid} {cmd.strip()[:120]}"
    return None
