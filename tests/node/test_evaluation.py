"""Held-out evaluation and the samples log: fixed, never trained on, bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gossip.memory import MemoryNetwork
from node.build import apply_overrides
from node.evaluation import HeldOut, held_out_seed
from node.metrics import read_metrics
from node.samples import SamplesLog, read_samples
from rewards.mixture import TaskStream
from rewards.tasks import make_task
from swarm.config import parse_config
from swarm.identity import Identity
from swarm.messages import RolloutBatch, RolloutGroup
from tests.node.helpers import stub_config, stub_node
from tests.node.test_version_claims import batch, envelope_of


def test_held_out_set_is_fixed_and_apart_from_training() -> None:
    config = parse_config({"tasks": {"seed": 7}, "eval": {"num_tasks": 16}})
    a, b = HeldOut(config), HeldOut(config)
    assert a.refs == b.refs and len(a.refs) == 16
    training = TaskStream(config.tasks, config.model.seed).next_refs(1000)
    assert not {r.seed for r in training} & a.seeds
    assert held_out_seed(config) != config.tasks.seed
    fixed = parse_config({"eval": {"seed": 123}})
    assert held_out_seed(fixed) == 123
    assert [a.due(r) for r in range(0, 60, 25)] == [True, True, True]
    assert not a.due(1) and not HeldOut(parse_config({"eval": {"every": 0}})).due(0)


def test_peers_groups_of_our_held_out_tasks_are_refused(tmp_path: Path) -> None:
    node = stub_node(stub_config(tmp_path, "evaluator"), MemoryNetwork("held-out"))
    peer = Identity.from_seed(b"\x21" * 32)
    task = make_task(node.held_out.refs[0])
    group = RolloutGroup(
        task.ref, task.prompt, (task.answer, task.answer + "9"), (1.0, 0.0), "m", 0
    )

    async def scenario() -> None:
        await node.take(envelope_of(node, peer, RolloutBatch((group,)), 0, 1))
        await node.take(envelope_of(node, peer, batch(0, 0), 0, 2))  # an ordinary task

    asyncio.run(scenario())
    assert node.drops["held_out_task"] == 1
    assert not node.peer_faults  # not the peer's fault: it cannot know our seed
    assert len(node.pool) == 1


def test_a_real_node_evaluates_and_keeps_recent_samples(tmp_path: Path) -> None:
    from node.policy_learner import PolicyLearner
    from node.runner import Node

    config = apply_overrides(
        stub_config(tmp_path, "real"),
        {
            "eval": {"every": 3, "num_tasks": 6},
            "node": {"samples_keep": 4, "checkpoint_every": 100},
            "sapo": {"external_groups": 0, "local_groups": 2},
            "sampler": {"group_size": 4, "max_new_tokens": 2},
        },
        "test",
    )
    stub = stub_node(config, MemoryNetwork("real-eval"))
    node = Node(config, stub.gossip, PolicyLearner(config), stub.clock)
    asyncio.run(node.run(7))
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    evaluated = [r["round"] for r in records if r["eval"] is not None]
    assert evaluated == [1, 4, 7]  # at the start of rounds 0, 3, 6
    first = records[0]["eval"]
    assert first["n"] == 6 and 0.0 <= first["accuracy"] <= 1.0
    assert first["policy_version"] == 0  # before any training
    samples = read_samples(Path(config.node.data_dir) / "samples.jsonl")
    assert 4 <= len(samples) <= 8  # 14 groups written, trimmed to the newest 4 past 8
    assert samples[-1]["round"] == 7
    assert all(len(s["completions"]) == len(s["rewards"]) == 4 for s in samples)


def test_samples_log_is_bounded_and_skips_a_torn_line(tmp_path: Path) -> None:
    log = SamplesLog(tmp_path / "s.jsonl", keep=3)
    for i in range(20):
        log.append([{"i": i}])
    assert [r["i"] for r in read_samples(tmp_path / "s.jsonl")][-1] == 19
    assert len(read_samples(tmp_path / "s.jsonl")) <= 6
    with (tmp_path / "s.jsonl").open("a") as f:
        f.write('{"i": 2')
    assert read_samples(tmp_path / "s.jsonl")[-1]["i"] == 19
    assert read_samples(tmp_path / "s.jsonl", last=2)[-1]["i"] == 19
