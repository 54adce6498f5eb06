"""metrics.jsonl rotated into compressed segments: every record read once and in order,
whenever a crash comes; segments bounded; a node's outputs and the dashboard follow it."""

from __future__ import annotations

import asyncio
import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from gossip.memory import MemoryNetwork
from node import metrics_segments
from node.dashboard.follow import DataDirFollower
from node.metrics import MetricsWriter, read_metrics
from node.metrics_segments import (
    complete_records,
    compress,
    iter_metrics,
    list_segments,
    rotate,
    tidy,
)
from node.round_outputs import RoundOutputs
from swarm.config import parse_config
from tests.node.helpers import stub_config, stub_node

_TEMPLATE: dict[str, Any] | None = None


def _real_record() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        config = stub_config(Path(tmp), "template")
        asyncio.run(stub_node(config, MemoryNetwork("template"), seed=0).run(1))
        return read_metrics(Path(config.node.data_dir) / "metrics.jsonl")[0]


def _record(round_: int, pad: int = 200) -> dict[str, Any]:
    """A real node's metrics line (a short silo run, once), renumbered and padded."""
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = _real_record()
    return {**_TEMPLATE, "round": round_, "time": float(round_), "pad": "x" * pad}


def _write(writer: MetricsWriter, rounds: range) -> list[Path]:
    rotated = []
    for r in rounds:
        assert writer.write(_record(r))
        segment = writer.take_rotated()
        if segment is not None:
            rotated.append(segment)
    return rotated


def _rounds(live: Path) -> list[int]:
    return [r["round"] for r in iter_metrics(live)]


def test_rotation_keeps_every_record_in_order_plain_and_compressed(tmp_path: Path) -> None:
    live = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(live, rotate_bytes=2000)
    rotated = _write(writer, range(1, 101))
    writer.close()
    assert len(rotated) >= 5
    assert [p.name for _, p in list_segments(live)] == [p.name for p in rotated]
    for path in rotated:  # each segment ends with a whole line
        assert path.read_bytes().endswith(b"\n")
    assert _rounds(live) == list(range(1, 101))
    tidy(live, None)
    assert all(p.suffix == ".gz" for _, p in list_segments(live))
    assert not list(tmp_path.glob("metrics-*.jsonl"))
    assert read_metrics(live) == [_record(r) for r in range(1, 101)]
    assert read_metrics(str(live)) == read_metrics(live)  # as before segments: a str path
    # A restarted writer goes on after the newest segment.
    writer = MetricsWriter(live, rotate_bytes=2000)
    more = _write(writer, range(101, 131))
    writer.close()
    assert more and more[0].name > rotated[-1].name
    assert _rounds(live) == list(range(1, 131))


def test_a_crash_anywhere_in_compressing_loses_and_doubles_nothing(tmp_path: Path) -> None:
    live = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(live, rotate_bytes=3000)
    rotated = _write(writer, range(1, 41))
    writer.close()
    first = rotated[0]
    # Killed after the .gz was renamed in place but before the plain file was removed:
    gz = first.with_name(first.name + ".gz")
    with first.open("rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    # ... and another one killed while writing its temporary file:
    second = rotated[1]
    (second.with_name(second.name + ".gz.tmp")).write_bytes(b"\x1f\x8b partial")
    assert _rounds(live) == list(range(1, 41))
    tidy(live, None)
    assert not list(tmp_path.glob("*.tmp"))
    assert [p.suffix for _, p in list_segments(live)] == [".gz"] * len(rotated)
    assert _rounds(live) == list(range(1, 41))


def test_pruning_keeps_the_first_segment_and_the_newest_within_the_budget(
    tmp_path: Path,
) -> None:
    live = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(live, rotate_bytes=5000)
    _write(writer, range(1, 201))
    writer.close()
    tidy(live, None)
    segments = list_segments(live)
    sizes = [p.stat().st_size for _, p in segments]
    budget = sizes[0] + sizes[-1] + sizes[-2]
    tidy(live, budget)
    kept = list_segments(live)
    assert [n for n, _ in kept] == [segments[0][0], segments[-2][0], segments[-1][0]]
    rounds = _rounds(live)
    assert rounds[0] == 1 and rounds[-1] == 200  # the run's start and its newest rounds
    assert rounds == sorted(rounds) and len(rounds) < 200


def test_a_corrupt_line_in_a_segment_is_named(tmp_path: Path) -> None:
    live = tmp_path / "metrics.jsonl"
    live.write_text(json.dumps(_record(1)) + "\n{not json\n")
    segment = rotate(live)
    live.write_text(json.dumps(_record(3)) + "\n")
    try:
        read_metrics(live)
    except ValueError as exc:
        assert f"{segment}:2" in str(exc)
    else:
        raise AssertionError("a corrupt line in a segment was read")


def test_a_nodes_outputs_rotate_and_compress_behind(tmp_path: Path) -> None:
    config = parse_config(
        {
            "node": {"data_dir": str(tmp_path / "n"), "metrics_rotate_mb": 1},
            "transport": {"type": "memory"},
        }
    )
    outputs = RoundOutputs(config, "peer-" + "0" * 40)
    for r in range(1, 26):  # 25 records of 100 KB: two rotations
        outputs.write(_record(r, pad=100_000), [], [])
    outputs.close()
    live = tmp_path / "n" / "metrics.jsonl"
    segments = list_segments(live)
    assert [p.name for _, p in segments] == ["metrics-000001.jsonl.gz", "metrics-000002.jsonl.gz"]
    assert sum(p.stat().st_size for _, p in segments) < 100_000  # compressed
    assert _rounds(live) == list(range(1, 26))


def test_the_dashboard_follows_a_file_across_rotations(tmp_path: Path) -> None:
    live = tmp_path / "metrics.jsonl"
    line = len(json.dumps(_record(10), sort_keys=True)) + 1
    writer = MetricsWriter(live, rotate_bytes=10 * line)  # a segment per 10 rounds
    follower = DataDirFollower(tmp_path)
    _write(writer, range(1, 8))
    assert follower.poll() == 7
    summary = follower.summary
    # Rotated, the segment still plain: its rest is read from it, the summary goes on.
    assert len(_write(writer, range(8, 16))) == 1
    assert follower.poll() == 8
    assert follower.summary is summary
    # Rotated and already compressed before the next poll: the same.
    rotated = _write(writer, range(16, 24))
    assert len(rotated) == 1
    compress(rotated[0])
    assert follower.poll() == 8
    assert follower.summary is summary
    # Two rotations between polls: read again from the segments, the same summary.
    assert len(_write(writer, range(24, 45))) == 2
    assert follower.poll() == 44
    assert summary.final is not None and summary.final["round"] == 23
    summary = follower.summary
    assert summary.rounds_seen == 44 and summary.final is not None
    assert summary.final["round"] == 44
    # A dashboard started later reads the segments first.
    later = DataDirFollower(tmp_path)
    assert later.poll() == 44
    assert later.summary.summary() == summary.summary()
    writer.close()


def test_a_segment_compressed_between_listing_and_reading_is_read_from_its_gz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`swarm status` lists the segments, then the node's writer thread compresses one
    (and removes the plain file) before status opens it."""
    live = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(live, rotate_bytes=3000)
    rotated = _write(writer, range(1, 21))
    writer.close()
    listed = metrics_segments.list_segments(live)

    def listed_then_compressed(path: Path) -> list[tuple[int, Path]]:
        for segment in rotated:
            if segment.exists():
                compress(segment)
        return listed

    monkeypatch.setattr(metrics_segments, "list_segments", listed_then_compressed)
    assert _rounds(live) == list(range(1, 21))


def test_a_line_being_written_while_read_lazily_is_not_called_corrupt(tmp_path: Path) -> None:
    """A lazy reader can reach the end of the file in the middle of the line the node is
    writing, and find its rest on the next read. Found by the full suite (the MQTT outage
    test read `...:24: corrupt metrics line`): reading stops at the first line without
    its newline."""
    one, two, three = (json.dumps(_record(r)).encode() + b"\n" for r in (1, 2, 3))
    live = tmp_path / "metrics.jsonl"
    as_read = [one, two[:40], two[40:], three]  # EOF hit mid-line 2, then its rest
    assert [r["round"] for r in complete_records(as_read, live)] == [1]
    assert [r["round"] for r in complete_records([one, two, three[:-1]], live)] == [1, 2, 3]
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: corrupt"):
        list(complete_records([one, b"{not json\n", three], live))
