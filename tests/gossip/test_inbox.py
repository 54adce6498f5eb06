"""The transports' receive queue: byte and message bounds, origin fairness, wakeups, close."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from gossip.inbox import MESSAGE_OVERHEAD_BYTES, Inbox

KIB = 1024


def inbox(max_bytes: int = 100 * KIB, max_messages: int = 1000) -> Inbox[str]:
    return Inbox(max_messages=max_messages, max_bytes=max_bytes)


def fill(box: Inbox[str], origin: str | None, count: int, size: int) -> list[str | None]:
    return [box.offer(f"{origin}-{i}", size, origin) for i in range(count)]


def drain(box: Inbox[str]) -> list[str]:
    out = []
    while (item := box.pop()) is not None:
        out.append(item)
    return out


def test_bounds_bytes_and_messages_drop_newest_and_count() -> None:
    box = inbox(max_bytes=10 * KIB)
    size = 2 * KIB - MESSAGE_OVERHEAD_BYTES  # 2 KiB charged each
    assert fill(box, None, 7, size) == [None] * 5 + ["bytes_full"] * 2
    assert box.queued_bytes == 10 * KIB and len(box) == 5
    assert drain(box) == [f"None-{i}" for i in range(5)]  # FIFO; the newest were dropped
    assert box.queued_bytes == 0 and box.peak_bytes == 10 * KIB

    box = inbox(max_messages=3)
    assert fill(box, "p", 4, 1) == [None, None, None, "queue_full"]
    assert box.dropped == {"queue_full": 1} and box.admitted == 3 and box.dropped_total == 1


def test_a_message_larger_than_the_budget_gets_through_an_empty_inbox_only() -> None:
    box = inbox(max_bytes=10 * KIB)
    assert box.offer("big", 50 * KIB, "p") is None
    assert box.offer("small", 1, "p") == "bytes_full"
    assert drain(box) == ["big"]
    assert box.offer("small", 1, "p") is None
    assert box.offer("big", 50 * KIB, "p") == "bytes_full"
    assert box.offer("big", 50 * KIB, "q") == "bytes_full"  # over any share: no evicting
    assert drain(box) == ["small"]
    # Another origin's message evicts an over-share message, however large.
    assert box.offer("big", 50 * KIB, "p") is None
    assert box.offer("other", 1, "q") is None
    assert drain(box) == ["other"] and box.dropped["evicted"] == 1


def test_lone_origin_fills_all_then_over_share_origin_is_evicted_for_another() -> None:
    box = inbox(max_bytes=100 * KIB)  # share: 25 KiB
    size = 10 * KIB - MESSAGE_OVERHEAD_BYTES  # 10 KiB charged each
    assert fill(box, "flood", 12, size) == [None] * 10 + ["bytes_full"] * 2  # alone: all of it
    assert box.origin_bytes("flood") == 100 * KIB
    # Another origin's message evicts the flooder's newest, never the other way round.
    assert box.offer("honest-0", size, "honest") is None
    assert box.offer("flood-x", size, "flood") == "peer_share"
    assert box.offer("honest-1", size, "honest") is None
    assert box.dropped == {"bytes_full": 2, "evicted": 2, "peer_share": 1}
    assert (box.origin_bytes("flood"), box.origin_bytes("honest")) == (80 * KIB, 20 * KIB)
    # Within its share an origin may evict; beyond it, it may not.
    assert box.offer("honest-2", size, "honest") == "peer_share"
    assert box.queued_bytes == 100 * KIB
    assert drain(box) == [f"flood-{i}" for i in range(8)] + ["honest-0", "honest-1"]


def test_random_offers_never_break_the_bounds() -> None:
    rng = random.Random(7)
    box = inbox(max_bytes=64 * KIB, max_messages=20)
    held: list[str] = []
    for step in range(5000):
        if rng.random() < 0.3:
            item = box.pop()
            if item is not None:
                held.append(item)
        else:
            origin = rng.choice(["a", "b", "c", None])
            box.offer(f"{step}", rng.randrange(0, 20 * KIB), origin)
        assert len(box) <= 20
        assert box.queued_bytes <= 64 * KIB or len(box) == 1
        assert box.queued_bytes == sum(box.origin_bytes(o) for o in ["a", "b", "c", None])
    drain(box)
    assert box.queued_bytes == 0 and len(box) == 0
    assert [int(x) for x in held] == sorted(int(x) for x in held)  # FIFO overall


def test_get_waits_for_offers_from_another_thread_and_fails_after_close() -> None:
    async def main() -> None:
        box = inbox(max_bytes=1 << 20)
        box.bind(asyncio.get_running_loop())

        def produce() -> None:
            for i in range(200):
                assert box.offer(f"m{i}", 10, "t") is None

        waiter = asyncio.create_task(box.get())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        thread = threading.Thread(target=produce)
        thread.start()
        got = [await asyncio.wait_for(waiter, 5)]
        while len(got) < 200:
            got.append(await asyncio.wait_for(box.get(), 5))
        thread.join()
        assert got == [f"m{i}" for i in range(200)]

        box.offer("last", 1)
        waiters = [asyncio.create_task(box.get()) for _ in range(3)]
        await asyncio.sleep(0.01)
        threading.Thread(target=box.close).start()
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5)
        assert results.count("last") == 1
        assert sum(isinstance(r, ConnectionError) for r in results) == 2
        assert box.offer("late", 1) == "closed"
        with pytest.raises(ConnectionError):
            await box.get()

    asyncio.run(main())
