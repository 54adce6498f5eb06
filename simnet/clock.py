"""Virtual time for simnet: a discrete-event scheduler, a `Clock` on it, and coroutine
processes driven by the scheduler instead of an asyncio loop.

Invariants:
- Time moves only when the scheduler runs an event; events run in (time, insertion order)
  order, so a run is a pure function of what was scheduled: no wall clock, no threads,
  no asyncio event loop anywhere.
- A `Process` is a coroutine (a node's round loop) that may suspend only on
  `VirtualClock.sleep` (or on a bare `yield` of an already-finished asyncio awaitable,
  resumed at the same virtual instant). Anything else that would need a real event loop
  raises `SimulationError` at once, never hangs.
- An exception inside a process propagates out of `Scheduler.run` (fail fast: a broken
  node stops the simulation with its error, never silently).
- A killed process never runs again: its pending wake-up is ignored.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Coroutine, Generator
from typing import Any


class SimulationError(RuntimeError):
    """The simulation cannot continue (a process awaited something virtual time can't)."""


class Scheduler:
    """A discrete-event scheduler over virtual seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, time: float, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` at virtual `time` (not before now)."""
        if time < self.now:
            raise SimulationError(f"cannot schedule at {time} < now {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, fn, args))

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` `delay` virtual seconds from now."""
        self.at(self.now + max(delay, 0.0), fn, *args)

    @property
    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Run events in order until none is left, `until` is passed, or `stop()` is true."""
        heap = self._heap
        while heap:
            if stop is not None and stop():
                return
            time = heap[0][0]
            if until is not None and time > until:
                self.now = until
                return
            _, _, fn, args = heapq.heappop(heap)
            self.now = time
            self.events_run += 1
            fn(*args)


class _Sleep:
    """The only thing a process may suspend on: `await _Sleep(seconds)`."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __await__(self) -> Generator[_Sleep, None, None]:
        yield self


class VirtualClock:
    """`swarm.clock.Clock` on a scheduler: `now()` is virtual seconds."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def now(self) -> float:
        return self.scheduler.now

    async def sleep(self, seconds: float) -> None:
        await _Sleep(seconds)


class Process:
    """A coroutine advanced by the scheduler; `on_exit(process)` runs when it returns."""

    def __init__(
        self,
        scheduler: Scheduler,
        coro: Coroutine[Any, Any, Any],
        name: str,
        on_exit: Callable[[Process], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.name = name
        self._coro = coro
        self._on_exit = on_exit
        self.alive = True
        self.result: Any = None

    def start(self, delay: float = 0.0) -> None:
        self.scheduler.after(delay, self._step)

    def kill(self) -> None:
        """Stop for good (a crash): the coroutine is closed where it is suspended."""
        if self.alive:
            self.alive = False
            self._coro.close()

    def _step(self) -> None:
        if not self.alive:
            return
        try:
            yielded = self._coro.send(None)
        except StopIteration as stop:
            self.alive = False
            self.result = stop.value
            if self._on_exit is not None:
                self._on_exit(self)
            return
        if isinstance(yielded, _Sleep):
            self.scheduler.after(yielded.seconds, self._step)
        elif yielded is None:
            self.scheduler.after(0.0, self._step)
        else:
            self.kill()
            raise SimulationError(
                f"process {self.name} awaited {yielded!r}; in virtual time only "
                "VirtualClock.sleep can suspend"
            )


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that must finish without suspending (memory transport, gossip
    publish/start/stop); return its value. `SimulationError` if it suspends."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise SimulationError(f"coroutine suspended on {yielded!r} where it must finish at once")
