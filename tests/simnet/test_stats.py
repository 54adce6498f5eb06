"""Paired-ratio intervals and the silo-control table of simnet reports."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simnet.report import NodeRun, RunData, control_rows, markdown
from simnet.stats import (
    paired_difference_interval,
    paired_ratio_interval,
    paired_ratios,
    t_quantile_975,
)


def test_t_quantiles() -> None:
    assert t_quantile_975(1) == pytest.approx(12.706)
    assert t_quantile_975(4) == pytest.approx(2.776)
    assert t_quantile_975(60) == pytest.approx(2.000, abs=0.003)
    assert t_quantile_975(10_000) == pytest.approx(1.96, abs=0.001)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_paired_ratio_interval_by_hand() -> None:
    ratios = [1.1, 1.3, 1.5, 1.2, 1.4]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 4)
    got = paired_ratio_interval(ratios)
    assert got.n == 5
    assert got.mean == pytest.approx(math.exp(mean))
    assert got.low == pytest.approx(math.exp(mean - 2.776 * sd / math.sqrt(5)))
    assert got.high == pytest.approx(math.exp(mean + 2.776 * sd / math.sqrt(5)))
    assert got.low < got.mean < got.high
    assert got.text().startswith("1.29x [")
    # Identical ratios: a zero-width interval; one ratio: none.
    same = paired_ratio_interval([2.0, 2.0, 2.0])
    assert same.low == pytest.approx(2.0) and same.high == pytest.approx(2.0)
    one = paired_ratio_interval([1.5])
    assert one.low is None and one.text() == "1.50x"
    # The interval excludes 1 only when the seeds agree: wide spread, same mean.
    assert (
        paired_ratio_interval([0.8, 1.8, 1.3]).low
        < 1.0
        < paired_ratio_interval([1.25, 1.3, 1.28]).low
    )
    for bad in ([], [1.0, 0.0], [-1.0]):
        with pytest.raises(ValueError):
            paired_ratio_interval(bad)


def test_paired_difference_interval_by_hand() -> None:
    diffs = [0.10, 0.30, 0.20]
    sd = math.sqrt(((0.1 - 0.2) ** 2 + (0.3 - 0.2) ** 2) / 2)
    got = paired_difference_interval(diffs)
    assert got.n == 3 and got.mean == pytest.approx(0.2)
    assert got.low == pytest.approx(0.2 - 4.303 * sd / math.sqrt(3))
    assert got.high == pytest.approx(0.2 + 4.303 * sd / math.sqrt(3))
    assert got.text(100) == f"+20.0 [{100 * got.low:+.1f}, {100 * got.high:+.1f}]"
    assert got.low < 0 < got.high  # three seeds that disagree this much: not significant
    one = paired_difference_interval([-0.05])
    assert one.low is None and one.text(100) == "-5.0"
    for bad in ([], [0.1, float("nan")]):
        with pytest.raises(ValueError):
            paired_difference_interval(bad)


def test_paired_ratios_match_seeds() -> None:
    assert paired_ratios({0: 2.0, 1: 3.0, 2: 5.0}, {1: 1.5, 0: 1.0, 3: 9.0}) == [2.0, 2.0]
    assert paired_ratios({0: 1.0}, {0: 0.0}) == []


def _run(label: str, seed: int, local: int, external: int, reward: float) -> RunData:
    run = RunData(Path("."), label, seed, {"final_reward": reward})
    for i in range(2):
        run.nodes.append(
            NodeRun(f"n{i}", "node", "stub", local, external, [reward] * 4, [external] * 4, [1] * 4)
        )
    return run


def test_control_rows_compare_every_configuration_with_every_silo() -> None:
    runs = (
        [_run("8/0", s, 8, 0, r) for s, r in enumerate([0.10, 0.20, 0.30])]
        + [_run("DS", s, 8, 0, r) for s, r in enumerate([0.20, 0.40, 0.60])]
        + [_run("4/4", s, 4, 4, r) for s, r in enumerate([0.15, 0.30, 0.45])]
    )
    controls, rows = control_rows(runs)
    assert controls == ["8/0", "DS"]
    by_label = {row["label"]: row["vs"] for row in rows}
    assert by_label["4/4"]["8/0"].mean == pytest.approx(1.5)
    assert by_label["4/4"]["DS"].mean == pytest.approx(0.75)
    assert by_label["DS"]["8/0"].low == pytest.approx(2.0)  # the same ratio every seed
    text = markdown(runs, "t")
    assert "| 4/4 | 1.50x [1.50, 1.50] | 0.75x [0.75, 0.75] |" in text
