"""Micro-batches keep a group's rows together where they fit, never exceed the size,
and keep every row once, in order."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from policy.micro_batches import group_runs, micro_batches


@dataclass(frozen=True)
class Row:
    group: int
    i: int


def _rows(sizes: list[int]) -> list[Row]:
    return [Row(g, i) for g, n in enumerate(sizes) for i in range(n)]


def test_groups_stay_together_where_they_fit_and_large_ones_are_split() -> None:
    rows = _rows([3, 2, 5, 1])
    micro = micro_batches(rows, 4)
    assert [[(r.group, r.i) for r in mb] for mb in micro] == [
        [(0, 0), (0, 1), (0, 2)],
        [(1, 0), (1, 1)],
        [(2, 0), (2, 1), (2, 2), (2, 3)],
        [(2, 4), (3, 0)],
    ]
    assert [r for mb in micro for r in mb] == rows
    assert all(len(mb) <= 4 for mb in micro)
    assert [len(run) for run in group_runs(rows)] == [3, 2, 5, 1]
    assert micro_batches([], 4) == []
    with pytest.raises(ValueError, match="size"):
        micro_batches(rows, 0)
