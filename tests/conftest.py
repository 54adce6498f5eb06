"""Suite-wide hooks.

The tests run on two pytest-xdist workers (`make test`: `-n 2 --dist worksteal`: each
worker starts on its half of the collection, and a worker that runs dry takes half of
what the other has not started). The long tests (marked `slow`) are collected first, the
longest first (`slow(seconds=N)`: a rough duration, where one test is far longer than
the rest), so that none of them starts last and runs alone while the other worker idles.
Otherwise the collection order is unchanged (a stable sort).

Measured on the 2-core machine (`make test`): 802 s in one process; two workers 553 s
with the default order, 520 s like this; 553 s when the long tests were dealt one at a
time to both workers (`--dist load --maxschedchunk 1`), where they slowed each other.
"""

from __future__ import annotations

import pytest


def _start_order(item: pytest.Item) -> tuple[bool, float]:
    slow = item.get_closest_marker("slow")
    return slow is None, -float(slow.kwargs.get("seconds", 0)) if slow else 0.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_order)
