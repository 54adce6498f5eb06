"""Arrival cohorts (`node.trust`) and the cohort draw of the external slots
(`node.selection.draw_slots`, `node.pool.RolloutPool.select`)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from node.pool import RolloutPool
from node.selection import draw_slots, select_by_signal
from node.trust import UNLOCATED, TrustBook
from swarm.config import parse_config
from swarm.errors import ConfigError
from swarm.messages import RolloutGroup, TaskRef
from swarm.staleness import StalenessRule

HALF = (1.0,) * 4 + (0.0,) * 4
QUARTER = (1.0,) * 2 + (0.0,) * 6


def test_senders_first_seen_in_one_window_share_a_cohort() -> None:
    book = TrustBook(cohort_rounds=8, ramp_rounds=32)
    book.note_verified("a", 3)  # the first sender ever: cohort 0 opens at our round 3
    book.note_verified("b", 10)
    book.note_verified("late", 11)
    book.note_verified("later", 40)
    assert [book.cohort(s) for s in ("a", "b", "late", "later")] == [0, 0, 1, 4]
    book.note_verified("a", 50)  # later groups do not move a sender
    assert book.cohort("a") == 0
    # Weights grow with the cohort's age (since its window opened) up to 1.
    assert book.weight(0, 3) == pytest.approx(1 / 32)
    assert book.weight(0, 34) == 1.0
    assert book.weight(4, 40) == pytest.approx(6 / 32)  # cohort 4 opened at round 35
    assert TrustBook(cohort_rounds=0).cohort("anyone") == 0


def test_a_blame_moves_the_sender_to_the_current_cohort() -> None:
    book = TrustBook(cohort_rounds=4)
    book.note_verified("a", 0)
    book.note_verified("b", 20)
    assert book.cohort("a") == 0
    book.note_blamed("a")
    assert book.cohort("a") == 5  # as if first seen at our round 20
    book.note_blamed("unknown")  # nothing to move, nothing remembered
    assert book.history("unknown") is None


def test_the_draw_favours_old_cohorts_by_age_and_is_seeded() -> None:
    book = TrustBook(cohort_rounds=8, ramp_rounds=32)
    book.note_verified("honest", 0)
    book.note_verified("wave", 40)  # cohort 5, opened at round 40
    rng = random.Random(7)
    at_arrival = Counter(book.draw_cohort([0, 5, 5], 40, rng) for _ in range(4000))
    assert at_arrival[5] / 4000 == pytest.approx((1 / 32) / (1 + 1 / 32), abs=0.01)
    grown = Counter(book.draw_cohort([0, 5], 71, rng) for _ in range(4000))
    assert grown[5] / 4000 == pytest.approx(0.5, abs=0.03)
    assert book.draw_cohort([5], 40, rng) == 5  # one cohort: no draw
    again = [book.draw_cohort([0, 5], 50, random.Random(3)) for _ in range(3)]
    assert len(set(again)) == 1


def test_earned_weights_count_active_senders_but_not_before_their_time() -> None:
    book = TrustBook(cohort_rounds=8, ramp_rounds=32, weighting="earned")
    for peer in range(7):
        book.note_verified(f"honest-{peer}", 0)
    for key in range(128):
        book.note_verified(f"sybil-{key}", 40)  # cohort 5, opened at round 40
    book.note_verified("newcomer", 60)  # cohort 7, opened at round 56
    active = book.active_senders(60)
    # The honest peers last sent at round 0, more than 32 rounds ago: not active.
    assert active == Counter({5: 128, 7: 1})
    for peer in range(7):
        book.note_verified(f"honest-{peer}", 100)
    assert book.active_senders(100)[5] == 0  # keys silent for 60 rounds count for nothing
    for key in range(128):
        book.note_verified(f"sybil-{key}", 99)
    active = book.active_senders(100)
    assert (active[0], active[5]) == (7, 128)
    # Founders (age 100) have earned 101/32 senders' weight, not yet all 7 of them; the
    # 128 keys have earned 61/32, not 128; the lone newcomer is capped at 1.
    assert book.weight(0, 100, active[0]) == pytest.approx(101 / 32)
    assert book.weight(5, 100, active[5]) == pytest.approx(61 / 32)
    assert book.weight(7, 100, 1) == 1.0
    assert book.weight(0, 300, active[0]) == 7.0
    # The draw: founders against the wave of keys, as the weights say.
    rng = random.Random(5)
    drawn = Counter(book.draw_cohort([0, 5], 100, rng) for _ in range(4000))
    assert drawn[5] / 4000 == pytest.approx(61 / 162, abs=0.03)
    # In the long run the wave weighs as much as the founders, not 128 senders' worth.
    for peer in range(7):
        book.note_verified(f"honest-{peer}", 3000)
    for key in range(128):
        book.note_verified(f"sybil-{key}", 3000)
    assert book.weights([0, 5, 7], 3000) == {0: 7.0, 5: 7.0, 7: 1.0}
    assert book.weights([5], 3000) == {5: 7.0}  # capped by the founders without a candidate
    # `one` gives the same wave an equal share once it is 32 rounds old.
    assert TrustBook(cohort_rounds=8, ramp_rounds=32).weight(0, 100, 7) == 1.0
    with pytest.raises(ValueError, match="weighting"):
        TrustBook(cohort_rounds=8, weighting="many")


def test_a_flood_of_fresh_keys_forgets_fresh_keys_before_active_ones() -> None:
    book = TrustBook(cohort_rounds=2, max_senders=4)
    for own_round in range(3):
        book.note_verified("honest", own_round)
        for k in range(3):
            book.note_verified(f"sybil-{own_round}-{k}", own_round)
    assert len(book) == 4
    assert book.history("honest") is not None and book.cohort("honest") == 0
    assert book.history("sybil-0-0") is None  # the oldest fresh keys went first


def test_cohorts_survive_a_checkpoint() -> None:
    book = TrustBook(cohort_rounds=2)
    book.note_verified("a", 5)
    book.note_verified("b", 9)
    book.note_blamed("a")
    copy = TrustBook(cohort_rounds=2)
    copy.load_state_dict(book.state_dict())
    assert [copy.cohort(s) for s in ("a", "b")] == [book.cohort(s) for s in ("a", "b")] == [2, 2]
    assert copy.weight(0, 9) == book.weight(0, 9)


def test_a_wave_of_any_size_gets_what_its_cohort_is_drawn() -> None:
    for keys in (1, 8, 800):
        candidates = [("honest", f"h{i}") for i in range(4)]
        candidates += [(f"sybil{k}", f"s{k}") for k in range(keys)]
        scores = [0.3] * 4 + [0.5] * keys  # the bait always has the largest spread
        cohorts = [0] * 4 + [1] * keys
        picks = iter([1, 0, 0, 0])  # the draw gives the wave one slot of four
        picked = draw_slots(
            candidates, scores, 4, 4, {}, cohorts=cohorts, pick_cohort=lambda _, p=picks: next(p)
        )
        senders = [candidates[i][0] for i in picked]
        assert senders.count("honest") == 3 and len(picked) == 4, keys
    # Without cohorts the bait takes every slot (the measured gap of docs/sapo_grid.md).
    picked = draw_slots(candidates, scores, 4, 4, {})
    assert all(candidates[i][0].startswith("sybil") for i in picked)


def test_the_draw_only_offers_cohorts_with_an_eligible_candidate() -> None:
    candidates = [("a", "a1"), ("a", "a2"), ("b", "b1")]
    offered: list[set[int]] = []

    def pick(found: set[int]) -> int:
        offered.append(found)
        return max(found)

    picked = draw_slots(candidates, [1.0] * 3, 3, 1, None, cohorts=[0, 0, 1], pick_cohort=pick)
    assert [candidates[i][0] for i in picked] == ["b", "a"]  # a's second is over its cap
    assert offered == [{0, 1}, {0}]
    with pytest.raises(ValueError, match="one cohort per candidate"):
        draw_slots(candidates, [1.0] * 3, 1, 1, None, cohorts=[0])


def test_senders_first_spreads_picks_before_giving_a_second_one() -> None:
    candidates = [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1")]
    scores = [0.5, 0.5, 0.5, 0.1, 0.2]
    spread = draw_slots(candidates, scores, 3, 2, None, senders_first=True)
    assert sorted(candidates[i][0] for i in spread) == ["a", "b", "c"]
    greedy = draw_slots(candidates, scores, 3, 2, None)
    assert [candidates[i][0] for i in greedy] == ["a", "a", "c"]
    more = draw_slots(candidates, scores, 5, 2, None, senders_first=True)
    assert Counter(candidates[i][0] for i in more) == {"a": 2, "b": 1, "c": 1}


def test_networks_take_turns_before_any_takes_a_second_pick() -> None:
    # 8 keys on one network, there from the start, with the largest spread; 3 honest
    # senders on networks of their own.
    candidates = [(f"sybil{k}", f"s{k}") for k in range(8)]
    candidates += [(f"honest{i}", f"h{i}{j}") for i in range(3) for j in range(2)]
    scores = [0.5] * 8 + [0.3, 0.2] * 3
    networks = ["203.0.113.0/24"] * 8 + [f"198.51.{i}.0/24" for i in range(3) for _ in range(2)]
    spread = draw_slots(candidates, scores, 4, 2, None, networks=networks)
    assert sorted(candidates[i][0] for i in spread) == ["honest0", "honest1", "honest2", "sybil0"]
    assert all(candidates[i][1] != "h01" for i in spread)  # each network's best group
    greedy = draw_slots(candidates, scores, 4, 2, None)
    assert all(candidates[i][0].startswith("sybil") for i in greedy)
    # Once every network had its turn, the second turn goes by score again.
    more = draw_slots(candidates, scores, 6, 2, None, networks=networks)
    assert Counter(networks[i] for i in more)["203.0.113.0/24"] == 2
    # One network (peers on one machine or LAN): the draw is the greedy one.
    assert draw_slots(candidates, scores, 4, 2, None, networks=["lan"] * 14) == greedy
    with pytest.raises(ValueError, match="one network per candidate"):
        draw_slots(candidates, scores, 4, 2, None, networks=["lan"])


def test_a_sender_keeps_the_first_network_it_was_seen_at() -> None:
    book = TrustBook(cohort_rounds=0)
    book.note_network("a", "198.51.100.0/24")  # not yet accepted: nothing to note it on
    assert book.network("a") == UNLOCATED
    book.note_verified("a", 0)
    book.note_network("a", None)  # heard through a forwarder: still unlocated
    assert book.network("a") == UNLOCATED
    book.note_network("a", "198.51.100.0/24")
    book.note_network("a", "192.0.2.0/24")  # a key cannot move out of its network
    assert book.network("a") == "198.51.100.0/24"
    book.note_verified("b", 1)
    copy = TrustBook(cohort_rounds=0)
    copy.load_state_dict(book.state_dict())
    assert [copy.network(s) for s in ("a", "b")] == ["198.51.100.0/24", UNLOCATED]
    old = {"origin": 0, "latest": 1, "senders": [["a", 0, 1]]}  # a checkpoint from before
    copy.load_state_dict(old)
    assert copy.network("a") == UNLOCATED and copy.history("a") is not None


@pytest.mark.parametrize("selection", ["uniform", "signal"])
def test_keys_from_one_network_there_from_the_start_share_one_turn(selection: str) -> None:
    honest = [f"honest-{i}" for i in range(3)]
    sybils = [f"sybil-{k}" for k in range(32)]
    shares = {}
    for networks_first in (True, False):
        pool, index, share = _pool(selection, 0), 0, []
        pool.networks_first = networks_first
        for own_round in range(16):
            for sender in honest + sybils:
                network = "203.0.113.0/24" if sender.startswith("sybil") else sender
                for _ in range(2):
                    index += 1
                    rewards = HALF if sender.startswith("sybil") else QUARTER
                    added = pool.add(
                        sender,
                        _group(index),
                        rewards,
                        own_round=own_round,
                        sender_version=0,
                        now=0,
                        network=network,
                    )
                    assert added is None
            chosen = pool.select(4, own_round, lambda s: 0, 0.0)
            assert len(chosen) == 4
            share.append(sum(e.sender.startswith("sybil") for e in chosen) / 4)
        shares[networks_first] = share
    assert shares[True] == [0.25] * 16  # one turn of four, every round
    assert sum(shares[False]) / 16 > 0.8


def test_select_by_signal_picks_by_signal_within_the_drawn_cohort() -> None:
    candidates = [("n", "t0", HALF), ("e", "t1", QUARTER), ("e", "t2", HALF)]
    picked = select_by_signal(candidates, 1, 2, {}, cohorts=[1, 0, 0], pick_cohort=min)
    assert picked == [2]


def _group(index: int) -> RolloutGroup:
    return RolloutGroup(TaskRef("add", 0, index), f"{index}+1=", ("1",) * 8, HALF, "m", 0)


def _pool(selection: str, cohort_rounds: int = 4) -> RolloutPool:
    return RolloutPool(
        max_groups=4096,
        max_bytes=1 << 24,
        rule=StalenessRule(2, 4),
        per_sender_cap=2,
        selection=selection,  # type: ignore[arg-type]
        cohort_rounds=cohort_rounds,
        cohort_ramp_rounds=8,
    )


@pytest.mark.parametrize("selection", ["uniform", "signal"])
def test_a_late_wave_of_keys_gets_a_share_that_grows_with_its_age(selection: str) -> None:
    honest = [f"honest-{i}" for i in range(3)]
    wave = [f"sybil-{k}" for k in range(32)]
    shares, pools = {}, {}
    for cohort_rounds in (4, 0):
        pool, index, share = _pool(selection, cohort_rounds), 0, []
        pools[cohort_rounds] = pool
        for own_round in range(24):
            senders = honest + (wave if own_round >= 8 else [])  # the wave arrives at round 8
            for sender in senders:
                for _ in range(2):
                    index += 1
                    assert (
                        pool.add(
                            sender,
                            _group(index),
                            HALF,
                            own_round=own_round,
                            sender_version=0,
                            now=0,
                        )
                        is None
                    )
            chosen = pool.select(4, own_round, lambda s: 0, 0.0)
            assert len(chosen) == 4
            share.append(sum(e.sender.startswith("sybil") for e in chosen) / 4)
        shares[cohort_rounds] = share
    defended, open_ = shares[4], shares[0]
    # Open: 32 keys against 3 honest senders take almost every slot from their arrival.
    assert sum(open_[8:]) / 16 > 0.8
    # Defended: little at first, at most about half once the wave's cohort is grown.
    assert sum(defended[8:12]) / 4 < 0.35
    assert sum(defended[8:]) / 16 < 0.6
    resumed = _pool(selection)
    resumed.load_state_dict(pools[4].state_dict())
    assert [resumed.trust.cohort(s) for s in ("honest-0", "sybil-0")] == [0, 2]


def test_config_names_the_cohort_bound() -> None:
    config = parse_config({})
    assert (config.sapo.cohort_rounds, config.sapo.cohort_ramp_rounds) == (0, 32)  # opt-in
    assert parse_config({"sapo": {"cohort_rounds": 8}}).sapo.cohort_rounds == 8
    with pytest.raises(ConfigError, match=r"sapo\.cohort_ramp_rounds"):
        parse_config({"sapo": {"cohort_ramp_rounds": 0}})


def test_a_share_of_the_older_cohorts_caps_a_wave_but_not_a_newcomer() -> None:
    """With `older_share = 0.5` a wave of 128 keys weighs at most half the founders (a
    third of the draw) however long it has been here; a lone newcomer keeps its one
    sender's weight; a cohort's cap counts every older cohort together."""
    book = TrustBook(cohort_rounds=8, ramp_rounds=32, weighting="earned", older_share=0.5)
    plain = TrustBook(cohort_rounds=8, ramp_rounds=32, weighting="earned")
    for b in (book, plain):
        for peer in range(7):
            b.note_verified(f"honest-{peer}", 0)
        for key in range(128):
            b.note_verified(f"sybil-{key}", 40)  # cohort 5
        b.note_verified("newcomer", 60)  # cohort 7
        for peer in range(7):
            b.note_verified(f"honest-{peer}", 140)
        for key in range(128):
            b.note_verified(f"sybil-{key}", 140)
        b.note_verified("newcomer", 140)
    # Round 140: founders 141/32, the wave 101/32 without the cap, 70.5/32 with it.
    assert plain.weights([0, 5, 7], 140) == pytest.approx({0: 141 / 32, 5: 101 / 32, 7: 1.0})
    assert book.weights([0, 5, 7], 140) == pytest.approx({0: 141 / 32, 5: 70.5 / 32, 7: 1.0})
    rng = random.Random(7)
    drawn = Counter(book.draw_cohort([0, 5], 140, rng) for _ in range(4000))
    assert drawn[5] / 4000 == pytest.approx(1 / 3, abs=0.03)
    # Long after: the founders weigh 7, the wave 3.5 (not 7), the newcomer 1.
    for b in (book,):
        for peer in range(7):
            b.note_verified(f"honest-{peer}", 3000)
        for key in range(128):
            b.note_verified(f"sybil-{key}", 3000)
        b.note_verified("newcomer", 3000)
    assert book.weights([0, 5, 7], 3000) == {0: 7.0, 5: 3.5, 7: 1.0}
    with pytest.raises(ValueError, match="older_share"):
        TrustBook(cohort_rounds=8, older_share=0.5)  # only with earned weights
