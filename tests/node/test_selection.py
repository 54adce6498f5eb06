"""What a node learns from: the dynamic-sampling training batch, expected signal of a
peer's group, signal selection in the pool (its guarantees kept), and the config."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

import pytest

from node.pool import RolloutPool
from node.selection import (
    RecentTasks,
    expected_signal,
    reward_std,
    select_by_signal,
    trainable_mask,
    trainable_share,
    training_batch,
)
from swarm.config import parse_config
from swarm.errors import ConfigError
from swarm.messages import RolloutGroup, TaskRef
from swarm.staleness import StalenessRule


@dataclass(frozen=True)
class G:
    name: str
    rewards: tuple[float, ...]


def test_training_batch_puts_informative_groups_first_and_caps() -> None:
    flat0, rich1, flat2, rich3 = (
        G("f0", (0.0,) * 4),
        G("r1", (1, 0)),
        G("f2", (1, 1)),
        G("r3", (0, 1)),
    )
    assert [g.name for g in training_batch([flat0, rich1, flat2, rich3], 3)] == ["r1", "r3", "f0"]
    assert [g.name for g in training_batch([flat0, rich1], 1)] == ["r1"]
    # S = I: the identity (the plain silo and every mix are unchanged).
    assert training_batch([flat0, rich1, flat2], 3) == [flat0, rich1, flat2]


def test_expected_signal_peaks_at_half_right_and_falls_with_novelty() -> None:
    def rewards(right: int) -> tuple[float, ...]:
        return (1.0,) * right + (0.0,) * (8 - right)

    scores = [expected_signal(rewards(k)) for k in range(9)]
    assert scores[0] == scores[8] == 0.0
    assert max(range(9), key=scores.__getitem__) == 4
    assert scores[1] < scores[2] < scores[3] < scores[4] and scores[7] == pytest.approx(scores[1])
    assert scores[4] == pytest.approx(0.5)
    assert expected_signal(rewards(4), seen=1) == pytest.approx(0.25)
    assert reward_std([0.0, 0.1]) == pytest.approx(0.05)  # a format-only difference is small
    with pytest.raises(ValueError):
        expected_signal(rewards(4), seen=-1)


def test_select_by_signal_prefers_signal_and_novelty_and_keeps_the_caps() -> None:
    half = (1.0, 1.0, 0.0, 0.0)
    one_right = (1.0, 0.0, 0.0, 0.0)
    candidates = [
        ("a", "t1", one_right),  # 0
        ("a", "t2", half),  # 1
        ("a", "t3", half),  # 2
        ("a", "t4", half),  # 3: a third from a, over the cap
        ("b", "t2", half),  # 4: same task as 1
        ("c", "t5", half),  # 5: a task we trained lately
    ]
    chosen = select_by_signal(candidates, 4, per_sender_cap=2, seen={"t5": 3})
    assert chosen[:2] == [1, 2]  # highest signal, in the given (random) order
    assert Counter(candidates[i][0] for i in chosen)["a"] <= 2
    assert len(set(chosen)) == len(chosen) == 4  # without replacement
    # Then a is capped; b's t2 (trained once in this call: 0.5 / 2) and c's t5 (seen 3
    # times lately: 0.5 / 4) are all that is left, in that order.
    assert chosen[2:] == [4, 5]
    assert select_by_signal(candidates, 0, 2, {}) == []
    # One per sender, nothing seen lately: c's fresh t5 (0.5) beats b's t2 once picked.
    assert select_by_signal(candidates, 10, 1, {}) == [1, 5, 4]


def test_trainable_share_counts_the_signal_the_trainer_will_see() -> None:
    half = (1.0, 1.0, 0.0, 0.0)
    assert trainable_share(half, (True,) * 4) == 1.0
    assert trainable_share(half, (False,) * 4) == 0.0
    assert trainable_share(half, (True, False, True, False)) == pytest.approx(0.5)
    # the signal_bait shape: the right half is unfinished, the wrong half ended
    assert trainable_share(half, (False, False, True, True)) == pytest.approx(0.5)
    # one right of four: the right one carries half the deviation
    assert trainable_share((1.0, 0.0, 0.0, 0.0), (True, False, False, False)) == pytest.approx(
        0.5
    )
    assert trainable_share((1.0, 1.0), (True, True)) == 0.0  # no variance, no signal
    with pytest.raises(ValueError):
        trainable_share(half, (True,))


def test_trainable_mask_follows_the_trajectory_rule() -> None:
    finished = (True, False)
    assert trainable_mask(finished, "ended") == (True, False)
    assert trainable_mask(finished, "whole") == (True, True)
    assert trainable_mask(finished, "text") == (True, True)


def test_select_by_signal_weighs_each_candidate_by_its_trainable_share() -> None:
    half = [1.0] * 4 + [0.0] * 4  # std 0.5
    one = [1.0] + [0.0] * 7  # std 0.33
    candidates = [("a", "t1", half), ("b", "t2", one)]
    assert select_by_signal(candidates, 1, 2, {}) == [0]
    assert select_by_signal(candidates, 1, 2, {}, shares=[0.5, 1.0]) == [1]
    with pytest.raises(ValueError):
        select_by_signal(candidates, 1, 2, {}, shares=[1.0])


def test_recent_tasks_count_over_a_window_of_our_rounds() -> None:
    recent = RecentTasks(window=2)
    recent.note(1, ["x", "y"])
    recent.note(2, ["x"])
    assert recent.counts(2) == {"x": 2, "y": 1}
    assert recent.counts(3) == {"x": 1}  # round 1 fell out of the window (rounds 2, 3)
    assert recent.counts(4) == {}
    off = RecentTasks(window=0)
    off.note(1, ["x"])
    assert off.counts(1) == {}


def _group(index: int, prompt: str, rewards: tuple[float, ...]) -> RolloutGroup:
    completions = tuple("1" if r else "0" for r in rewards)
    return RolloutGroup(TaskRef("add", 0, index), prompt, completions, rewards, "m", 0)


def _pool(selection: str, cap: int = 2) -> RolloutPool:
    return RolloutPool(64, 1 << 20, StalenessRule(2, 4), cap, seed=1, selection=selection)  # type: ignore[arg-type]


def _fill(p: RolloutPool, own_round: int = 5) -> None:
    for s in range(4):
        for i, right in enumerate((1, 2, 4, 4)):  # pass rates 1/8, 2/8, 1/2, 1/2
            rewards = (1.0,) * right + (0.0,) * (8 - right)
            g = _group(10 * s + i, f"{s}+{i}=", rewards)
            assert p.add(f"s{s}", g, rewards, own_round=own_round, sender_version=0, now=0) is None


def test_pool_signal_selection_keeps_staleness_cap_and_no_replacement() -> None:
    p = _pool("signal")
    _fill(p)
    chosen = p.select(6, 5, lambda s: 0, 0.0, trained=["0+2="])
    assert len(chosen) == 6
    assert max(Counter(e.sender for e in chosen).values()) <= 2
    assert all(sum(e.rewards) == 4 for e in chosen)  # the half-right groups first
    assert "0+2=" not in {e.group.prompt for e in chosen}  # trained this round: half as novel
    again = p.select(16, 5, lambda s: 0, 0.0)
    assert not {id(e) for e in chosen} & {id(e) for e in again}  # each entry used once
    # Stale entries are never drawn: 3 of our rounds after arrival, all are gone.
    p2 = _pool("signal")
    _fill(p2, own_round=5)
    assert p2.select(8, 8, lambda s: 0, 0.0) == [] and len(p2) == 0


def test_pool_signal_selection_skips_a_task_trained_this_round() -> None:
    p = _pool("signal", cap=4)
    half = (1.0,) * 4 + (0.0,) * 4
    for i, prompt in enumerate(["seen=", "new="]):
        p.add("s", _group(i, prompt, half), half, own_round=0, sender_version=0, now=0)
    chosen = p.select(1, 0, lambda s: 0, 0.0, trained=["seen="])
    assert [e.group.prompt for e in chosen] == ["new="]


def test_uniform_selection_is_unchanged_by_the_signal_option() -> None:
    p = _pool("uniform")
    _fill(p)
    # The draw before `external_selection` existed: one seeded shuffle, then the cap.
    legacy = list(p.entries)
    random.Random(1).shuffle(legacy)
    expected, taken = [], Counter()
    for entry in legacy:
        if len(expected) < 6 and taken[entry.sender] < 2:
            taken[entry.sender] += 1
            expected.append(entry.group.prompt)
    drawn = [e.group.prompt for e in p.select(6, 5, lambda s: 0, 0.0, trained=["0+2="])]
    assert drawn == expected
    signal = _pool("signal")
    _fill(signal)
    low = [e for e in signal.select(6, 5, lambda s: 0, 0.0) if sum(e.rewards) < 4]
    assert low == []
    uniform = _pool("uniform")
    _fill(uniform)
    drawn = uniform.select(8, 5, lambda s: 0, 0.0)
    assert any(sum(e.rewards) < 4 for e in drawn)  # uniform does not look at rewards


def test_config_sampled_groups_and_selection_are_validated() -> None:
    ok = parse_config({"sapo": {"local_groups": 8, "external_groups": 0, "sampled_groups": 16}})
    assert ok.sapo.groups_sampled == 16
    assert parse_config({"sapo": {"local_groups": 4}}).sapo.groups_sampled == 4
    with pytest.raises(ConfigError, match=r"sampled_groups.*>= local_groups"):
        parse_config({"sapo": {"local_groups": 8, "sampled_groups": 4}})
    with pytest.raises(ConfigError, match="external_selection"):
        parse_config({"sapo": {"external_selection": "best"}})
    assert math.isclose(expected_signal((1.0, 0.0)), 0.5)


def test_a_dynamic_sampling_silo_samples_s_and_trains_i_informative_first(tmp_path) -> None:
    import asyncio

    from gossip.memory import MemoryNetwork
    from node.metrics import read_metrics
    from tests.node.helpers import stub_config, stub_node

    config = stub_config(tmp_path, "ds", local_groups=2, external_groups=0, sampled_groups=8)
    node = stub_node(config, MemoryNetwork("ds"))
    node.learner.skill, node.learner.rate = 0.03, 0.0  # type: ignore[attr-defined]  # sparse signal
    sampled: list[int] = []
    trained: list[int] = []
    sample, train = node.learner.sample, node.learner.train

    def informative(groups) -> int:  # type: ignore[no-untyped-def]
        return sum(len(set(g.rewards)) > 1 for g in groups)

    def sample_spy(refs, seed):  # type: ignore[no-untyped-def]
        result = sample(refs, seed)
        sampled.append(informative(result.groups))
        return result

    def train_spy(local, external):  # type: ignore[no-untyped-def]
        assert len(local) == 2  # I of the S sampled
        trained.append(informative(local))
        return train(local, external)

    node.learner.sample = sample_spy  # type: ignore[method-assign]
    node.learner.train = train_spy  # type: ignore[method-assign]
    asyncio.run(node.run(12))
    records = read_metrics(tmp_path / "ds" / "metrics.jsonl")
    assert [r["local_groups"] for r in records] == [8] * 12  # all S sampled and published
    assert trained == [min(2, n) for n in sampled]  # informative ones first
    assert 0 < sum(trained) < 2 * len(trained)  # the rule was exercised both ways
