"""TensorBoard and W&B backends, written by real (stub-learner) nodes and read back with
each tool's own reader (TensorBoard's event accumulator; W&B's record protobuf)."""

from __future__ import annotations

import asyncio
import glob
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gossip.memory import MemoryNetwork
from node.logging_backends import MetricBackends, WandbBackend, scalars
from node.metrics import read_metrics
from swarm.config import LoggingConfig, parse_config
from swarm.errors import ConfigError
from tests.node.helpers import stub_node

ROUNDS = 4


def _run_node(tmp_path: Path, logging: dict[str, Any]) -> list[dict[str, Any]]:
    config = parse_config(
        {
            "node": {"name": "logged", "data_dir": str(tmp_path / "node")},
            "transport": {"type": "memory"},
            "sapo": {"external_groups": 0},
            "logging": logging,
        }
    )
    asyncio.run(stub_node(config, MemoryNetwork(f"log-{tmp_path.name}")).run(ROUNDS))
    return read_metrics(tmp_path / "node" / "metrics.jsonl")


def test_scalars_flatten_a_metrics_line() -> None:
    record = {
        "round": 3,
        "policy_version": 2,
        "mean_local_reward": 0.25,
        "mean_external_reward": None,
        "eval": {"accuracy": 0.5},
        "external_groups": 1,
        "drops": {"zero_variance": 4},
        "seconds": {"train": 0.5, "total": 1.0},
        "publish_failed": {"closed": 2},
        "train": {"loss": -0.1, "note": "text"},
    }
    values = scalars(record)
    assert values["reward/local"] == 0.25 and "reward/external" not in values
    assert values["eval/accuracy"] == 0.5 and values["refused/zero_variance"] == 4
    assert values["seconds/train"] == 0.5 and values["swarm/publish_failed"] == 2
    assert values["train/loss"] == -0.1 and "train/note" not in values


def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = _run_node(tmp_path, {"backends": ["tensorboard"]})
    events = EventAccumulator(str(tmp_path / "node" / "tensorboard"))
    events.Reload()
    rewards = events.Scalars("reward/local")
    assert [e.step for e in rewards] == [r["round"] for r in records]
    assert [e.value for e in rewards] == pytest.approx([r["mean_local_reward"] for r in records])
    totals = events.Scalars("seconds/total")
    assert [e.value for e in totals] == pytest.approx([r["seconds"]["total"] for r in records])


def _wandb_history(run_file: Path) -> tuple[list[dict[str, Any]], bool]:
    """History rows of a .wandb file (LevelDB-style log blocks holding W&B Record
    protos), and whether the run's `exit` record is there yet."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pending, rows = run_file.read_bytes(), 32768, 7, b"", []
    exited = False
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header: padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            break
        if position + 7 + length > len(data):
            # The writer is mid-record (W&B's service process writes while we read):
            # what is here so far, and not exited, so the caller reads again.
            return rows, False
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            exited = exited or record.WhichOneof("record_type") == "exit"
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows, exited


def test_wandb_offline_run_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    records = _run_node(tmp_path, {"backends": ["wandb"], "wandb_mode": "offline"})
    (run_file,) = glob.glob(str(tmp_path / "node" / "wandb" / "offline-run-*" / "run-*.wandb"))
    # `run.finish()` can return before W&B's service process has written the file out;
    # wait (bounded) for the run's exit record, as a reader of the run would.
    deadline = time.monotonic() + 30.0
    rows, exited = _wandb_history(Path(run_file))
    while not exited and time.monotonic() < deadline:
        time.sleep(0.2)
        rows, exited = _wandb_history(Path(run_file))
    assert exited, "W&B never wrote the run's exit record"
    assert [row["_step"] for row in rows] == [r["round"] for r in records]
    assert [row["reward/local"] for row in rows] == pytest.approx(
        [r["mean_local_reward"] for r in records]
    )


class _Broken:
    name = "broken"

    def log(self, values: dict[str, float], step: int) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        pass


def test_a_failing_backend_is_turned_off_not_fatal() -> None:
    backends = MetricBackends([_Broken()])
    record = {"round": 1, "mean_local_reward": 0.5}
    backends.log(record)
    backends.log(record)
    assert backends.failures == 1 and backends.backends == []


def test_a_missing_package_names_the_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'swarm-rl\[wandb\]'"):
        WandbBackend(LoggingConfig(backends=["wandb"]), tmp_path, "n", "n-1", {})
