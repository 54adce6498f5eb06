"""Re-scoring workers: same results as in-process, killed at the limit, bounded queue."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from node.rescore import Refused, Rescored, rescore_group
from node.workers import InlineRescorer, RescoreWorkers
from rewards.tasks import make_task
from swarm.config import RewardsConfig
from swarm.messages import RolloutGroup, TaskRef
from tests.rewards import slow_source

PRELOAD = (slow_source.MODULE,)
"""Workers import the test-only sources (a module, so that a spawned worker has them)."""
ENOUGH_S = 120.0
"""Time limit for jobs that return at once (never reached; no timing is asserted)."""


def group(source: str, index: int, completions: tuple[str, ...], seed: int = 3) -> RolloutGroup:
    """A group for a real reference; "<true>" in a completion becomes the ground truth."""
    task = make_task(TaskRef(source, seed, index))
    texts = tuple(c.replace("<true>", task.answer) for c in completions)
    return RolloutGroup(task.ref, task.prompt, texts, tuple(0.0 for _ in texts), "m", 0)


def bare(source: str, prompt: str = "p", index: int = 0) -> RolloutGroup:
    """A group whose task is never generated here (test-only or refused sources)."""
    return RolloutGroup(TaskRef(source, 0, index), prompt, ("a", "b"), (0.0, 1.0), "m", 0)


def cases() -> list[RolloutGroup]:
    rg = "rg:basic_arithmetic"
    wrong_prompt = group("add", 5, ("<true>", "x"))
    return [
        group("add", 1, ("<true>", "x", "<true>")),
        group("add", 2, ("<true>", "<true>")),  # zero_variance
        group("copy", 3, ("<true>", "zz", "<answer><true></answer>")),
        RolloutGroup(wrong_prompt.task, "9+9=", wrong_prompt.completions, (1.0, 0.0), "m", 0),
        group(rg, 4, ("<answer><true></answer>", "<answer>nope</answer>", "7")),
        bare(rg, index=2**31 - 1),  # past the dataset's last index: unknown_task
        bare("nope"),  # unknown_task
        bare("rg:composite"),  # broken on every reference: task_error
        bare("rg:isomorphic_strings"),  # nondeterministic_task
        bare(slow_source.RAISE),  # the generator raises: task_error
    ]


def in_process(g: RolloutGroup, config: RewardsConfig) -> Rescored | str:
    try:
        return rescore_group(g, config)
    except Refused as refused:
        return refused.reason


async def through(rescore: Callable[[RolloutGroup], Awaitable[Rescored]], g: RolloutGroup) -> Any:
    try:
        return await rescore(g)
    except Refused as refused:
        return refused.reason


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_workers_and_inline_give_exactly_the_in_process_result() -> None:
    config = RewardsConfig(format_weight=0.5)
    groups = cases()
    expected = [in_process(g, config) for g in groups]
    reasons = {e for e in expected if isinstance(e, str)}
    assert reasons == {
        "zero_variance",
        "prompt_mismatch",
        "unknown_task",
        "task_error",
        "nondeterministic_task",
    }
    assert sum(isinstance(e, Rescored) for e in expected) == 3

    async def go() -> tuple[list[Any], list[Any], dict[str, Any]]:
        workers = RescoreWorkers(config, workers=2, timeout_s=ENOUGH_S, preload=PRELOAD)
        inline = InlineRescorer(config)
        await workers.start()
        try:
            pooled = list(await asyncio.gather(*(through(workers.rescore, g) for g in groups)))
            direct = [await through(inline.rescore, g) for g in groups]
            return pooled, direct, workers.stats()
        finally:
            await workers.close()

    pooled, direct, stats = run(go())
    assert pooled == expected
    assert direct == expected
    assert stats["jobs"] == len(groups) and stats["timeouts"] == 0
    assert stats["refused"] == {
        "nondeterministic_task": 1,
        "prompt_mismatch": 1,
        "task_error": 2,
        "unknown_task": 2,
        "zero_variance": 1,
    }


def test_a_job_that_never_returns_is_killed_and_the_next_job_works() -> None:
    config = RewardsConfig()
    ok = group("add", 1, ("<true>", "x"))

    async def go() -> tuple[Any, Any, int | None, dict[str, Any], Any]:
        workers = RescoreWorkers(config, workers=1, timeout_s=0.5, preload=PRELOAD)
        await workers.start()
        try:
            first_pid = workers._slots[0].worker.pid  # type: ignore[union-attr]
            hung = await through(workers.rescore, bare(slow_source.HANG))
            after = await through(workers.rescore, ok)
            return hung, after, first_pid, workers.stats(), workers._slots[0].worker
        finally:
            await workers.close()

    hung, after, first_pid, stats, worker = run(go())
    assert hung == "task_timeout"
    assert after == rescore_group(ok, config)
    assert first_pid is not None and worker is not None and worker.pid != first_pid
    with pytest.raises(ProcessLookupError):
        os.kill(first_pid, 0)  # killed and reaped: nothing of the hung job keeps running
    assert stats["timeouts"] == 1 and stats["workers_restarted"] == 1
    assert stats["refused"] == {"task_timeout": 1} and stats["jobs"] == 1


def test_a_worker_that_dies_is_a_task_error_and_is_replaced() -> None:
    config = RewardsConfig()
    ok = group("add", 7, ("<true>", "x"))

    async def go() -> tuple[Any, Any, dict[str, Any]]:
        workers = RescoreWorkers(config, workers=1, timeout_s=ENOUGH_S, preload=PRELOAD)
        await workers.start()
        try:
            died = await through(workers.rescore, bare(slow_source.CRASH))
            return died, await through(workers.rescore, ok), workers.stats()
        finally:
            await workers.close()

    died, after, stats = run(go())
    assert died == "task_error"
    assert after == rescore_group(ok, config)
    assert stats["worker_deaths"] == 1 and stats["workers_restarted"] == 1


def test_the_queue_bound_refuses_and_counts_and_queued_jobs_still_run() -> None:
    config = RewardsConfig()
    ok = [group("add", i, ("<true>", "x")) for i in range(3)]

    async def go() -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
        workers = RescoreWorkers(config, workers=1, timeout_s=1.0, max_queued=2, preload=PRELOAD)
        await workers.start()
        try:
            hung = asyncio.create_task(through(workers.rescore, bare(slow_source.HANG)))
            while workers.stats()["running"] == 0:  # the worker has taken the hung job
                await asyncio.sleep(0.01)
            queued = [asyncio.create_task(through(workers.rescore, g)) for g in ok[:2]]
            await asyncio.sleep(0)  # both are queued now (the worker is busy)
            with pytest.raises(Refused) as full:
                await workers.rescore(ok[2])
            assert full.value.reason == "rescore_queue_full"
            during = workers.stats()
            results = [await hung, *[await q for q in queued]]
            return results, during, workers.stats()
        finally:
            await workers.close()

    results, during, after = run(go())
    assert during["queued"] == 2 and during["queue_drops"] == 1
    assert results[0] == "task_timeout"
    assert results[1:] == [rescore_group(g, config) for g in ok[:2]]
    assert after["queue_drops"] == 1 and after["queued"] == 0
    assert after["refused"] == {"rescore_queue_full": 1, "task_timeout": 1}


def test_a_group_cannot_be_rescored_before_start_or_after_close() -> None:
    async def go() -> None:
        workers = RescoreWorkers(RewardsConfig(), workers=1)
        with pytest.raises(RuntimeError):
            await workers.rescore(bare("add"))
        await workers.start()
        await workers.close()
        with pytest.raises(RuntimeError):
            await workers.rescore(bare("add"))

    run(go())


def test_from_config_uses_the_rewards_section() -> None:
    config = RewardsConfig(rescore_workers=3, rescore_timeout_s=7.5, max_queued_rescores=9)
    workers = RescoreWorkers.from_config(config)
    assert (workers.workers, workers.timeout_s, workers.max_queued) == (3, 7.5, 9)
