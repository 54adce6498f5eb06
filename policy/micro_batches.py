"""Cutting one GRPO step's rows into micro-batches (pure, no torch).

Invariants: every row lands in exactly one micro-batch, in order; no micro-batch holds
more than `size` rows; a group's consecutive rows share a micro-batch wherever they fit
(its prompt is then computed once by the packed forward); a group larger than `size`
is split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class _InGroup(Protocol):
    @property
    def group(self) -> int: ...


R = TypeVar("R", bound=_InGroup)


def group_runs(rows: Sequence[R]) -> list[list[R]]:
    """Consecutive rows of one group, together."""
    runs: list[list[R]] = []
    for row in rows:
        if runs and runs[-1][-1].group == row.group:
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def micro_batches(rows: Sequence[R], size: int) -> list[list[R]]:
    """At most `size` rows each, a group's rows together where they fit."""
    if size < 1:
        raise ValueError("size must be >= 1")
    micro: list[list[R]] = []
    current: list[R] = []
    for run in group_runs(rows):
        if current and len(current) + len(run) > size:
            micro.append(current)
            current = []
        for row in run:
            if len(current) == size:
                micro.append(current)
                current = []
            current.append(row)
    if current:
        micro.append(current)
    return micro
