"""Re-scoring peers' groups off the event loop, in killable worker processes.

A peer chooses the task reference (so the generator that runs) and the completions (so
what the scorers chew on) of every group it sends. `RescoreWorkers` runs
`node.rescore.rescore_group` for such groups in a bounded pool of worker processes
(`rewards.sandbox`), with a hard per-group time limit that really stops the work.

Invariants:
- Nothing a peer chooses runs on the event loop: `rescore` pickles the group, hands it to
  an idle worker and awaits the reply (the loop's selector watches the pipe; no thread
  waits). Worker start-up and reaping run in a thread, never on the loop.
- Bounded in space: at most `workers` jobs run at once and at most `max_queued` wait;
  one more is refused at once as `rescore_queue_full` (counted; not the peer's fault).
- Bounded in time: a job not answered within `timeout_s` of being sent to a ready worker
  has its worker killed (SIGKILL, so nothing of the job keeps running) and replaced, and
  is refused as `task_timeout` (the node blames the peer: its reference or completions
  made our generator or scorer run that long). A worker that dies during a job (crash,
  out of memory) is replaced and the job refused as `task_error`.
- Same result as in-process: the worker runs `rescore_group(group, rewards_config)`
  itself, so a `Rescored` is equal, a `Refused` has the same reason and any other
  exception (our own bug) is re-raised with the worker's traceback as a note; the only
  differences are the two limits above. (Reward time limits inside `rescore_group` run
  in threads in a worker, in a sandbox process in-process; both score 0 at the limit.)
- A worker whose job left a reward thread running (a scorer past `timeout_s`) is retired
  after that job, so no abandoned thread outlives its worker.
- `InlineRescorer` has the same interface and calls `rescore_group` directly on the event
  loop: identical results, no isolation, no time limit. It is for simnet (hundreds of
  nodes in one process, built-in bounded tasks, a virtual clock) and unit tests, never
  for a node facing real peers. It looks `rescore_group` up in this module at call time
  (simnet's memoization patches `node.workers.rescore_group`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from node.rescore import Refused, Rescored, rescore_group
from rewards.mixture import Variants
from rewards.sandbox import START_TIMEOUT_S, WorkerProcess, context
from swarm.config import RewardsConfig
from swarm.messages import RolloutGroup

log = logging.getLogger(__name__)

WORKER_PRELOAD: tuple[str, ...] = ("node.rescore",)
"""Modules every re-scoring worker imports before it is ready (besides `rewards.sandbox`'s
own list: reasoning-gym and the reward registry)."""

TIMINGS_KEPT = 1024
"""Job durations kept for the p50/p99 in `stats()`."""


class Rescorer(Protocol):
    """What a node needs to re-score peers' groups (`RescoreWorkers`, `InlineRescorer`)."""

    async def start(self) -> None: ...

    async def rescore(self, group: RolloutGroup) -> Rescored:
        """The group's local rewards, or `Refused(reason)`."""
        ...

    def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class _Tally:
    """Counters and recent job times shared by both rescorers' `stats()`."""

    counts: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    times: deque[float] = field(default_factory=lambda: deque(maxlen=TIMINGS_KEPT))

    def as_dict(self) -> dict[str, Any]:
        times = sorted(self.times)  # once for both percentiles (sorting sorted data is O(n))
        return {
            **{k: self.counts[k] for k in sorted(self.counts)},
            "refused": dict(sorted(self.refused.items())),
            "job_p50_s": _percentile(times, 0.5),
            "job_p99_s": _percentile(times, 0.99),
        }


class InlineRescorer:
    """`rescore_group` on the event loop (simnet, unit tests): see the module docstring."""

    def __init__(
        self,
        rewards_config: RewardsConfig,
        timer: Callable[[], float] = time.perf_counter,
        variants: Variants = (),
    ) -> None:
        self.config = rewards_config
        self.variants = variants
        self.timer = timer
        """Times jobs for `stats()` (simnet passes its virtual clock: deterministic)."""
        self._tally = _Tally()

    async def start(self) -> None:
        return None

    async def rescore(self, group: RolloutGroup) -> Rescored:
        start = self.timer()
        try:
            return rescore_group(group, self.config, self.variants)
        except Refused as refused:
            self._tally.refused[refused.reason] += 1
            raise
        finally:
            self._tally.counts["jobs"] += 1
            self._tally.times.append(self.timer() - start)

    def stats(self) -> dict[str, Any]:
        return {"workers": 0, "jobs": 0, **self._tally.as_dict()}

    async def close(self) -> None:
        return None


@dataclass
class _Slot:
    """One place in the pool: its current worker (None until started / after a kill)."""

    index: int
    worker: WorkerProcess | None = None


class RescoreWorkers:
    """A bounded pool of killable re-scoring processes; see the module docstring.

    `stats()` keys: `jobs` (answered by a worker), `timeouts`, `worker_deaths`,
    `workers_started`, `workers_restarted` (started after `start()`), `workers_retired`
    (after a leaked reward thread), `queue_drops`, `queued`, `running`, `refused` (by
    reason, limits included), `job_p50_s`/`job_p99_s` (seconds from send to reply, over
    the last `TIMINGS_KEPT` answered jobs), `reward_calls`/`reward_timeouts`/
    `reward_errors` (the workers' `rewards.registry` counters, summed)."""

    def __init__(
        self,
        rewards_config: RewardsConfig,
        *,
        workers: int = 1,
        timeout_s: float = 5.0,
        max_queued: int = 256,
        start_method: str | None = None,
        preload: Sequence[str] = (),
        variants: Variants = (),
    ) -> None:
        if workers < 1 or max_queued < 1 or not timeout_s > 0:
            raise ValueError("workers and max_queued must be >= 1 and timeout_s > 0")
        self.config = rewards_config
        self.variants = variants
        """The node's reasoning-gym dataset variants, sent with every job."""
        self.workers = workers
        self.timeout_s = timeout_s
        self.max_queued = max_queued
        self._preload = (*WORKER_PRELOAD, *preload)
        self._context = context(start_method, self._preload)
        self._slots = [_Slot(i) for i in range(workers)]
        self._queue: deque[tuple[RolloutGroup, asyncio.Future[Rescored]]] = deque()
        self._wakeup: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running = 0
        self._started = False
        self._closed = False
        self._tally = _Tally()
        self._live_counters: dict[int, dict[str, int]] = {}
        self._retired_counters: Counter[str] = Counter()

    @classmethod
    def from_config(cls, rewards_config: RewardsConfig, **kwargs: Any) -> RescoreWorkers:
        """A pool sized by `[rewards] rescore_workers`, `rescore_timeout_s` and
        `max_queued_rescores`."""
        return cls(
            rewards_config,
            workers=rewards_config.rescore_workers,
            timeout_s=rewards_config.rescore_timeout_s,
            max_queued=rewards_config.max_queued_rescores,
            **kwargs,
        )

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start every worker and wait until each has imported what it needs."""
        if self._started:
            raise RuntimeError("RescoreWorkers.start() was already called")
        self._started = True
        self._wakeup = asyncio.Event()
        results = await asyncio.gather(
            *(self._start_worker(slot) for slot in self._slots), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.close()
            raise failures[0]
        self._tasks = [
            asyncio.create_task(self._serve(slot), name=f"rescore-worker-{slot.index}")
            for slot in self._slots
        ]

    async def close(self) -> None:
        """Stop serving; queued and running callers are cancelled; workers are killed
        (they hold nothing worth saving) and their directories removed."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        while self._queue:
            _, future = self._queue.popleft()
            future.cancel()
        workers = [slot.worker for slot in self._slots if slot.worker is not None]
        for slot in self._slots:
            slot.worker = None
        await asyncio.gather(*(asyncio.to_thread(w.kill) for w in workers))

    # ---- the API -------------------------------------------------------------------------

    async def rescore(self, group: RolloutGroup) -> Rescored:
        """`rescore_group(group, rewards_config)` in a worker; `Refused(reason)` with the
        reasons of `node.rescore` plus `task_timeout` and `rescore_queue_full`."""
        if self._closed or not self._started or self._wakeup is None:
            raise RuntimeError("RescoreWorkers is not running (call start(), not after close())")
        if len(self._queue) >= self.max_queued:
            self._tally.counts["queue_drops"] += 1
            self._tally.refused["rescore_queue_full"] += 1
            raise Refused("rescore_queue_full")
        future: asyncio.Future[Rescored] = asyncio.get_running_loop().create_future()
        self._queue.append((group, future))
        self._wakeup.set()
        return await future

    def stats(self) -> dict[str, Any]:
        counters = Counter(self._retired_counters)
        for live in self._live_counters.values():
            counters.update(live)
        restarted = self._tally.counts["workers_started"] - self.workers
        return {
            "workers": self.workers,
            "jobs": 0,
            "timeouts": 0,
            "worker_deaths": 0,
            "workers_retired": 0,
            "queue_drops": 0,
            **self._tally.as_dict(),
            "workers_restarted": max(0, restarted),
            "queued": len(self._queue),
            "running": self._running,
            **{f"reward_{k}": v for k, v in sorted(counters.items())},
        }

    # ---- inside --------------------------------------------------------------------------

    async def _start_worker(self, slot: _Slot) -> WorkerProcess:
        worker = await asyncio.to_thread(WorkerProcess, self._context, self._preload)
        self._tally.counts["workers_started"] += 1
        try:
            await asyncio.wait_for(_readable(worker.conn), START_TIMEOUT_S)
            worker.check_ready(worker.conn.recv())
        except BaseException as exc:
            await asyncio.to_thread(worker.kill)
            if isinstance(exc, (TimeoutError, EOFError, OSError)):
                raise RuntimeError(
                    f"a re-scoring worker did not start ({type(exc).__name__}; "
                    f"waited up to {START_TIMEOUT_S} s)"
                ) from exc
            raise
        slot.worker = worker
        return worker

    async def _discard(self, slot: _Slot) -> None:
        worker, slot.worker = slot.worker, None
        if worker is None:
            return
        if worker.pid is not None:
            self._retired_counters.update(self._live_counters.pop(worker.pid, {}))
        await asyncio.to_thread(worker.kill)

    async def _next_job(self) -> tuple[RolloutGroup, asyncio.Future[Rescored]]:
        assert self._wakeup is not None
        while True:
            while self._queue:
                group, future = self._queue.popleft()
                if not future.done():  # a cancelled caller's job is skipped
                    return group, future
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _serve(self, slot: _Slot) -> None:
        assert self._wakeup is not None
        while True:
            group, future = await self._next_job()
            if self._queue:
                self._wakeup.set()  # let another idle slot take the next one
            self._running += 1
            try:
                result = await self._run(slot, group)
            except asyncio.CancelledError:
                future.cancel()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(result)
            finally:
                self._running -= 1

    async def _run(self, slot: _Slot, group: RolloutGroup) -> Rescored:
        try:
            return await self._run_job(slot, group)
        except Refused as refused:
            self._tally.refused[refused.reason] += 1
            raise

    async def _run_job(self, slot: _Slot, group: RolloutGroup) -> Rescored:
        worker = slot.worker or await self._start_worker(slot)
        try:
            worker.send_job(rescore_group, (group, self.config, self.variants))
        except (BrokenPipeError, OSError):  # died between jobs: not this group's doing
            self._tally.counts["worker_deaths"] += 1
            await self._discard(slot)
            worker = await self._start_worker(slot)
            worker.send_job(rescore_group, (group, self.config, self.variants))
        start = time.perf_counter()
        try:
            await asyncio.wait_for(_readable(worker.conn), self.timeout_s)
            reply = worker.conn.recv()
        except TimeoutError:
            self._tally.counts["timeouts"] += 1
            log.info("re-scoring %s passed %.3g s; worker killed", group.task, self.timeout_s)
            await self._discard(slot)
            raise Refused("task_timeout") from None
        except (EOFError, OSError):
            self._tally.counts["worker_deaths"] += 1
            log.warning("a re-scoring worker died on %s; replacing it", group.task)
            await self._discard(slot)
            raise Refused("task_error") from None
        self._tally.counts["jobs"] += 1
        self._tally.times.append(time.perf_counter() - start)
        status, value, leaked, counters = reply
        if worker.pid is not None:
            self._live_counters[worker.pid] = counters
        if leaked:
            self._tally.counts["workers_retired"] += 1
            await self._discard(slot)
        if status == "raised":
            raise value
        return value


async def _readable(conn: Connection) -> None:
    """Wait until `conn` has data (or EOF), through the event loop's selector."""
    loop = asyncio.get_running_loop()
    fd = conn.fileno()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    try:
        loop.add_reader(fd, wake)
    except NotImplementedError:  # a loop without readers (Windows' proactor)
        while not await asyncio.to_thread(conn.poll, 0.5):
            pass
        return
    try:
        await ready
    finally:
        loop.remove_reader(fd)
