"""`node.model_thread.ModelThread`: one thread, calls in submission order, a call
cancelled before it starts never runs, and a closed one starts again on the next call."""

from __future__ import annotations

import asyncio
import threading
import time

from node.model_thread import ModelThread


def test_calls_run_in_order_on_one_thread_and_a_cancelled_pending_call_never_runs() -> None:
    ran: list[tuple[str, int]] = []

    def work(name: str, seconds: float) -> str:
        time.sleep(seconds)
        ran.append((name, threading.get_ident()))
        return name

    async def main() -> None:
        model = ModelThread("t")
        first = asyncio.ensure_future(model(work, "first", 0.05))
        second = asyncio.ensure_future(model(work, "second", 0.0))
        dropped = asyncio.ensure_future(model(work, "dropped", 0.0))
        await asyncio.sleep(0.01)  # all three submitted; "first" is running
        dropped.cancel()
        assert await first == "first" and await second == "second"
        await asyncio.wait({dropped})
        await asyncio.sleep(0.02)
        model.close()
        assert await model(work, "after close", 0.0) == "after close"
        model.close()

    asyncio.run(main())
    assert [name for name, _ in ran] == ["first", "second", "after close"]
    assert ran[0][1] == ran[1][1] != threading.get_ident()
