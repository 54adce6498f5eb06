"""Prefetch: round r+1's own groups are sampled once round r's policy is final, while the
node finishes round r (`node.own_samples`), and a checkpoint taken meanwhile resumes to
the same tasks."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gossip.memory import MemoryNetwork
from node import checkpoints
from node.metrics import read_metrics, round_seconds
from node.model_thread import ModelThread
from node.runner import Node
from swarm.config import NodeConfig, parse_config
from tests.node.helpers import stub_node


async def immediate(fn: Any, *args: Any) -> Any:
    """Offload that runs the call as soon as its task first runs (a worker that is free)."""
    return fn(*args)


def _config(tmp: Path, name: str, **node: Any) -> NodeConfig:
    return parse_config(
        {
            "node": {"name": name, "data_dir": str(tmp / name), "checkpoint_every": 2, **node},
            "transport": {"type": "memory"},
            "sapo": {"local_groups": 4, "external_groups": 0},
            "sampler": {"group_size": 8},
            "eval": {"every": 0},
        }
    )


def _node(config: NodeConfig, network: str) -> tuple[Node, list[tuple[int, list[Any]]]]:
    """A stub node whose own sampling calls are recorded as (seed, refs)."""
    node = stub_node(config, MemoryNetwork(network), offload=immediate)
    calls: list[tuple[int, list[Any]]] = []
    learner = node.learner
    sample = learner.sample

    def recording_sample(refs: list[Any], seed: int) -> Any:
        calls.append((seed, list(refs)))
        return sample(refs, seed)

    learner.sample = recording_sample  # type: ignore[method-assign]
    return node, calls


def test_the_next_round_is_sampled_before_this_round_ends(tmp_path: Path) -> None:
    node, calls = _node(_config(tmp_path, "p"), "prefetch-order")
    sampled_at_round_end: list[int] = []
    node.on_round = lambda report: sampled_at_round_end.append(len(calls))
    asyncio.run(node.run(5))
    # Round k's record is made after round k+1's sampling started; none after the last.
    assert sampled_at_round_end == [2, 3, 4, 5, 5]
    assert len(calls) == 5


def test_no_prefetch_before_a_held_out_evaluation(tmp_path: Path) -> None:
    config = _config(tmp_path, "e")
    config = config.model_copy(update={"eval": config.eval.model_copy(update={"every": 2})})
    node, calls = _node(config, "prefetch-eval")
    sampled_at_round_end: list[int] = []
    node.on_round = lambda report: sampled_at_round_end.append(len(calls))
    asyncio.run(node.run(5))
    # Rounds 3 and 5 start with an evaluation: rounds 2 and 4 leave their sampling to them.
    assert sampled_at_round_end == [2, 2, 4, 4, 5]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_checkpoint_taken_while_sampling_ahead_resumes_the_same_tasks(
    tmp_path: Path, overlap: bool
) -> None:
    config = _config(tmp_path, "c", background_checkpoints=False)
    first, first_calls = _node(config, f"prefetch-first-{overlap}")
    first.learner.sample_overlap = overlap  # type: ignore[attr-defined]
    asyncio.run(first.run(4))
    data_dir = Path(config.node.data_dir)
    # Round 2's checkpoint was taken while round 3 was being sampled: resume from it alone.
    shutil.rmtree(checkpoints.checkpoint_dir(data_dir, 4))
    second, second_calls = _node(config, f"prefetch-second-{overlap}")
    second.learner.sample_overlap = overlap  # type: ignore[attr-defined]
    resumed = second.resume()
    assert resumed == checkpoints.checkpoint_dir(data_dir, 2)
    asyncio.run(second.run(2))
    assert second_calls == first_calls[2:]  # rounds 3-4: same seeds, same task references


def test_round_seconds_sum_the_critical_phases_and_report_compute_apart() -> None:
    seconds = round_seconds(
        1.0, critical={"sample_wait": 0.1, "train": 0.7}, compute={"sample": 0.3, "score": 0.05}
    )
    assert seconds == {
        "sample_wait": 0.1,
        "train": 0.7,
        "other": 0.2,
        "total": 1.0,
        "sample": 0.3,  # sampled ahead: most of it hidden behind the previous round
        "score": 0.05,
    }


def test_a_prefetched_round_waits_only_for_what_the_last_one_did_not_hide(
    tmp_path: Path,
) -> None:
    """Sampling (50 ms in a worker thread) runs while the previous round finishes (30 ms
    of bookkeeping here, on the event loop): each round's sampling starts before the
    previous round's bookkeeping ends (an order of events, so a loaded machine cannot
    fail it), and the first round, with nothing sampled ahead, waits for all of it."""
    config = _config(tmp_path, "w")
    # Sampling and training in worker threads, but not on one in-order model thread.
    node = stub_node(
        config, MemoryNetwork("prefetch-wait"), offload=asyncio.to_thread,
        model_offload=asyncio.to_thread,
    )  # fmt: skip
    sample = node.learner.sample
    sample_starts: list[float] = []
    bookkeeping_ends: list[float] = []

    def slow_sample(refs: list[Any], seed: int) -> Any:
        sample_starts.append(time.perf_counter())
        time.sleep(0.05)
        return sample(refs, seed)

    def bookkeeping(report: Any) -> None:
        time.sleep(0.03)
        bookkeeping_ends.append(time.perf_counter())

    node.learner.sample = slow_sample  # type: ignore[method-assign]
    node.on_round = bookkeeping
    asyncio.run(node.run(4))
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    waits = [r["seconds"]["sample_wait"] for r in records]
    assert waits[0] >= 0.05  # nothing sampled ahead of the first round
    assert len(sample_starts) == 4 and len(bookkeeping_ends) == 4
    for r in range(1, 4):
        assert sample_starts[r] < bookkeeping_ends[r - 1], (sample_starts, bookkeeping_ends)


def test_on_the_model_thread_the_next_sampling_follows_training_without_the_loop(
    tmp_path: Path,
) -> None:
    """The next round's sampling is queued behind training on the model thread: it starts
    when training ends even while the event loop is blocked (here for 50 ms, right then):
    each sampling starts before the loop is free again (an order of events: had sampling
    waited for the loop, it would start after the block, which the loop runs first)."""
    config = _config(tmp_path, "m")
    node = stub_node(
        config, MemoryNetwork("prefetch-thread"), offload=asyncio.to_thread,
        model_offload=ModelThread("test-model"),
    )  # fmt: skip
    learner = node.learner
    sample, train = learner.sample, learner.train
    calls: list[tuple[str, float, float, int]] = []
    loop: asyncio.AbstractEventLoop | None = None
    unblocked: list[float] = []

    def block_the_loop() -> None:
        time.sleep(0.05)
        unblocked.append(time.perf_counter())

    def timed_sample(refs: list[Any], seed: int) -> Any:
        start = time.perf_counter()
        result = sample(refs, seed)
        calls.append(("sample", start, time.perf_counter(), threading.get_ident()))
        return result

    def timed_train(*args: Any) -> Any:
        start = time.perf_counter()
        result = train(*args)
        calls.append(("train", start, time.perf_counter(), threading.get_ident()))
        assert loop is not None
        loop.call_soon_threadsafe(block_the_loop)  # the loop is busy as training ends
        return result

    learner.sample, learner.train = timed_sample, timed_train  # type: ignore[method-assign]

    async def run() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        await node.run(4)

    asyncio.run(run())
    assert [c[0] for c in calls] == ["sample", "train"] * 4
    assert len({c[3] for c in calls}) == 1  # one thread for all of it
    next_samples = [c[1] for c in calls[2::2]]  # the samplings that followed a training
    assert len(next_samples) == 3 and len(unblocked) == 4
    assert all(start < free for start, free in zip(next_samples, unblocked, strict=False))
