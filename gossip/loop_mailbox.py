"""Calls posted from another thread to an asyncio loop, delivered in batches.

`loop.call_soon_threadsafe` writes to the loop's self-pipe on every call. Made once per
message from the transport's thread, that write (and the switch of the interpreter lock
it causes) took 58% of that thread's time under a flood of refused messages (py-spy,
30,000 forged envelopes from one peer): the node processed ~140 of them a second. Waking
the loop only for a post into an empty mailbox was not enough (44%: the loop drained each
call before the next came). Here a post wakes the loop only when no drain is due; after
a drain that ran anything the loop looks again `linger_s` later on its own timer, so
under a sustained stream of posts the loop is woken from the other thread once, not once
per post.

Invariants:
- Every posted call runs exactly once, on the loop's thread, in the order posted, at
  most about `linger_s` after it was posted (while the loop is responsive); one that
  raises is logged and the rest still run.
- At most one drain is due at any time (a wake-up or the timer); a post while one is
  due rides on it.
- A call posted after the loop closed is dropped (counted in `dropped_closed`), as
  `call_soon_threadsafe` would raise there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class LoopMailbox:
    """Run `fn(*args)` on `loop`'s thread, posted from any thread (module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, linger_s: float = 0.05) -> None:
        self._loop = loop
        self._linger_s = linger_s
        self._lock = threading.Lock()
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._wake_pending = False
        self.wakes = 0
        """Loop wake-ups requested (a measure of the batching: posts / wakes)."""
        self.posted = 0
        self.dropped_closed = 0

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._calls.append((fn, args))
            self.posted += 1
            if self._wake_pending:
                return
            self._wake_pending = True
            self.wakes += 1
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is left to run them
            with self._lock:
                self.dropped_closed += len(self._calls)
                self._calls.clear()
                self._wake_pending = False
            log.debug("loop closed; posted calls dropped")

    def _drain(self) -> None:
        with self._lock:
            batch = list(self._calls)
            self._calls.clear()
            if not batch:
                self._wake_pending = False
                return
        for fn, args in batch:
            try:
                fn(*args)
            except Exception:
                log.exception("a call posted to the loop failed")
        self._loop.call_later(self._linger_s, self._drain)  # still due: posts ride on it
