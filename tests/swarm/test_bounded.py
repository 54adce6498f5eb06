"""swarm.bounded: the one bounded mapping (its module invariants, one test each)."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from swarm.bounded import BoundedDict


def test_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="max_size"):
        BoundedDict(0)


def test_never_holds_more_than_max_size_and_evicts_the_oldest() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    assert d.set("a", 1) is None
    assert d.set("b", 2) is None
    assert d.set("c", 3) == ("a", 1)  # the evicted pair comes back
    assert list(d.items()) == [("b", 2), ("c", 3)]
    d["d"] = 4
    assert list(d) == ["c", "d"] and len(d) == 2


def test_storing_a_present_key_makes_it_newest_by_default() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    assert d.set("a", 10) is None  # replacing never evicts
    assert d.set("c", 3) == ("b", 2)  # "a" was stored more recently than "b"
    assert dict(d) == {"a": 10, "c": 3}


def test_fifo_keeps_a_present_key_in_its_place() -> None:
    d: BoundedDict[str, int] = BoundedDict(2, fifo=True)
    d["a"], d["b"] = 1, 2
    d["a"] = 10
    assert d.set("c", 3) == ("a", 10)  # first inserted leaves first
    assert dict(d) == {"b": 2, "c": 3}


def test_reading_never_changes_the_order() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    assert d["a"] == 1 and d.get("a") == 1 and "a" in d and d.get("x", 7) == 7
    assert list(d.keys()) == ["a", "b"] and list(d.values()) == [1, 2]
    assert d.set("c", 3) == ("a", 1)
    with pytest.raises(KeyError):
        d["a"]


def test_removing_never_evicts_and_setdefault_stores_once() -> None:
    d: BoundedDict[str, int] = BoundedDict(3)
    d.update({"a": 1, "b": 2, "c": 3})
    del d["a"]
    assert d.pop("b") == 2 and d.pop("zz", None) is None
    with pytest.raises(KeyError):
        d.pop("zz")
    assert d.setdefault("c", 99) == 3 and d.setdefault("e", 5) == 5
    assert dict(d) == {"c": 3, "e": 5}
    d.clear()
    assert len(d) == 0 and d == {}


def test_compares_equal_to_a_dict_with_the_same_items() -> None:
    d: BoundedDict[str, dict[str, int]] = BoundedDict(4)
    d["p"] = {"oversize": 1}
    assert d == {"p": {"oversize": 1}} and d != {}


@pytest.mark.parametrize("fifo", [False, True])
def test_matches_the_hand_rolled_ordered_dict_it_replaces(fifo: bool) -> None:
    """The pattern the call sites used: store (and `move_to_end` unless FIFO), then
    `popitem(last=False)` while over the bound."""
    rng = random.Random(34)
    d: BoundedDict[int, int] = BoundedDict(5, fifo=fifo)
    ref: OrderedDict[int, int] = OrderedDict()
    for step in range(2000):
        key = rng.randrange(12)
        if rng.random() < 0.1:
            assert d.pop(key, None) == ref.pop(key, None)
            continue
        ref[key] = step
        if not fifo:
            ref.move_to_end(key)
        expected = ref.popitem(last=False) if len(ref) > 5 else None
        assert d.set(key, step) == expected
        assert list(d.items()) == list(ref.items())
