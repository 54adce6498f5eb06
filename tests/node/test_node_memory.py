"""Real `Node` round loops over the memory transport with the stub learner."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gossip import layer as gossip_layer
from gossip.memory import MemoryNetwork
from node import checkpoints
from node.metrics import read_metrics
from node.resume import OWN_SEQ_RESERVE
from tests.node.helpers import stub_config, stub_node


async def _run_all(nodes: list, rounds: int) -> None:
    async def one(node):  # type: ignore[no-untyped-def]
        # Yield between rounds so peers' messages interleave like real concurrent nodes.
        await node.run(rounds)

    await asyncio.gather(*(one(n) for n in nodes))


def test_three_nodes_share_and_use_each_others_groups(tmp_path: Path) -> None:
    network = MemoryNetwork("three")
    configs = [stub_config(tmp_path, f"n{i}") for i in range(3)]
    nodes = [stub_node(c, network, seed=i) for i, c in enumerate(configs)]
    asyncio.run(_run_all(nodes, 12))
    ids = [n.peer_id for n in nodes]
    for node, config in zip(nodes, configs, strict=True):
        records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
        assert [r["round"] for r in records] == list(range(1, 13))
        used = set()
        for record in records:
            used.update(record["external_by_sender"])
            assert record["external_groups"] <= 4
        others = set(ids) - {node.peer_id}
        assert used == others, f"{node.peer_id} used {used}"
        assert checkpoints.latest_valid(Path(config.node.data_dir)) is not None
    # A restart remembers each sender's highest seq: replays from before it stay refused.
    restarted = stub_node(configs[0], MemoryNetwork("restart"), seed=0)
    assert restarted.resume() is not None
    for other in nodes[1:]:
        seq = restarted.sender_versions.highest_seq(other.peer_id)
        assert seq is not None
        assert restarted.gossip._seen.has_pair(other.peer_id, seq)


def test_silo_node_trains_alone(tmp_path: Path) -> None:
    config = stub_config(tmp_path, "solo", external_groups=0)
    node = stub_node(config, MemoryNetwork("solo"))
    asyncio.run(node.run(6))
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    assert len(records) == 6
    assert all(r["external_groups"] == 0 for r in records)
    assert node.learner.policy_version == 6


def test_resume_continues_round_and_version(tmp_path: Path) -> None:
    config = stub_config(tmp_path, "r", external_groups=0)
    first = stub_node(config, MemoryNetwork("resume-1"))
    asyncio.run(first.run(7))
    second = stub_node(config, MemoryNetwork("resume-2"))
    resumed = second.resume()
    assert resumed is not None and resumed.name == "round-00000007"
    assert second.rounds_done == 7
    assert second.learner.policy_version == 7
    assert second.tasks.cursor == first.tasks.cursor
    asyncio.run(second.run(3))
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, 11))
    assert [r["policy_version"] for r in records][-1] == 10


def test_torn_checkpoint_is_ignored(tmp_path: Path) -> None:
    config = stub_config(tmp_path, "t", external_groups=0)
    node = stub_node(config, MemoryNetwork("torn"))
    asyncio.run(node.run(5))
    torn = checkpoints.checkpoint_dir(Path(config.node.data_dir), 99)
    torn.mkdir(parents=True)
    (torn / "node.json").write_text('{"rounds_done": 9')
    assert checkpoints.latest_valid(Path(config.node.data_dir)).name == "round-00000005"


def test_a_resume_with_the_clock_behind_still_sends_new_seqs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seqs start at the wall clock in microseconds; a checkpoint reserves those above its
    next one, so a node resumed with its clock an hour behind continues above every seq
    it ever sent (peers remember them as replay floors)."""
    config = stub_config(tmp_path, "c", external_groups=0)
    first = stub_node(config, MemoryNetwork("clock-1"))
    asyncio.run(first.run(7))  # the last checkpoint is round 5's: rounds 6-7 sent more
    sent = first.gossip.next_seq - 1
    hour_ago = time.time_ns() - 3600 * 10**9
    monkeypatch.setattr(gossip_layer.time, "time_ns", lambda: hour_ago)
    second = stub_node(config, MemoryNetwork("clock-2"))
    assert second.gossip.next_seq < sent  # what the clock alone would give
    assert second.resume() is not None
    assert second.gossip.next_seq > sent
    peer = stub_node(stub_config(tmp_path, "peer"), MemoryNetwork("clock-3"), seed=5)
    peer.gossip.remember_seqs({first.peer_id: sent})
    assert not peer.gossip._seen.has_pair(first.peer_id, second.gossip.next_seq)
    # The jump is bounded by the reservation (seqs stay far below 2**53 for JSON peers).
    assert second.gossip.next_seq < sent + 2 * OWN_SEQ_RESERVE


def test_a_library_fallback_shows_in_the_metrics_line_and_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fallback taken because a library internal is gone (`swarm.internals.degraded`)
    was only a log line (issue 34): the metrics line and `swarm status` carry the count."""
    from node.progress import status_table
    from swarm import internals

    monkeypatch.setattr(internals, "DEGRADED", internals.Counter({"transformers": 3}))
    monkeypatch.setattr("node.round_record.DEGRADED", internals.DEGRADED)
    config = stub_config(tmp_path, "solo", external_groups=0)
    asyncio.run(stub_node(config, MemoryNetwork("degraded")).run(2))
    data_dir = Path(config.node.data_dir)
    assert read_metrics(data_dir / "metrics.jsonl")[-1]["degraded"] == {"transformers": 3}
    rows = [str(c) for col in status_table(data_dir, 2).columns for c in col._cells]
    assert "transformers: 3" in rows
