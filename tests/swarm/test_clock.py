"""Staleness rules and the swarm-round Lamport clock as pure functions."""

from __future__ import annotations

import asyncio

import pytest

from swarm.clock import SwarmRound, WallClock, is_fresh, is_from_future, staleness


@pytest.mark.parametrize(
    ("own", "item", "expected"), [(10, 10, 0), (10, 8, 2), (10, 12, -2), (0, 0, 0)]
)
def test_staleness(own: int, item: int, expected: int) -> None:
    assert staleness(own, item) == expected


@pytest.mark.parametrize(
    ("own", "item", "max_staleness", "fresh"),
    [
        (10, 10, 2, True),
        (10, 8, 2, True),
        (10, 7, 2, False),
        (10, 10, 0, True),
        (10, 9, 0, False),
        (10, 12, 2, True),  # ahead of us: its round has not reached us yet
    ],
)
def test_is_fresh(own: int, item: int, max_staleness: int, fresh: bool) -> None:
    assert is_fresh(own, item, max_staleness) is fresh


@pytest.mark.parametrize(
    ("own", "item", "max_ahead", "future"),
    [
        (10, 18, 8, False),
        (10, 19, 8, True),
        (10, 10, 0, False),
        (10, 11, 0, True),
        (10, 0, 8, False),
    ],
)
def test_is_from_future(own: int, item: int, max_ahead: int, future: bool) -> None:
    assert is_from_future(own, item, max_ahead) is future


def test_swarm_round_ticks_and_observes() -> None:
    clock = SwarmRound(value=0, max_ahead=8)
    assert clock.tick() == 1
    clock.observe(5)
    assert clock.value == 5
    clock.observe(3)  # never backwards
    assert clock.value == 5
    clock.observe(13)  # exactly max_ahead beyond: accepted
    assert clock.value == 13


def test_swarm_round_ignores_the_future() -> None:
    clock = SwarmRound(value=10, max_ahead=8)
    assert not clock.admits(19)
    clock.observe(10**9)
    assert clock.value == 10
    assert clock.admits(18)


def test_wall_clock_moves_forward() -> None:
    clock = WallClock()
    before = clock.now()
    asyncio.run(clock.sleep(0.001))
    assert clock.now() >= before + 0.001


def test_one_peer_cannot_move_the_clock_but_a_quorum_can() -> None:
    from swarm.clock import SwarmRound

    clock = SwarmRound(5, max_ahead=8, catch_up_quorum=2)
    for _ in range(10):
        assert clock.note_future("evil", 10_000) is False
    assert clock.value == 5
    assert clock.note_future("honest", 40) is True
    assert clock.value == 40  # the second-highest claim: both vouch for >= 40
    assert clock.admits(41)


def test_stale_claims_expire_once_no_longer_in_the_future() -> None:
    from swarm.clock import SwarmRound

    clock = SwarmRound(0, max_ahead=8, catch_up_quorum=2)
    assert clock.note_future("a", 20) is False
    clock.value = 15  # caught up by local steps and accepted messages
    assert clock.note_future("b", 30) is False  # "a"'s claim is no longer from the future
    assert clock.value == 15
