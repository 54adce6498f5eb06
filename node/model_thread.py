"""One thread for a node's model work: sampling, training, evaluation, weight merges.

Invariants:
- Calls run one at a time, in the order they were submitted (`in_order`): a call
  submitted while another runs starts the moment it ends, without a trip through the
  event loop. The node uses this to queue the next round's sampling behind this round's
  training (`node.runner`), so the model does not idle between them.
- The thread is the same for every call (torch's per-thread settings and an inference
  engine's thread checks see one thread), started at the first call; `close` lets it end
  once the calls submitted so far are done, and a later call starts a new one.
- A call cancelled before it started never runs (`run_in_executor` cancels the pending
  job); one already running finishes in its thread, and its result is dropped.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class ModelThread:
    in_order = True

    def __init__(self, name: str = "model") -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None

    async def __call__(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        call = functools.partial(fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
