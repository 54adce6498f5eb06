"""The staleness rule (measured locally) and the wall clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from swarm.clock import WallClock
from swarm.staleness import SenderVersions, StalenessRule, age, is_fresh, version_lag


@pytest.mark.parametrize(("own", "arrival", "expected"), [(10, 10, 0), (10, 8, 2), (0, 0, 0)])
def test_age_counts_our_rounds_since_arrival(own: int, arrival: int, expected: int) -> None:
    assert age(own, arrival) == expected


@pytest.mark.parametrize(
    ("own", "arrival", "max_staleness", "fresh"),
    [(10, 10, 2, True), (10, 8, 2, True), (10, 7, 2, False), (10, 10, 0, True), (10, 9, 0, False)],
)
def test_is_fresh(own: int, arrival: int, max_staleness: int, fresh: bool) -> None:
    assert is_fresh(own, arrival, max_staleness) is fresh


def test_version_lag_may_be_negative_after_a_sender_restart() -> None:
    assert version_lag(10, 7) == 3
    assert version_lag(3, 7) == -4


def test_rule_needs_both_facts_and_the_optional_wall_clock_bound() -> None:
    rule = StalenessRule(max_staleness=2, max_version_lag=4)
    ok = dict(own_round=5, arrival_round=4, item_version=10, sender_version=12)
    assert rule.usable(**ok)
    assert not rule.usable(**{**ok, "arrival_round": 2})  # too many of our rounds ago
    assert not rule.usable(**{**ok, "sender_version": 15})  # sender moved on 5 versions
    assert rule.usable(**{**ok, "sender_version": 0})  # sender restarted from older weights
    timed = StalenessRule(2, 4, max_age_s=30.0)
    assert timed.usable(**ok, now=100.0, arrival_time=80.0)
    assert not timed.usable(**ok, now=100.0, arrival_time=60.0)


def test_sender_versions_follow_the_newest_seq_not_the_largest_claim() -> None:
    table = SenderVersions()
    table.observe("a", seq=10, policy_version=50)
    table.observe("a", seq=9, policy_version=99)  # older envelope (reordered): ignored
    assert table.version("a") == 50
    table.observe("a", seq=11, policy_version=3)  # restarted from an older checkpoint
    assert table.version("a") == 3
    assert table.highest_seq("a") == 11
    assert table.version("unknown", default=7) == 7


def test_sender_versions_are_bounded_and_round_trip() -> None:
    table = SenderVersions(max_senders=3)
    for i in range(5):
        table.observe(f"p{i}", seq=i + 1, policy_version=i)
    assert len(table) == 3 and "p0" not in table and "p4" in table
    restored = SenderVersions(max_senders=3)
    restored.load_state_dict(table.state_dict())
    assert restored.state_dict() == table.state_dict()


def test_wall_clock_moves_forward() -> None:
    clock = WallClock()
    before = clock.now()
    asyncio.run(clock.sleep(0.001))
    assert clock.now() >= before + 0.001


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="no boot clock on this OS")
def test_wall_clock_counts_time_suspended(monkeypatch: pytest.MonkeyPatch) -> None:
    # A suspend cannot be made here, and on a machine never suspended the boot clock and
    # the monotonic one agree: the boot clock is read as if an hour had been slept away.
    real = time.clock_gettime
    slept = 3600.0

    def after_a_suspend(clock_id: int) -> float:
        return real(clock_id) + (slept if clock_id == time.CLOCK_BOOTTIME else 0.0)

    monkeypatch.setattr(time, "clock_gettime", after_a_suspend)
    assert WallClock().now() - time.monotonic() > slept - 1.0
