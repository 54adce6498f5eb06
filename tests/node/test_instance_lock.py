"""One running process per node (`node.instance_lock`): a second process on the same
data dir or key file refuses to start, and a killed holder leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from node.instance_lock import hold_node, lock_paths
from swarm.config import NodeConfig
from swarm.errors import ConfigError


def _config(data_dir: Path, key_file: Path | None = None) -> NodeConfig:
    node: dict = {"data_dir": str(data_dir)}
    if key_file is not None:
        node["key_file"] = str(key_file)
    return NodeConfig.model_validate({"node": node})


def test_a_second_holder_of_the_same_node_is_refused_naming_the_first(tmp_path: Path) -> None:
    config = _config(tmp_path / "alice")
    with hold_node(config, "join"):
        with pytest.raises(ConfigError, match=rf"in use .*{os.getpid()} swarm join"):
            with hold_node(config, "peers"):
                pass
        other = _config(tmp_path / "bob")
        with hold_node(other, "join"):  # another node: no conflict
            pass
    with hold_node(config, "train"):  # released at the end of the block
        assert (tmp_path / "alice" / "node.lock").read_text() == f"{os.getpid()} swarm train\n"


def test_a_data_dir_that_cannot_be_made_names_the_setting(tmp_path: Path) -> None:
    """Found by hand: a data dir under a file, or under /proc, ended `swarm train` in a
    FileExistsError / FileNotFoundError traceback."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"^node\.data_dir: cannot use .*a-file/runs"):
        with hold_node(_config(a_file / "runs"), "train"):
            pass
    with pytest.raises(ConfigError, match=r"^node\.key_file: cannot use .*a-file/keys"):
        with hold_node(_config(tmp_path / "ok", a_file / "keys" / "node.key"), "join"):
            pass
    assert not (tmp_path / "ok" / "node.lock").read_text()  # nobody claimed it


def test_one_key_file_is_one_running_node_whatever_the_data_dirs(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "shared.key"
    first, second = _config(tmp_path / "a", key), _config(tmp_path / "b", key)
    assert lock_paths(first)[1] == tmp_path / "keys" / "shared.key.lock"
    assert len(lock_paths(_config(tmp_path / "c"))) == 1  # key in the data dir: one lock
    with hold_node(first, "join"):
        with pytest.raises(ConfigError, match=r"node\.key_file"):
            with hold_node(second, "join"):
                pass
        assert not (tmp_path / "b" / "node.lock").read_text()  # nothing written for b


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from node.instance_lock import hold_node
            from swarm.config import NodeConfig
            config = NodeConfig.model_validate({{"node": {{"data_dir": {str(tmp_path)!r}}}}})
            with hold_node(config, "join"):
                print("held", flush=True)
                time.sleep(60)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        config = _config(tmp_path)
        with pytest.raises(ConfigError, match=rf"{holder.pid} swarm join"):
            with hold_node(config, "join"):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        with hold_node(config, "join"):  # non-blocking: raises if the lock were stale
            assert (tmp_path / "node.lock").read_text() == f"{os.getpid()} swarm join\n"
    finally:
        holder.kill()
        holder.wait()


def test_an_existing_key_is_locked_itself_read_only(tmp_path: Path) -> None:
    """Issue 34: a key file on a read-only mount could not be used (the lock was written
    beside it); the duplicate-key error named the key's folder, not the file."""
    key = tmp_path / "keys" / "node.key"
    key.parent.mkdir()
    key.write_bytes(b"secret key bytes")
    first, second = _config(tmp_path / "a", key), _config(tmp_path / "b", key)
    assert lock_paths(first)[1] == key
    with hold_node(first, "join"):
        with pytest.raises(ConfigError, match=rf"{key} is in use .*{os.getpid()} "):
            with hold_node(second, "join"):
                pass
    assert key.read_bytes() == b"secret key bytes"  # never written
    assert sorted(p.name for p in key.parent.iterdir()) == ["node.key"]  # nothing beside it
