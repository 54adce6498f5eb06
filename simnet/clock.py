"""Virtual time for simnet: an asyncio event loop whose clock jumps instead of waiting.

`VirtualTimeLoop` is a standard selector event loop with two changes: `time()` is a
virtual clock, and its selector never waits: asked to wait `t` seconds for I/O (there is
none: the memory transport is in-process), it moves the virtual clock forward by `t` and
reports nothing. So asyncio's own timer heap is the discrete-event scheduler, and the
production code runs unchanged on it: `asyncio.sleep`, `asyncio.create_task`, queues and
events all work, in virtual seconds. `Scheduler` is simnet's handle on such a loop.

Invariants:
- Time moves only when every ready callback has run and the loop would wait for the
  next timer; events run in a fixed order, so a run is a pure function of what was
  scheduled (no wall clock; no threads may call into the loop).
- Nothing left to run while the simulation is not done is a deadlock: the selector
  raises `SimulationError` instead of blocking forever.
- Fail fast: an exception escaping any callback or task of the loop is recorded and
  stops `Scheduler.run`, which raises it (asyncio would only log it).
- `run_now` runs a coroutine that must finish without suspending (gossip start/stop,
  transport calls) and raises `SimulationError` if it suspends.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any


class SimulationError(RuntimeError):
    """The simulation cannot continue (a deadlock, or a coroutine that had to finish)."""


class _VirtualSelector(selectors.SelectSelector):
    """Keeps the loop's registrations but never waits: a wait advances the virtual clock."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationError(
                "deadlock: every task waits and nothing is scheduled in virtual time"
            )
        if timeout > 0:
            self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):  # type: ignore[misc,valid-type]
    """An asyncio event loop on virtual time (see the module docstring)."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


class Scheduler:
    """simnet's handle on a `VirtualTimeLoop`: timers, tasks and a fail-fast run."""

    def __init__(self) -> None:
        self.loop = VirtualTimeLoop()
        self.loop.set_exception_handler(self._on_loop_error)
        self.events_run = 0
        self._error: BaseException | None = None
        self._done: asyncio.Future[None] | None = None

    @property
    def now(self) -> float:
        return self.loop.time()

    def at(self, time: float, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` at virtual `time` (not before now)."""
        if time < self.loop.time():
            raise SimulationError(f"cannot schedule at {time} < now {self.loop.time()}")
        self.events_run += 1
        self.loop.call_at(time, fn, *args)

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` `delay` virtual seconds from now."""
        self.at(self.loop.time() + max(delay, 0.0), fn, *args)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task on the loop whose unexpected exception stops the run."""
        task = self.loop.create_task(coro, name=name)
        task.add_done_callback(self._check_task)
        return task

    def _check_task(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if error is None:
            error = SimulationError(str(context.get("message", "event loop error")))
        self.fail(error)

    def fail(self, error: BaseException) -> None:
        """Stop the run with `error` (the first one wins)."""
        if self._error is None:
            self._error = error
        self.finish()

    def finish(self) -> None:
        """End `run` after the current callback."""
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def run(self, start: Callable[[], None], until: float | None = None) -> None:
        """Call `start()` inside the loop, then run until `finish()` or `fail()` (or the
        virtual time `until`); raise the first error of any task or callback."""

        async def main() -> None:
            self._done = self.loop.create_future()
            start()
            if until is not None:
                self.loop.call_at(until, self.finish)
            await self._done

        try:
            self.loop.run_until_complete(main())
        except SimulationError:
            if self._error is not None:
                raise self._error from None
            raise
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Cancel what is left, let it unwind, and close the loop."""
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


class VirtualClock:
    """`swarm.clock.Clock` on a scheduler: `now()` is virtual seconds."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._loop = scheduler.loop

    def now(self) -> float:
        return self._loop._virtual_now  # the loop's time(), read directly (hot: every receive)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that must finish without suspending; return its value.
    `SimulationError` if it suspends."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise SimulationError(f"coroutine suspended on {yielded!r} where it must finish at once")
