"""The rollout pool: bounds in groups and bytes, fair eviction, staleness, selection."""

from __future__ import annotations

from collections import Counter

from node.pool import RolloutPool
from swarm.messages import RolloutGroup, TaskRef
from swarm.staleness import StalenessRule


def group(index: int, text: str = "ab", version: int = 0) -> RolloutGroup:
    return RolloutGroup(
        TaskRef("add", 0, index), "1+1=", (text, text + "x"), (1.0, 0.0), "m", version
    )


def pool(max_groups: int = 8, max_bytes: int = 1 << 20, per_sender_cap: int = 2) -> RolloutPool:
    return RolloutPool(max_groups, max_bytes, StalenessRule(2, 4), per_sender_cap)


def add(p: RolloutPool, sender: str, g: RolloutGroup, own_round: int = 5, now: int = 0) -> bool:
    return p.add(sender, g, (1.0, 0.0), own_round=own_round, sender_version=0, now=now) is None


def no_lag(sender: str) -> int:
    return 0


def test_a_flooding_sender_pushes_out_its_own_groups_first() -> None:
    p = pool(max_groups=8)
    for i in range(3):
        assert add(p, "honest-a", group(i))
        assert add(p, "honest-b", group(i))
    for i in range(100):
        assert add(p, "flooder", group(100 + i))
    held = Counter(e.sender for e in p.entries)
    assert held == {"honest-a": 3, "honest-b": 3, "flooder": 2}
    assert p.evicted["capacity"] == 98


def test_many_sybil_keys_get_one_fair_share_each() -> None:
    p = pool(max_groups=10)
    for i in range(4):
        add(p, "honest", group(i))
    for i in range(200):
        add(p, f"sybil-{i}", group(i))
    held = Counter(e.sender for e in p.entries)
    assert len(p) == 10 and held["honest"] >= 1
    assert max(held.values()) <= 4


def test_byte_bound_and_staleness_in_our_own_rounds() -> None:
    p = pool(max_bytes=1 << 16)
    big = "z" * 10_000
    for i in range(5):
        add(p, f"s{i}", group(i, big), own_round=5)
    assert p.bytes_held <= 1 << 16 and len(p) == 3
    assert p.evict_stale(7, no_lag, 0.0) == 0  # 2 of our rounds since arrival: usable
    assert p.evict_stale(8, no_lag, 0.0) == 3 and len(p) == 0 and p.bytes_held == 0


def test_version_lag_is_judged_against_the_senders_current_version() -> None:
    p = pool()
    refused = p.add("s", group(0, version=1), (1.0, 0.0), own_round=0, sender_version=6, now=0)
    assert refused == "stale_version"
    assert p.evicted["stale_on_arrival"] == 1
    assert add(p, "s", group(1, version=3))
    assert p.evict_stale(5, lambda sender: 7, 0.0) == 0  # 4 behind: usable...
    assert p.select(4, 5, lambda sender: 8, 0.0) == []  # ...5 behind: evicted as stale
    assert len(p) == 0 and p.evicted["stale"] == 1


def test_select_draws_without_replacement_and_caps_each_sender() -> None:
    p = pool(max_groups=64, per_sender_cap=2)
    for i in range(6):
        add(p, "a", group(i))
        add(p, "b", group(10 + i))
    chosen = p.select(8, 5, no_lag, 0.0)
    assert len(chosen) == 4 and Counter(e.sender for e in chosen) == {"a": 2, "b": 2}
    assert len(p) == 8
    assert not {id(e) for e in chosen} & {id(e) for e in p.entries}


def test_evict_stale_keeps_exactly_the_usable_entries_in_order() -> None:
    """Against `usable` per entry; the sender's version is asked once per sender."""
    p = pool(max_groups=64)
    for i in range(12):
        sender = ("a", "b", "c")[i % 3]
        assert p.add(sender, group(i, version=i % 4), (1.0, 0.0), own_round=i % 5,
                     sender_version=0, now=float(i)) is None  # fmt: skip
    versions = {"a": 5, "b": 2, "c": 0}
    asked: Counter[str] = Counter()

    def version_of(sender: str) -> int:
        asked[sender] += 1
        return versions[sender]

    expected = [e for e in p.entries if p.usable(e, 6, versions.__getitem__, 0.0)]
    held = sum(e.size_bytes for e in expected)
    assert 0 < len(expected) < len(p)
    assert p.evict_stale(6, version_of, 0.0) == 12 - len(expected)
    assert p.entries == expected and p.bytes_held == held
    assert asked == {"a": 1, "b": 1, "c": 1}
    assert p.evicted["stale"] == 12 - len(expected)
