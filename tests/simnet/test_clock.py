"""The virtual-time event loop: timers, tasks, deadlocks and fail-fast errors."""

from __future__ import annotations

import asyncio

import pytest

from simnet.clock import Scheduler, SimulationError, VirtualClock, run_now


def test_timers_run_in_time_order_and_time_jumps() -> None:
    scheduler = Scheduler()
    seen: list[tuple[float, str]] = []
    for name, at in (("b", 2.0), ("a", 1.0), ("d", 0.5), ("late", 3600.0)):
        scheduler.at(at, lambda n=name: seen.append((scheduler.now, n)))
    scheduler.run(lambda: None, until=3600.0)
    assert seen == [(0.5, "d"), (1.0, "a"), (2.0, "b"), (3600.0, "late")]
    with pytest.raises(SimulationError):
        scheduler.at(1.0, lambda: None)
    scheduler.close()


def test_tasks_sleep_in_virtual_time_and_create_tasks_like_production() -> None:
    scheduler = Scheduler()
    clock = VirtualClock(scheduler)
    wakes: list[float] = []

    async def child() -> str:
        await clock.sleep(0.25)
        return "child"

    async def body() -> None:
        for _ in range(3):
            await clock.sleep(1.5)
            wakes.append(clock.now())
        task = asyncio.create_task(child())  # as Node.run_round publishes
        assert await task == "child"
        wakes.append(clock.now())
        scheduler.finish()

    scheduler.run(lambda: scheduler.spawn(body(), "body"))
    assert wakes == [1.5, 3.0, 4.5, 4.75]
    scheduler.close()


def test_a_failing_task_or_callback_stops_the_run_with_its_error() -> None:
    scheduler = Scheduler()

    async def broken() -> None:
        await asyncio.sleep(1.0)
        raise ValueError("node bug")

    with pytest.raises(ValueError, match="node bug"):
        scheduler.run(lambda: scheduler.spawn(broken(), "broken"), until=10.0)
    scheduler.close()

    scheduler = Scheduler()

    def bad_callback() -> None:
        raise KeyError("callback bug")

    scheduler.at(2.0, bad_callback)
    with pytest.raises(KeyError, match="callback bug"):
        scheduler.run(lambda: None, until=10.0)
    scheduler.close()


def test_waiting_on_nothing_is_a_deadlock_not_a_hang() -> None:
    scheduler = Scheduler()

    async def waits_forever() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationError, match="deadlock"):
        scheduler.run(lambda: scheduler.spawn(waits_forever(), "stuck"))
    scheduler.close()


def test_cancelled_task_never_resumes() -> None:
    scheduler = Scheduler()
    clock = VirtualClock(scheduler)
    wakes: list[float] = []

    async def ticker() -> None:
        while True:
            await clock.sleep(1.0)
            wakes.append(clock.now())

    def start() -> None:
        task = scheduler.spawn(ticker(), "ticker")
        scheduler.at(2.5, task.cancel)

    scheduler.run(start, until=10.0)
    assert wakes == [1.0, 2.0]
    scheduler.close()


def test_run_now_refuses_a_coroutine_that_suspends() -> None:
    async def finishes() -> int:
        return 7

    async def suspends() -> None:
        await asyncio.sleep(0)  # a bare yield to the loop

    assert run_now(finishes()) == 7
    with pytest.raises(SimulationError):
        run_now(suspends())
