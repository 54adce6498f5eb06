"""Running a node's named asyncio tasks so that they fail fast together.

Invariant: when the main task returns, the background tasks are cancelled; when any
task raises (or a background task returns when it should run forever), every other
task is cancelled and `NodeTaskError` naming the task is raised. Nothing is swallowed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class NodeTaskError(RuntimeError):
    def __init__(self, name: str, cause: BaseException | None) -> None:
        what = f"{type(cause).__name__}: {cause}" if cause else "exited unexpectedly"
        super().__init__(f"node task {name!r} failed: {what}")
        self.task_name = name


async def supervise(
    main: Coroutine[Any, Any, Any], background: dict[str, Coroutine[Any, Any, Any]]
) -> Any:
    main_task = asyncio.create_task(main, name="main")
    tasks = {name: asyncio.create_task(coro, name=name) for name, coro in background.items()}
    everything = {main_task, *tasks.values()}
    try:
        while True:
            done, _ = await asyncio.wait(everything, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.cancelled():
                    raise NodeTaskError(task.get_name(), asyncio.CancelledError())
                error = task.exception()
                if error is not None:
                    raise NodeTaskError(task.get_name(), error) from error
                if task is not main_task:
                    raise NodeTaskError(task.get_name(), None)
                return task.result()
    finally:
        for task in everything:
            if not task.done():
                task.cancel()
        await asyncio.gather(*everything, return_exceptions=True)
