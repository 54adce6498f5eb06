"""The rollout pool: bounds in groups and bytes, fair eviction, staleness, selection."""

from __future__ import annotations

from collections import Counter

from node.pool import RolloutPool
from swarm.messages import RolloutGroup, TaskRef


def group(index: int, text: str = "ab") -> RolloutGroup:
    return RolloutGroup(TaskRef("add", 0, index), "1+1=", (text, text + "x"), (1.0, 0.0), "m", 0)


def pool(**overrides: int) -> RolloutPool:
    settings = {"max_groups": 8, "max_bytes": 1 << 20, "max_staleness": 2, "per_sender_cap": 2}
    settings.update(overrides)
    return RolloutPool(**settings)


def test_a_flooding_sender_pushes_out_its_own_groups_first() -> None:
    p = pool(max_groups=8)
    for i in range(3):
        assert p.add("honest-a", 5, group(i), (1.0, 0.0), 5)
        assert p.add("honest-b", 5, group(i), (1.0, 0.0), 5)
    for i in range(100):
        assert p.add("flooder", 5, group(100 + i), (1.0, 0.0), 5)
    held = Counter(e.sender for e in p.entries)
    assert held == {"honest-a": 3, "honest-b": 3, "flooder": 2}
    assert p.evicted["capacity"] == 98


def test_many_sybil_keys_get_one_fair_share_each() -> None:
    p = pool(max_groups=10)
    for i in range(4):
        p.add("honest", 5, group(i), (1.0, 0.0), 5)
    for i in range(200):
        p.add(f"sybil-{i}", 5, group(i), (1.0, 0.0), 5)
    held = Counter(e.sender for e in p.entries)
    assert len(p) == 10 and held["honest"] >= 1
    assert max(held.values()) <= 4


def test_byte_bound_and_staleness() -> None:
    p = pool(max_bytes=1 << 16)
    big = "z" * 10_000
    for i in range(5):
        p.add(f"s{i}", 5, group(i, big), (1.0, 0.0), 5)
    assert p.bytes_held <= 1 << 16 and len(p) == 3
    assert not p.add("late", 1, group(9), (1.0, 0.0), 5)  # 4 rounds old > max_staleness 2
    assert p.evict_stale(8) == 3 and len(p) == 0 and p.bytes_held == 0


def test_select_draws_without_replacement_and_caps_each_sender() -> None:
    p = pool(max_groups=64, per_sender_cap=2)
    for i in range(6):
        p.add("a", 5, group(i), (1.0, 0.0), 5)
        p.add("b", 5, group(10 + i), (1.0, 0.0), 5)
    chosen = p.select(8, 5)
    assert len(chosen) == 4 and Counter(e.sender for e in chosen) == {"a": 2, "b": 2}
    assert len(p) == 8
    assert not {id(e) for e in chosen} & {id(e) for e in p.entries}
