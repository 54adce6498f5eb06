"""Our rollout batches paced under peers' per-sender rate limits (`node.publish_pacing`)."""

from __future__ import annotations

from itertools import pairwise

import pytest

from node.publish_pacing import MAX_GROUPS, BatchPacer
from swarm.messages import RolloutGroup, TaskRef


def _group(index: int, version: int = 0) -> RolloutGroup:
    return RolloutGroup(
        TaskRef("digit", 1, index), "1=", ("1", "2"), (1.0, 0.0), "builtin:tiny", version,
        (True, True), "tiny",
    )  # fmt: skip


def test_slow_rounds_publish_each_batch_at_once() -> None:
    pacer = BatchPacer(max_batches_per_s=10)
    for round_ in range(5):
        batch = pacer.offer([_group(round_)], now=round_ * 1.0)
        assert batch == (_group(round_),)
    assert pacer.held == 0


def test_fast_rounds_are_coalesced_under_the_rate_and_keep_their_versions() -> None:
    pacer = BatchPacer(max_batches_per_s=10)
    batches, times = [], []
    for round_ in range(100):  # 50 rounds a second for 2 s
        now = round_ * 0.02
        batch = pacer.offer([_group(round_, version=round_)], now=now)
        if batch is not None:
            batches.append(batch)
            times.append(now)
    assert all(b - a >= 0.1 - 1e-9 for a, b in pairwise(times))
    assert len(batches) >= 16  # not far below 10 a second either
    sent = [g for batch in batches for g in batch]
    assert [g.policy_version for g in sent] == list(range(len(sent)))  # in order, each its own
    assert len(sent) >= 100 - 6  # only the groups of the last interval still wait
    assert pacer.offer([], now=10.0) == tuple(_group(i, i) for i in range(len(sent), 100))


def test_pending_groups_are_bounded_newest_kept() -> None:
    pacer = BatchPacer(max_batches_per_s=0.001)
    assert pacer.offer([_group(0)], now=0.0) is not None
    for i in range(1, MAX_GROUPS + 11):
        assert pacer.offer([_group(i)], now=1.0) is None
    assert pacer.dropped == 10
    batch = pacer.offer([], now=2000.0)
    assert batch is not None and len(batch) == MAX_GROUPS
    assert batch[0] == _group(11) and batch[-1] == _group(MAX_GROUPS + 10)


def test_nothing_to_send_sends_nothing() -> None:
    pacer = BatchPacer()
    assert pacer.offer([], now=0.0) is None
    with pytest.raises(ValueError):
        BatchPacer(max_batches_per_s=0)
