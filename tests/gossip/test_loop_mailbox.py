"""`gossip.loop_mailbox`: calls from another thread run on the loop, in order, batched."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gossip.inbox import Inbox
from gossip.loop_mailbox import LoopMailbox


def test_calls_from_another_thread_run_in_order_on_the_loop_with_few_wakeups() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        mailbox = LoopMailbox(loop)
        ran: list[tuple[int, int]] = []
        done = asyncio.Event()
        count = 5000

        def record(i: int) -> None:
            ran.append((i, threading.get_ident()))
            if i == count - 1:
                done.set()

        def post_all() -> None:
            for i in range(count):
                mailbox.post(record, i)

        await asyncio.gather(asyncio.to_thread(post_all), asyncio.wait_for(done.wait(), 10))
        assert [i for i, _ in ran] == list(range(count))
        assert {thread for _, thread in ran} == {threading.get_ident()}
        assert mailbox.posted == count
        # Posted in a tight loop while the loop thread is free to drain: far fewer
        # wake-ups than calls (one per call before).
        assert mailbox.wakes < count / 2, mailbox.wakes

    asyncio.run(main())


def test_a_failing_call_is_logged_and_the_rest_still_run(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> list[int]:
        mailbox = LoopMailbox(asyncio.get_running_loop())
        ran: list[int] = []

        def boom() -> None:
            raise ValueError("boom")

        def post() -> None:
            mailbox.post(ran.append, 1)
            mailbox.post(boom)
            mailbox.post(ran.append, 2)

        await asyncio.to_thread(post)
        for _ in range(100):
            if len(ran) == 2:
                break
            await asyncio.sleep(0.01)
        mailbox.post(ran.append, 3)  # the mailbox still wakes the loop afterwards
        await asyncio.sleep(0.05)
        return ran

    assert asyncio.run(main()) == [1, 2, 3]
    assert "a call posted to the loop failed" in caplog.text


def test_a_call_posted_after_the_loop_closed_is_counted_not_raised() -> None:
    loop = asyncio.new_event_loop()
    mailbox = LoopMailbox(loop)
    loop.close()
    mailbox.post(print, "never")
    assert mailbox.dropped_closed == 1


def test_the_inbox_wakes_its_reader_only_for_a_message_into_an_empty_inbox() -> None:
    async def main() -> None:
        inbox: Inbox[int] = Inbox(max_messages=100_000, max_bytes=1 << 30, name="test")
        inbox.bind(asyncio.get_running_loop())
        wakes = 0
        wake = inbox._wake

        def counting_wake() -> None:
            nonlocal wakes
            wakes += 1
            wake()

        inbox._wake = counting_wake  # type: ignore[method-assign]
        count = 3000

        def offer_all() -> None:
            for i in range(count):
                assert inbox.offer(i, 10) is None

        got: list[int] = []

        async def read() -> None:
            while len(got) < count:
                got.append(await inbox.get())

        await asyncio.gather(asyncio.to_thread(offer_all), asyncio.wait_for(read(), 10))
        assert got == list(range(count))
        assert 1 <= wakes < count / 2, wakes

    asyncio.run(main())
