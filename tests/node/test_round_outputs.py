"""A round's outputs: the metrics line at once, samples / peer table / backends written
behind in one writer thread, in order, the peer table never older than the newest handed
over, everything on disk once `close` returns."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from node import round_outputs
from node.learner import LocalGroup
from node.metrics import read_metrics
from node.peer_table import PeerTableFile, read_peer_table
from node.round_outputs import RoundOutputs
from node.samples import read_samples
from swarm.config import parse_config
from swarm.messages import TaskRef


def _outputs(tmp_path: Path) -> RoundOutputs:
    config = parse_config(
        {
            "node": {"name": "out", "data_dir": str(tmp_path / "out"), "samples_keep": 100},
            "transport": {"type": "memory"},
        }
    )
    return RoundOutputs(config, "peer-" + "0" * 40)


def _record(round_: int) -> dict[str, Any]:
    return {"round": round_, "sampled_version": round_ - 1, "time": 100.0 + round_}


def _groups(round_: int) -> list[LocalGroup]:
    return [LocalGroup(TaskRef("digit", 7, round_), f"q{round_}", ("a", "b"), (1.0, 0.0))]


def _rows(round_: int) -> list[dict[str, Any]]:
    return [{"peer": "p", "last_seen_s": float(round_)}]


def _blocked_table_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, list[tuple[int, str]]]:
    """Peer-table writes wait for the returned event; each records (round, thread name)."""
    release = threading.Event()
    calls: list[tuple[int, str]] = []
    write = PeerTableFile.write

    def blocked(self: PeerTableFile, rows: list[dict[str, Any]], *, round_: int,
                time: float) -> None:  # fmt: skip
        calls.append((round_, threading.current_thread().name))
        assert release.wait(10), "never released"
        write(self, rows, round_=round_, time=time)

    monkeypatch.setattr(PeerTableFile, "write", blocked)
    return release, calls


def _wait_for(calls: list[tuple[int, str]], n: int) -> None:
    deadline = time.monotonic() + 10
    while len(calls) < n:
        assert time.monotonic() < deadline, "the writer thread never got there"
        time.sleep(0.001)


def test_only_the_metrics_line_is_written_on_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, calls = _blocked_table_writes(monkeypatch)
    release.set()
    outputs = _outputs(tmp_path)
    outputs.write(_record(1), _groups(1), _rows(1))
    # The round's metrics line is complete before the next round starts.
    assert [r["round"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")] == [1]
    outputs.close()
    assert [name for _, name in calls] != [threading.current_thread().name]
    assert all(name.startswith("round-outputs") for _, name in calls)
    table = read_peer_table(tmp_path / "out" / "peers.json")
    assert table == {"round": 1, "time": 101.0, "peers": _rows(1)}


def test_a_slow_disk_writes_the_newest_table_only_and_every_samples_line_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, calls = _blocked_table_writes(monkeypatch)
    outputs = _outputs(tmp_path)
    outputs.write(_record(1), _groups(1), _rows(1))
    _wait_for(calls, 1)  # round 1's table write hangs while rounds 2-5 finish
    for round_ in range(2, 6):
        outputs.write(_record(round_), _groups(round_), _rows(round_))
    assert [r["round"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    release.set()
    outputs.close()
    # Tables 2-4 were superseded before the writer got to them: never written, and the
    # file never went back in time.
    assert [round_ for round_, _ in calls] == [1, 5]
    assert read_peer_table(tmp_path / "out" / "peers.json") == {
        "round": 5,
        "time": 105.0,
        "peers": _rows(5),
    }
    samples = read_samples(tmp_path / "out" / "samples.jsonl")
    assert [(s["round"], s["prompt"]) for s in samples] == [(r, f"q{r}") for r in range(1, 6)]


def test_a_writer_far_behind_drops_samples_not_the_newest_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(round_outputs, "MAX_BEHIND", 3)
    release, calls = _blocked_table_writes(monkeypatch)
    outputs = _outputs(tmp_path)
    outputs.write(_record(1), _groups(1), _rows(1))
    _wait_for(calls, 1)  # round 1 is done but for its table, which hangs
    for round_ in range(2, 8):
        outputs.write(_record(round_), _groups(round_), _rows(round_))
    assert outputs.dropped_behind == 4  # rounds 4-7 found rounds 1-3 not written
    release.set()
    outputs.close()
    assert [s["round"] for s in read_samples(tmp_path / "out" / "samples.jsonl")] == [1, 2, 3]
    assert read_peer_table(tmp_path / "out" / "peers.json")["round"] == 7  # type: ignore[index]
    assert len(read_metrics(tmp_path / "out" / "metrics.jsonl")) == 7


def test_a_bug_in_the_writer_thread_surfaces_at_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = _outputs(tmp_path)

    def broken(records: list[dict[str, Any]]) -> None:
        raise RuntimeError("a bug, not a full disk")

    assert outputs.samples is not None
    monkeypatch.setattr(outputs.samples, "append", broken)
    outputs.write(_record(1), _groups(1), _rows(1))
    outputs.flush()
    # The table is still written after the failed samples append.
    assert read_peer_table(tmp_path / "out" / "peers.json")["round"] == 1  # type: ignore[index]
    with pytest.raises(RuntimeError, match="a bug"):
        outputs.write(_record(2), _groups(2), _rows(2))
    outputs.close()


def test_an_unwritable_peer_table_is_counted_not_raised(tmp_path: Path) -> None:
    outputs = _outputs(tmp_path)
    (tmp_path / "out" / "peers.json.tmp").mkdir()  # the temporary file cannot be written
    outputs.write(_record(1), _groups(1), _rows(1))
    outputs.write(_record(2), _groups(2), _rows(2))
    outputs.close()
    assert outputs.peers.failed_writes >= 1
    assert len(read_samples(tmp_path / "out" / "samples.jsonl")) == 2


def test_logger_backends_get_every_rounds_scalars_in_order_off_the_calling_thread(
    tmp_path: Path,
) -> None:
    logged: list[tuple[int, dict[str, float], str]] = []

    class Recording:
        name = "recording"

        def log(self, values: dict[str, float], step: int) -> None:
            logged.append((step, values, threading.current_thread().name))

        def close(self) -> None:
            pass

    outputs = _outputs(tmp_path)
    outputs.backends.backends.append(Recording())
    for round_ in range(1, 4):
        outputs.write({**_record(round_), "peers": round_}, _groups(round_), _rows(round_))
    outputs.close()
    assert [(step, values["swarm/peers"]) for step, values, _ in logged] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
    ]
    assert all(name.startswith("round-outputs") for _, _, name in logged)
