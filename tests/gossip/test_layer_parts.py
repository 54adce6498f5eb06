"""The gossip layer's parts on their own: seen cache, rate limiter, chunking, counters."""

from __future__ import annotations

import hashlib
import json

import pytest

from gossip.chunking import Reassembler, sha256, split
from gossip.counters import GossipCounters
from gossip.ratelimit import ALIVE_TICK_S, STALL_AFTER_S, STALL_GRACE_S, RateLimiter
from gossip.seen import SeenCache
from swarm.errors import WireError
from swarm.messages import Chunk


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def h(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


# seen cache ------------------------------------------------------------------------


def test_seen_by_pair_or_hash() -> None:
    seen = SeenCache(capacity=10)
    assert not seen.contains("a", 1, h(1))
    seen.add("a", 1, h(1))
    assert seen.contains("a", 1, h(99))  # same (sender, seq), other bytes
    assert seen.contains("a", 2, h(1))  # same bytes, other seq
    assert not seen.contains("b", 7, h(1))  # digests are per sender too
    assert not seen.contains("b", 1, h(2))  # seqs are per sender
    assert not seen.contains("a", 2, h(2))


def test_seen_is_bounded_and_forgotten_pairs_stay_refused() -> None:
    seen = SeenCache(capacity=4)
    for seq in range(10):
        seen.add("a", seq, h(seq))
    assert len(seen) == 4
    assert seen.floor("a") == 5
    for seq in range(10):
        assert seen.has_pair("a", seq)  # 0..5 by floor, 6..9 remembered
    assert not seen.has_pair("a", 10)
    assert not seen.has_hash("a", h(0))  # hashes are forgotten...
    assert seen.has_hash("a", h(9))
    assert not seen.has_hash("b", h(9))  # ...and kept per sender


def test_seen_floor_can_be_skipped() -> None:
    seen = SeenCache(capacity=2)
    for seq in (10, 11, 12):
        seen.add("a", seq, h(seq))
    assert seen.has_pair("a", 5)
    assert not seen.has_pair("a", 5, use_floor=False)
    assert seen.has_pair("a", 12, use_floor=False)


def test_seen_floor_count_bounded() -> None:
    seen = SeenCache(capacity=1, max_senders=3)
    for i in range(10):
        seen.add(f"peer{i}", 5, h(i))
    assert sum(seen.floor(f"peer{i}") == 5 for i in range(10)) == 3


# rate limiter ----------------------------------------------------------------------


def test_token_bucket_burst_then_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_s=2.0, burst=3, clock=clock)
    assert [limiter.allow("a") for _ in range(5)] == [True, True, True, False, False]
    assert limiter.allow("b")  # per peer
    clock.t += 0.5
    assert limiter.allow("a")
    assert not limiter.allow("a")
    clock.t += 100
    assert limiter.tokens("a") == 3.0  # capped at burst
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]


def _spend(limiter: RateLimiter, peer: str, most: int = 100_000) -> int:
    """How many messages of `peer` the limiter takes now, back to back."""
    taken = 0
    while taken < most and limiter.allow(peer):
        taken += 1
    return taken


def test_a_stall_of_this_process_is_not_charged_to_peers() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_s=10.0, burst=20, clock=clock)
    assert _spend(limiter, "a") == 20
    for _ in range(20):  # a live node ticks; a peer at the sustained rate is taken
        clock.t += ALIVE_TICK_S
        limiter.note_alive()
        assert _spend(limiter, "a") == 5
    assert limiter.stalls == 0
    clock.t += 90.0  # stopped: no tick, no message; the peer sent 900 meanwhile
    assert _spend(limiter, "a") == 900  # what the stall's length allows, no more
    assert (limiter.stalls, limiter.stalled_s) == (1, 90.0)
    clock.t += 1.0
    assert _spend(limiter, "a") == 10  # then the sustained rate again
    for _ in range(int(STALL_GRACE_S / ALIVE_TICK_S)):
        clock.t += ALIVE_TICK_S
        limiter.note_alive()
    assert limiter.stalls == 1
    assert limiter.tokens("a") == 20.0  # the credit has lapsed: capped at burst


def test_a_limiter_never_told_it_is_alive_credits_nothing() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_s=10.0, burst=20, clock=clock)
    assert _spend(limiter, "a") == 20
    clock.t += 90.0
    assert _spend(limiter, "a") == 20
    assert limiter.stalls == 0


def test_a_busy_but_ticking_node_credits_nothing_to_a_flood() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_s=10.0, burst=20, clock=clock)
    limiter.note_alive()
    flood = 0
    for _ in range(100):  # ticks as late as they may come without being a stall
        clock.t += STALL_AFTER_S
        limiter.note_alive()
        flood += _spend(limiter, "a")
    assert limiter.stalls == 0
    assert flood == 100 * int(STALL_AFTER_S * 10)  # the sustained rate only


def test_credit_of_a_stall_lapses_also_for_a_peer_silent_since() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_s=10.0, burst=20, clock=clock)
    limiter.note_alive()
    assert _spend(limiter, "quiet", 1) == 1
    clock.t += 60.0
    limiter.note_alive()  # the stall is seen by a tick this time
    while clock.t <= 160.0 + STALL_GRACE_S:  # "quiet" sends nothing until the grace is over
        clock.t += ALIVE_TICK_S
        limiter.note_alive()
    assert limiter.stalls == 1
    assert _spend(limiter, "quiet") == 20


def test_clock_going_backwards_adds_nothing() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_s=1.0, burst=1, clock=clock)
    assert limiter.allow("a")
    clock.t -= 50
    assert not limiter.allow("a")
    clock.t += 50.5
    assert not limiter.allow("a")
    clock.t += 1
    assert limiter.allow("a")


def test_rate_limiter_bounded() -> None:
    limiter = RateLimiter(rate_per_s=1.0, burst=1, clock=FakeClock(), max_peers=5)
    for i in range(50):
        limiter.allow(f"p{i}")
    assert len(limiter) == 5


# chunking --------------------------------------------------------------------------


def test_split_and_reassemble_in_any_order() -> None:
    data = bytes(range(256)) * 40
    chunks = split(data, 1000, DIGEST)
    assert len(chunks) == 11
    assert all(len(c.data) <= 1000 and c.inner_digest == DIGEST for c in chunks)
    r = Reassembler(max_pending_bytes=1 << 20, max_message_bytes=1 << 20, timeout_s=10)
    results = [r.add("a", "t", c, 0.0) for c in reversed(chunks)]
    assert results[:-1] == [None] * 10
    assert results[-1] == data
    assert r.pending_bytes == 0 and len(r) == 0


def test_split_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        split(b"", 10, DIGEST)
    with pytest.raises(ValueError):
        split(b"x", 0, DIGEST)
    with pytest.raises(ValueError):
        split(b"x" * 70_000, 1, DIGEST)  # more than 2**16 chunks
    with pytest.raises(ValueError):
        split(b"x", 1, b"short")


DIGEST = sha256(b"the inner envelope's signing input")


def cut(data: bytes, size: int) -> list[Chunk]:
    """`data` in chunks, named by a digest of their own (distinct contents, distinct sets)."""
    return split(data, size, sha256(data))


def reason_of(r: Reassembler, chunk: Chunk, sender: str = "a", topic: str = "t") -> str:
    with pytest.raises(WireError) as info:
        r.add(sender, topic, chunk, 0.0)
    return info.value.reason


def fresh(**kw: int | float) -> Reassembler:
    args: dict = {"max_pending_bytes": 1 << 20, "max_message_bytes": 1 << 20, "timeout_s": 10.0}
    args.update(kw)
    return Reassembler(**args)


def test_chunk_refusals() -> None:
    data = b"y" * 3000
    c0, c1, c2 = split(data, 1000, DIGEST)
    r = fresh()
    assert reason_of(r, Chunk(DIGEST, 0, 3, 2 << 20, c0.data)) == "oversize"
    assert reason_of(r, Chunk(DIGEST, 0, 3, 3000, b"")) == "bad_chunk"
    assert r.add("a", "t", c0, 0.0) is None
    assert reason_of(r, c0) == "duplicate"
    assert r.pending_bytes == 1000
    # the same content from another sender is its own set
    assert r.add("b", "t", c1, 0.0) is None
    # disagreeing with the set's count, or arriving on another topic, spoils the set
    assert reason_of(r, Chunk(DIGEST, 1, 4, 3000, c1.data)) == "bad_chunk"
    assert r.pending_for("a") == 0 and r.pending_for("b") == 1000
    assert reason_of(r, c2, sender="b", topic="other") == "bad_chunk"
    assert r.pending_bytes == 0


def test_chunks_adding_up_to_more_than_total_refused() -> None:
    r = fresh()
    big = b"q" * 600
    first = Chunk(DIGEST, 0, 2, 1000, big)
    second = Chunk(DIGEST, 1, 2, 1000, big)
    assert r.add("a", "t", first, 0.0) is None
    assert reason_of(r, second) == "bad_chunk"
    assert r.pending_bytes == 0


def test_chunks_adding_up_to_less_than_total_refused() -> None:
    r = fresh()
    piece = b"q" * 10
    assert r.add("a", "t", Chunk(DIGEST, 0, 2, 1000, piece), 0.0) is None
    assert reason_of(r, Chunk(DIGEST, 1, 2, 1000, piece)) == "bad_chunk"


def test_memory_bounds() -> None:
    r = fresh(max_pending_bytes=2500, max_message_bytes=2000)
    a = cut(b"a" * 4000, 1000)[:2]  # total 4000 > max_message_bytes
    assert reason_of(r, a[0]) == "oversize"
    one = cut(b"1" * 2000, 1000)
    two = cut(b"2" * 2000, 1000)
    assert r.add("a", "t", one[0], 0.0) is None
    assert r.add("b", "t", two[0], 0.0) is None
    assert r.pending_bytes == 2000
    three = cut(b"3" * 2000, 1000)
    assert reason_of(r, three[0], sender="c") == "reassembly_full"  # would be 3000 > 2500
    assert r.pending_bytes == 2000
    assert reason_of(r, three[1], sender="c") == "reassembly_full"  # abandoned set stays refused
    small = cut(b"4" * 1000, 500)
    assert r.add("c", "t", small[0], 0.0) is None  # exactly at the bound
    assert r.pending_bytes == 2500
    assert reason_of(r, one[1]) == "reassembly_full"  # even completing needs room
    assert r.pending_bytes == 1500  # a's set was dropped at once
    assert r.add("c", "t", small[1], 0.0) == b"4" * 1000
    assert r.pending_bytes == 1000


def test_per_sender_bound_evicts_the_senders_older_set() -> None:
    r = fresh(max_pending_bytes=10_000, max_message_bytes=2000)
    first = cut(b"1" * 2000, 1500)
    second = cut(b"2" * 2000, 1500)
    assert r.add("a", "t", first[0], 0.0) is None  # its 2nd chunk is lost in transit
    # One sender holds <= one max message: its older set makes room for the newer one,
    # so a lost chunk does not lock an honest sender out until the set expires.
    assert r.add("a", "t", second[0], 0.0) is None
    assert r.evicted == 1 and r.pending_for("a") == 1500 and len(r) == 1
    assert r.add("a", "t", second[1], 0.0) == b"2" * 2000
    assert reason_of(r, first[1]) == "reassembly_full"  # the evicted set stays refused
    assert r.add("b", "t", first[0], 0.0) is None  # other senders are unaffected


def test_partial_count_bounded() -> None:
    r = fresh(max_partials=3)
    for i in range(3):
        assert r.add("a", "t", cut(bytes([i]) * 20, 10)[0], 0.0) is None
    assert reason_of(r, cut(b"z" * 20, 10)[0]) == "reassembly_full"
    assert len(r) == 3


def test_expiry() -> None:
    r = fresh(timeout_s=5.0)
    old = cut(b"o" * 20, 10)
    new = cut(b"n" * 20, 10)
    r.add("a", "t", old[0], 0.0)
    r.add("a", "t", new[0], 4.0)
    assert r.expire(5.0) == 0
    assert r.expire(5.5) == 1
    assert r.pending_bytes == 10
    assert r.add("a", "t", new[1], 6.0) == b"n" * 20
    assert r.expire(100.0) == 0
    # the expired set's late chunk starts a new set, which can never complete
    assert r.add("a", "t", old[1], 7.0) is None
    assert r.expire(100.0) == 1
    assert r.pending_bytes == 0


# counters --------------------------------------------------------------------------


def test_counters_blame_and_bounds() -> None:
    counters = GossipCounters(max_peers=2)
    counters.drop("malformed")
    counters.drop("duplicate", "p1")  # honest peers cause duplicates: not blamed
    counters.drop("rate_limited", "p1")
    counters.drop("bad_payload", "p2")
    counters.drop("bad_payload", "p3")  # evicts p1, the least recently blamed
    assert counters.dropped == {"malformed": 1, "duplicate": 1, "rate_limited": 1, "bad_payload": 2}
    assert list(counters.per_peer_drops) == ["p2", "p3"]
    assert counters.peer_total("p1") == 0
    snap = counters.snapshot()
    json.dumps(snap)
    assert snap["dropped"]["bad_payload"] == 2
    assert snap["peers_blamed"] == 2
