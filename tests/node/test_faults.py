"""Crashes and full disks around checkpoints: nothing is lost that was saved.

- In-process: a node whose checkpoint writes fail (ENOSPC/EIO, in the learner or in
  `node.json`) keeps training, counts and logs the failure, keeps the previous checkpoint
  and leaves no debris; `prune` and `resume` with torn and garbage checkpoints; the metrics
  writer on a failing disk.
- Real processes (`swarm train`, tiny model): SIGKILL while a checkpoint is half written
  (in the learner's temp dir; after its rename, before `node.json`) then a restart; a file
  size limit (RLIMIT_FSIZE: EFBIG like a full disk) and, where unprivileged mounts work,
  a real tiny tmpfs (ENOSPC).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from gossip.memory import MemoryNetwork
from node import checkpoints
from node.build import apply_overrides
from node.metrics import MetricsWriter, read_metrics
from node.runner import Node
from simnet.stub import StubLearner
from swarm.errors import ConfigError
from tests.node.helpers import stub_config, stub_node

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

# ---- in-process: failing writes -------------------------------------------------------


class FailingSaves(StubLearner):
    """A stub learner whose saves number `fail` raise `error` after leaving debris (a temp
    dir with a partial file), like a real writer stopped by a full disk."""

    def __init__(self, *args: Any, fail: set[int], error: int = errno.ENOSPC, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fail = fail
        self.error = error
        self.saves = 0

    def capture(self, directory: Path, manifest: dict[str, Any]) -> Callable[[], None]:
        self.saves += 1
        if self.saves not in self.fail:
            return super().capture(directory, manifest)

        def fail() -> None:
            tmp = directory.parent / f".tmp-{directory.name}"
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "stub.json").write_text('{"skill": 0.')
            raise OSError(self.error, os.strerror(self.error), str(tmp / "stub.json"))

        return fail


def _node(tmp_path: Path, every: int, fail: set[int], error: int = errno.ENOSPC) -> Node:
    config = stub_config(tmp_path, "full", external_groups=0)
    config = apply_overrides(config, {"node": {"checkpoint_every": every}}, "test")
    node = stub_node(config, MemoryNetwork(f"full-{tmp_path.name}"))
    node.learner = FailingSaves(
        config.sampler.group_size, config.rewards, skill=0.3, fail=fail, error=error
    )
    return node


def _names(data_dir: Path) -> list[str]:
    root = checkpoints.checkpoint_root(data_dir)
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def _fresh_stub(node: Node) -> StubLearner:
    return StubLearner(node.config.sampler.group_size, node.config.rewards)


def test_failed_learner_save_is_counted_and_the_previous_checkpoint_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = _node(tmp_path, every=5, fail={2})  # checkpoints at 5 (ok), 10 (fails), 15 (ok)
    with caplog.at_level(logging.ERROR, logger="swarm.node"):
        assert asyncio.run(node.run(15)) == 15
    assert node.checkpoint_errors == 1
    assert node.last_checkpoint_error is not None
    assert node.last_checkpoint_error.startswith("round 10: ENOSPC: [Errno 28]")
    failure = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failure) == 1 and "round-00000010" in failure[0]
    assert "No space left on device" in failure[0] and "round-00000005" in failure[0]
    records = read_metrics(node.data_dir / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, 16))
    # Disk full: the older checkpoint made room; the newest valid one (5) was kept, then
    # 15 succeeded. No temp dirs, no half-written round 10.
    assert _names(node.data_dir) == ["round-00000005", "round-00000015"]
    kept = checkpoints.checkpoint_dir(node.data_dir, 5)
    assert checkpoints.read_node_state(kept)["rounds_done"] == 5  # type: ignore[index]
    learner = _fresh_stub(node)
    assert learner.load(kept) == {"rounds_done": 5} and learner.policy_version == 5


def test_failed_node_state_write_removes_the_learner_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(tmp_path, every=2, fail=set())
    real = checkpoints.write_node_state
    calls = []

    def write_node_state(directory: Path, state: dict) -> None:
        calls.append(directory.name)
        if len(calls) == 2:
            (directory / ".node.json.tmp").write_text('{"rounds_do')
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(directory / ".node.json.tmp"))
        real(directory, state)

    monkeypatch.setattr(checkpoints, "write_node_state", write_node_state)
    assert asyncio.run(node.run(6)) == 6
    assert calls == ["round-00000002", "round-00000004", "round-00000006"]
    assert node.checkpoint_errors == 1 and "EIO" in str(node.last_checkpoint_error)
    # Not a disk-full errno: both valid checkpoints are kept (keep=2), round 4 is gone.
    assert _names(node.data_dir) == ["round-00000002", "round-00000006"]


@pytest.mark.parametrize(
    ("error", "left"),
    [
        (errno.ENOSPC, ["round-00000010"]),  # room made: only the newest valid one
        (errno.EDQUOT, ["round-00000010"]),
        (errno.EFBIG, ["round-00000005", "round-00000010"]),  # deleting would not help
    ],
)
def test_disk_full_deletes_older_checkpoints_but_never_the_newest(
    tmp_path: Path, error: int, left: list[str]
) -> None:
    node = _node(tmp_path, every=5, fail={3, 4}, error=error)  # 15 and the final 15 fail
    assert asyncio.run(node.run(15)) == 15
    assert node.checkpoint_errors == 2
    assert _names(node.data_dir) == left


def test_every_write_failing_leaves_no_checkpoint_and_raises_nothing(tmp_path: Path) -> None:
    node = _node(tmp_path, every=2, fail=set(range(1, 100)))
    assert asyncio.run(node.run(5)) == 5
    assert node.checkpoint_errors == 3  # rounds 2 and 4, and the final checkpoint at 5
    assert node.last_checkpoint_error is not None
    assert node.last_checkpoint_error.startswith("round 5: ENOSPC")
    assert _names(node.data_dir) == []
    assert len(read_metrics(node.data_dir / "metrics.jsonl")) == 5


# ---- prune and resume with torn and garbage checkpoints --------------------------------


def _state(rounds: int) -> dict[str, Any]:
    import random

    version, internal, gauss = random.Random(rounds).getstate()
    return {
        "rounds_done": rounds,
        "tasks": {"cursor": rounds * 4, "seed": 0},
        "pool": {"rng": [version, list(internal), gauss], "arrivals": 0},
        "senders": {"q": [123, 4]},
        "peer_id": "p",
        "model_id": "stub",
        "model_family": "stub",
    }


def _make(data_dir: Path, rounds: int, state: Any = "valid", files: bool = True) -> Path:
    directory = checkpoints.checkpoint_dir(data_dir, rounds)
    directory.mkdir(parents=True)
    if files:
        (directory / "stub.json").write_text('{"skill": 0.5, "version": 1}')
    if state == "valid":
        checkpoints.write_node_state(directory, _state(rounds))
    elif state is not None:
        (directory / checkpoints.NODE_STATE).write_text(json.dumps(state))
    return directory


def test_prune_keeps_the_newest_valid_and_removes_debris_older_than_it(tmp_path: Path) -> None:
    for rounds in (1, 3, 5):
        _make(tmp_path, rounds)
    _make(tmp_path, 2, state=None)  # learner renamed, killed before node.json: older
    _make(tmp_path, 4, state={"rounds_done": "4"})  # garbage node.json: ignored, kept
    _make(tmp_path, 7, state=None)  # newer than the newest valid: replaced when rewritten
    root = checkpoints.checkpoint_root(tmp_path)
    (root / ".round-00000006.tmp-1-abc").mkdir()
    (root / ".round-00000006.tmp-1-abc" / "model.safetensors").write_bytes(b"\0" * 10)
    checkpoints.prune(tmp_path, keep=2)
    assert _names(tmp_path) == [f"round-{r:08d}" for r in (3, 4, 5, 7)]
    checkpoints.prune(tmp_path, keep=1)
    assert _names(tmp_path) == [f"round-{r:08d}" for r in (4, 5, 7)]
    with pytest.raises(ValueError, match="keep must be at least 1"):
        checkpoints.prune(tmp_path, keep=0)
    assert checkpoints.is_valid(root / "round-00000005")


def test_prune_with_only_torn_checkpoints_deletes_no_round_dir(tmp_path: Path) -> None:
    _make(tmp_path, 1, state=None)
    _make(tmp_path, 2, state={"rounds_done": 2})
    checkpoints.prune(tmp_path)
    assert _names(tmp_path) == ["round-00000001", "round-00000002"]


GARBAGE: dict[str, Any] = {
    "list": [1, 2, 3],
    "rounds_done_string": {**_state(9), "rounds_done": "9"},
    "rounds_done_bool": {**_state(1), "rounds_done": True},
    "wrong_round": _state(8),
    "senders_negative_seq": {**_state(9), "senders": {"q": [-1, 4]}},
    "senders_not_pairs": {**_state(9), "senders": {"q": 5}},
    "tasks_not_dict": {**_state(9), "tasks": 9},
    "tasks_cursor_float": {**_state(9), "tasks": {"cursor": 1.5, "seed": 0}},
    "pool_rng_short": {**_state(9), "pool": {"rng": [3, [1, 2], None], "arrivals": 0}},
    "pool_rng_string": {**_state(9), "pool": {"rng": "x", "arrivals": 0}},
    "pool_arrivals_null": {**_state(9), "pool": {**_state(9)["pool"], "arrivals": None}},
    "peer_id_number": {**_state(9), "peer_id": 5},
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_node_state_is_not_valid(tmp_path: Path, name: str) -> None:
    directory = _make(tmp_path, 9, state=GARBAGE[name])
    assert not checkpoints.is_valid(directory)
    assert checkpoints.node_state_problem(_state(9), directory) is None


def test_resume_falls_back_past_garbage_and_torn_checkpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = stub_config(tmp_path, "g", external_groups=0)
    first = stub_node(config, MemoryNetwork("garbage-1"))
    asyncio.run(first.run(10))  # valid checkpoints at 5 and 10
    data = first.data_dir
    newest = checkpoints.checkpoint_dir(data, 10)
    state = json.loads((newest / "node.json").read_text())
    (newest / "node.json").write_text(json.dumps({**state, "pool": {"rng": [1], "arrivals": 0}}))
    torn = _make(data, 11, state=None)
    second = stub_node(config, MemoryNetwork("garbage-2"))
    with caplog.at_level(logging.WARNING, logger="swarm.node"):
        assert second.resume() == checkpoints.checkpoint_dir(data, 5)
    assert second.rounds_done == 5 and second.learner.policy_version == 5
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "round-00000010: bad node.json: pool.rng" in warned
    assert f"{torn}: no node.json" in warned
    asyncio.run(second.run(6))  # rounds 6..11: writes 10 and 11 anew
    assert checkpoints.read_node_state(newest)["pool"]["rng"] != [1]  # type: ignore[index]
    assert _names(data) == ["round-00000010", "round-00000011"]


def test_a_truncated_newest_checkpoint_is_rewritten_and_never_replaces_a_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by hand (issue 34): with a truncated weights file in the newest checkpoint,
    resume rightly fell back to the one before, but on reaching that round again the node
    took the torn directory for "already written" (node.json alone was checked), pruned
    the good older checkpoint as not among the newest two, and left only the torn one."""
    config = stub_config(tmp_path, "t", external_groups=0)
    first = stub_node(config, MemoryNetwork("truncated-1"))
    asyncio.run(first.run(10))  # valid checkpoints at 5 and 10
    data = first.data_dir
    newest = checkpoints.checkpoint_dir(data, 10)
    weights = newest / "stub.json"
    weights.write_bytes(weights.read_bytes()[:-3])  # truncated, node.json untouched
    assert not checkpoints.is_valid(newest)
    second = stub_node(config, MemoryNetwork("truncated-2"))
    with caplog.at_level(logging.WARNING, logger="swarm.node"):
        assert second.resume() == checkpoints.checkpoint_dir(data, 5)
    assert "stub.json has" in "\n".join(r.getMessage() for r in caplog.records)
    asyncio.run(second.run(5))  # rounds 6..10: round 10 is written anew
    assert checkpoints.is_valid(newest)
    assert _names(data) == ["round-00000005", "round-00000010"]
    third = stub_node(config, MemoryNetwork("truncated-3"))
    assert third.resume() == newest and third.rounds_done == 10


class _OtherModel(StubLearner):
    """Another model, whose weights do not fit a stub checkpoint (as a 135M model's do
    not fit the tiny model's: torch's load_state_dict raises a size mismatch)."""

    model_id = "other"

    def load(self, directory: Path) -> dict[str, Any]:
        raise ValueError(f"size mismatch loading {directory}")


def test_a_data_dir_of_another_model_is_refused_and_its_checkpoints_kept(
    tmp_path: Path,
) -> None:
    """Found by hand: pointing a node's config at another model kept its data dir, and
    the node skipped every checkpoint with a warning and trained from scratch, so that
    rounds later pruning would delete the first model's training."""
    config = stub_config(tmp_path, "m", external_groups=0)
    first = stub_node(config, MemoryNetwork("model-1"))
    asyncio.run(first.run(10))
    before = _names(first.data_dir)
    other = stub_node(config, MemoryNetwork("model-2"))
    other.learner = _OtherModel(config.sampler.group_size, config.rewards, skill=0.3)
    with pytest.raises(ConfigError, match="another model \\('stub', newest round-00000010\\)"):
        other.resume()
    assert _names(first.data_dir) == before
    again = stub_node(config, MemoryNetwork("model-3"))
    assert again.resume() == checkpoints.checkpoint_dir(first.data_dir, 10)


def test_a_data_dir_of_another_task_stream_is_a_clear_error(tmp_path: Path) -> None:
    """Issue 34: running examples/node-mqtt.toml after the README's tutorial reused
    runs/bob and died with a 102-line traceback (`ValueError: task stream state is for
    stream seed ...`)."""
    config = stub_config(tmp_path, "s", external_groups=0)
    first = stub_node(config, MemoryNetwork("stream-1"))
    asyncio.run(first.run(5))
    seed = first.config.tasks.seed  # derived from the node's key
    assert seed is not None
    reseeded = config.model_copy(
        update={"tasks": config.tasks.model_copy(update={"seed": seed + 1})}
    )
    other = stub_node(reseeded, MemoryNetwork("stream-2"))
    with pytest.raises(ConfigError, match=r"another task stream .*own node\.data_dir"):
        other.resume()


def test_copies_of_one_config_sample_their_own_tasks_and_keep_them_on_resume(
    tmp_path: Path,
) -> None:
    """Issue 34: two copies of examples/node-mqtt.toml ran with identical seeds (0/0) and
    identical task streams. A config without seeds gives each node seeds derived from
    its key; the same key after a restart gives the same seeds, so the node resumes its
    task stream."""

    def seedless(name: str) -> Any:
        config = stub_config(tmp_path, name, external_groups=0)
        return config.model_copy(
            update={
                "model": config.model.model_copy(update={"seed": None}),
                "tasks": config.tasks.model_copy(update={"seed": None}),
            }
        )

    a = stub_node(seedless("a"), MemoryNetwork("copies-a"), seed=1)
    b = stub_node(seedless("b"), MemoryNetwork("copies-b"), seed=2)
    assert a.config.model.seed is not None and a.config.tasks.seed is not None
    assert a.config.model.seed != b.config.model.seed
    assert a.config.tasks.seed != b.config.tasks.seed
    assert a.tasks.seed != b.tasks.seed
    asyncio.run(a.run(5))
    again = stub_node(seedless("a"), MemoryNetwork("copies-a2"), seed=1)
    assert (again.config.model.seed, again.config.tasks.seed) == (
        a.config.model.seed,
        a.config.tasks.seed,
    )
    assert again.resume() == checkpoints.checkpoint_dir(a.data_dir, 5)
    assert again.tasks.cursor == a.tasks.cursor


# ---- the metrics writer on a failing disk --------------------------------------------


def test_metrics_line_cut_short_by_a_full_disk_is_dropped_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    assert writer.write({"round": 1})
    real_write = os.write
    target = writer._fd

    def write(fd: int, data: Any) -> int:
        if fd != target:
            return real_write(fd, data)
        real_write(fd, bytes(data[:5]))  # part of the line reaches the disk, then it is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch, caplog.at_level(logging.ERROR, "swarm.node.metrics"):
        patch.setattr(os, "write", write)
        assert not writer.write({"round": 2, "pad": "x" * 100})
    assert path.read_bytes() == b'{"round": 1}\n'
    assert writer.dropped == 1 and "No space left" in str(writer.last_error)
    assert any("dropped a line (1 so far)" in r.getMessage() for r in caplog.records)
    assert writer.write({"round": 3})
    writer.close()
    assert [r["round"] for r in read_metrics(path)] == [1, 3]


def test_metrics_on_an_unopenable_path_never_raise(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    blocked = MetricsWriter(tmp_path / "file" / "metrics.jsonl")  # parent is not a dir
    assert not blocked.write({"round": 1}) and not blocked.write({"round": 2})
    assert blocked.dropped == 2 and "cannot open" in str(blocked.last_error)
    blocked.close()


def test_a_killed_writers_torn_last_line_is_cut_when_reopened(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2}\n{"round": 3, "tr')
    writer = MetricsWriter(path)
    writer.write({"round": 3})
    writer.close()
    assert [r["round"] for r in read_metrics(path)] == [1, 2, 3]
    path.write_text('{"round": 1, "no newline at all')
    MetricsWriter(path).close()
    assert path.read_bytes() == b""


METRICS_UNDER_RLIMIT = """
import json, resource, sys
from pathlib import Path
from node.metrics import MetricsWriter, read_metrics
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
writer = MetricsWriter(Path(sys.argv[1]))
results = [writer.write({"round": i, "pad": "x" * 90}) for i in range(20)]
writer.close()
print(json.dumps({"results": results, "dropped": writer.dropped, "error": writer.last_error}))
"""


def test_metrics_past_a_real_file_size_limit_drop_lines_and_keep_the_file_clean(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    run = subprocess.run(
        [sys.executable, "-c", METRICS_UNDER_RLIMIT, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=ENV,
        preexec_fn=_ignore_sigxfsz,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    written = sum(out["results"])
    assert 5 <= written < 20 and out["dropped"] == 20 - written
    assert "File too large" in out["error"]
    assert out["results"] == [True] * written + [False] * (20 - written)
    records = read_metrics(path)
    assert [r["round"] for r in records] == list(range(written))
    assert path.read_bytes().endswith(b"\n") and path.stat().st_size <= 1000


# ---- real processes ------------------------------------------------------------------

CONFIG: dict[str, Any] = {
    "node": {"name": "fault", "checkpoint_every": 1},
    "transport": {"type": "memory"},
    "model": {"name_or_path": "builtin:tiny", "seed": 0},
    "tasks": {"seed": 1000, "mixture": [{"source": "digit", "weight": 1.0}]},
    "sampler": {"group_size": 8, "max_new_tokens": 2},
    "train": {"learning_rate": 3e-4},
    "rewards": {"format_weight": 0.5},
    "sapo": {"local_groups": 4, "external_groups": 0},
}


def _ignore_sigxfsz() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer


def _limit_file_size(limit: int) -> Any:
    def preexec() -> None:
        _ignore_sigxfsz()
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def _config(tmp_path: Path, background: bool = True) -> Path:
    path = tmp_path / "fault.toml"
    node = {**CONFIG["node"], "background_checkpoints": background}
    path.write_text(tomli_w.dumps({**CONFIG, "node": node}))
    return path


def _train_args(config: Path, data: Path, rounds: int) -> list[str]:
    return ["train", "-c", str(config), "--rounds", str(rounds), "--data-dir", str(data)]


def _train(config: Path, data: Path, rounds: int, **kw: Any) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "cli.main", *_train_args(config, data, rounds)]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV, **kw
    )


def _valid_rounds(data: Path) -> list[int]:
    return [checkpoints.round_of(p) or 0 for p in reversed(checkpoints.valid_newest_first(data))]


def _manifest_version(data: Path, rounds: int) -> int:
    manifest = checkpoints.checkpoint_dir(data, rounds) / "manifest.json"
    return int(json.loads(manifest.read_text())["manifest"]["policy_version"])


def _assert_continues(before: dict[str, Any], after: dict[str, Any], version: int) -> None:
    """`after` is the first round trained after resuming from the checkpoint taken after
    round `before` (which saved policy `version`)."""
    assert after["round"] == before["round"] + 1
    assert version == before["policy_version"]
    # A round steps the optimizer once, or not at all if no group carried signal.
    assert version <= after["policy_version"] <= version + 1


def _hidden(data: Path) -> list[str]:
    return [p.name for p in checkpoints.checkpoint_root(data).iterdir() if p.name[0] == "."]


def _hang_then_kill(
    config: Path, data: Path, fault: str, at_round: int, tmp_path: Path
) -> subprocess.Popen:
    marker = tmp_path / f"hanging-{fault}"
    env = {
        **ENV,
        "SWARM_FAULT": fault,
        "SWARM_FAULT_ROUND": str(at_round),
        "SWARM_FAULT_MARKER": str(marker),
    }
    command = [sys.executable, "-m", "tests.node.fault_node", *_train_args(config, data, 1000)]
    with (tmp_path / f"{fault}.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT, env=env)
    deadline = time.monotonic() + 90
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError((tmp_path / f"{fault}.log").read_text()[-3000:])
        time.sleep(0.05)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_sigkill_mid_checkpoint_write_resumes_from_the_last_complete_one(
    tmp_path: Path, background: bool
) -> None:
    """Killed mid-write, a node resumes from the last complete checkpoint. A background
    write lets the next round train meanwhile (its metrics line may be written before the
    kill; that round is trained again after the restart), never a second write."""
    config, data = _config(tmp_path, background), tmp_path / "data"
    root = checkpoints.checkpoint_root(data)

    def allowed(first_round: int) -> list[list[int]]:
        """Metrics rounds of a run killed mid-write of the checkpoint of `first_round + 1`:
        a background write lets that round's line out, and the next round train."""
        done = list(range(first_round, first_round + 3))
        return [done[:n] for n in (1, 2, 3)] if background else [done[:1]]

    # 1. Killed inside the learner's save of round 3: a half-written model file in a temp dir.
    _kill(_hang_then_kill(config, data, "tensor_write", 3, tmp_path))
    (temp,) = [root / name for name in _hidden(data)]
    assert temp.name.startswith(".round-00000003.tmp-")
    model = temp / "model.safetensors"
    assert 0 < model.stat().st_size < (root / "round-00000002" / "model.safetensors").stat().st_size
    assert _valid_rounds(data) == [1, 2]
    first = read_metrics(data / "metrics.jsonl")
    assert [r["round"] for r in first][2:] in [rounds[1:] for rounds in allowed(2)]
    assert [r["round"] for r in first][:2] == [1, 2]

    # 2. Restarted: resumes from round 2, writes round 3 (the torn temp dir is cleaned up),
    # and is killed after the learner's rename of round 4, before its node.json.
    _kill(_hang_then_kill(config, data, "node_state", 4, tmp_path))
    assert _hidden(data) == []
    torn = root / "round-00000004"
    assert (torn / "model.safetensors").is_file() and (torn / ".node.json.tmp").is_file()
    assert not (torn / "node.json").exists()
    assert _valid_rounds(data) == [2, 3]
    second = read_metrics(data / "metrics.jsonl")[len(first) :]
    assert [r["round"] for r in second] in allowed(3)
    _assert_continues(first[1], second[0], _manifest_version(data, 2))

    # 3. Restarted without faults: resumes from round 3 (not the torn 4), trains on.
    version_3 = _manifest_version(data, 3)
    done = _train(config, data, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    third = read_metrics(data / "metrics.jsonl")[len(first) + len(second) :]
    assert [r["round"] for r in third] == [4, 5]
    _assert_continues(second[0], third[0], version_3)
    assert _valid_rounds(data) == [4, 5] and _hidden(data) == []
    assert not (torn / ".node.json.tmp").exists()  # round 4 was written anew
    assert _manifest_version(data, 5) == third[1]["policy_version"]


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir after `swarm train --rounds 2` with checkpoints at rounds 1 and 2."""
    base = tmp_path_factory.mktemp("base")
    data = base / "data"
    done = _train(_config(base), data, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _valid_rounds(data) == [1, 2]
    return data


@pytest.mark.slow
def test_checkpoints_past_a_file_size_limit_fail_without_losing_the_previous_one(
    tmp_path: Path, two_checkpoints: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(two_checkpoints, data)
    config = _config(tmp_path)
    model_size = (checkpoints.checkpoint_dir(data, 2) / "model.safetensors").stat().st_size
    limit = 256 * 1024  # every metrics line fits, no model file does: writes fail with EFBIG
    assert (data / "metrics.jsonl").stat().st_size * 10 < limit < model_size
    limited = _train(config, data, 3, preexec_fn=_limit_file_size(limit))
    assert limited.returncode == 1, limited.stderr[-3000:]
    stderr = " ".join(limited.stderr.split())
    assert "EFBIG: [Errno 27] File too large" in stderr
    assert "the final checkpoint (round 5) could not be written" in stderr
    assert "a restart resumes from round 2" in stderr
    assert "Traceback" not in stderr
    assert stderr.count("failed (EFBIG") == 4  # rounds 3, 4, 5 and the final one, logged
    records = read_metrics(data / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5]  # training went on
    assert _names(data) == ["round-00000001", "round-00000002"]  # nothing half-written

    version_2 = _manifest_version(data, 2)
    resumed = _train(config, data, 1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = read_metrics(data / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5, 3]  # round 3 again, from 2
    _assert_continues(records[1], records[5], version_2)
    assert _valid_rounds(data) == [2, 3]


def _tmpfs_problem(mountpoint: Path) -> str | None:
    """Why a tiny tmpfs cannot be mounted here without privileges (None if it can)."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    script = f"mount -t tmpfs -o size=1m tmpfs {mountpoint}"
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        return f"unprivileged tmpfs mount refused: {probe.stderr.strip()[:200]}"
    return None


@pytest.mark.slow
def test_a_full_tmpfs_fails_a_checkpoint_frees_room_and_the_next_one_succeeds(
    tmp_path: Path, two_checkpoints: Path
) -> None:
    mount = tmp_path / "mnt"
    mount.mkdir()
    problem = _tmpfs_problem(mount)
    if problem:
        pytest.skip(problem)
    out = tmp_path / "out"
    config = _config(tmp_path)
    used = sum(p.stat().st_size for p in two_checkpoints.rglob("*") if p.is_file())
    one = sum(p.stat().st_size for p in checkpoints.checkpoint_dir(two_checkpoints, 2).iterdir())
    # Room for the data there is now plus half a checkpoint: the round-3 write cannot fit
    # next to two checkpoints; after the oldest is deleted to make room, round 4 fits.
    size = used + one // 2 + 64 * 1024
    train = " ".join([sys.executable, "-m", "cli.main", *_train_args(config, mount, 2)])
    script = textwrap.dedent(f"""
        set -eu
        mkdir -p {out}
        mount -t tmpfs -o size={size} tmpfs {mount}
        cp -a {two_checkpoints}/. {mount}/
        rc=0; {train} > {tmp_path}/train.out 2> {tmp_path}/train.err || rc=$?
        echo $rc > {tmp_path}/train.rc
        df -B1 {mount} > {tmp_path}/df.txt
        cp -a {mount}/. {out}/
    """)
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=ENV,
    )
    stderr = (tmp_path / "train.err").read_text() if (tmp_path / "train.err").exists() else ""
    assert run.returncode == 0, run.stderr + stderr[-3000:]
    assert (tmp_path / "train.rc").read_text().strip() == "0", stderr[-3000:]
    flat = " ".join(stderr.split())
    assert "ENOSPC: [Errno 28] No space left on device" in flat
    assert "round-00000003 failed" in flat
    assert "1 checkpoint write(s) failed" in flat
    assert [r["round"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert _names(out) == ["round-00000002", "round-00000004"]
    assert _valid_rounds(out) == [2, 4]
