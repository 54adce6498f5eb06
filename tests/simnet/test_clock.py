"""The virtual clock, the scheduler and coroutine processes."""

from __future__ import annotations

import asyncio

import pytest

from simnet.clock import Process, Scheduler, SimulationError, VirtualClock, run_now


def test_events_run_in_time_then_insertion_order() -> None:
    scheduler = Scheduler()
    seen: list[tuple[float, str]] = []
    for name, at in (("b", 2.0), ("a", 1.0), ("c", 2.0), ("d", 0.5)):
        scheduler.at(at, lambda n=name: seen.append((scheduler.now, n)))
    scheduler.run()
    assert seen == [(0.5, "d"), (1.0, "a"), (2.0, "b"), (2.0, "c")]


def test_cannot_schedule_in_the_past_and_until_stops() -> None:
    scheduler = Scheduler()
    scheduler.at(5.0, lambda: None)
    scheduler.run(until=3.0)
    assert scheduler.now == 3.0 and scheduler.pending == 1
    with pytest.raises(SimulationError):
        scheduler.at(1.0, lambda: None)


def test_process_sleeps_in_virtual_time_and_reports_exit() -> None:
    scheduler = Scheduler()
    clock = VirtualClock(scheduler)
    wakes: list[float] = []
    ended: list[str] = []

    async def body() -> str:
        for _ in range(3):
            await clock.sleep(1.5)
            wakes.append(clock.now())
        await asyncio.sleep(0)  # a bare yield resumes at the same instant
        return "done"

    process = Process(scheduler, body(), "p", on_exit=lambda p: ended.append(p.result))
    process.start(delay=1.0)
    scheduler.run()
    assert wakes == [2.5, 4.0, 5.5]
    assert ended == ["done"] and not process.alive


def test_killed_process_never_resumes() -> None:
    scheduler = Scheduler()
    clock = VirtualClock(scheduler)
    wakes: list[float] = []

    async def body() -> None:
        while True:
            await clock.sleep(1.0)
            wakes.append(clock.now())

    process = Process(scheduler, body(), "p")
    process.start()
    scheduler.at(2.5, process.kill)
    scheduler.run(until=10.0)
    assert wakes == [1.0, 2.0]


def test_awaiting_a_real_event_loop_future_fails_fast() -> None:
    scheduler = Scheduler()
    loop = asyncio.new_event_loop()

    async def body() -> None:
        await loop.create_future()

    try:
        Process(scheduler, body(), "p").start()
        with pytest.raises(SimulationError, match=r"only VirtualClock\.sleep"):
            scheduler.run()
    finally:
        loop.close()


def test_run_now_refuses_a_coroutine_that_suspends() -> None:
    async def finishes() -> int:
        return 7

    async def suspends() -> None:
        await VirtualClock(Scheduler()).sleep(1)

    assert run_now(finishes()) == 7
    with pytest.raises(SimulationError):
        run_now(suspends())
