"""Confidence intervals for paired ratios (simnet reports).

A configuration is compared with a control run with the same seed (same base model, same
task streams): one ratio per seed. `paired_ratio_interval` summarises those ratios by
their geometric mean with a Student-t interval on the log ratios (ratios multiply, and
log ratios of cumulative rewards are closer to symmetric than the ratios).
`paired_difference_interval` does the same for differences (held-out accuracies, where a
control's 0 makes a ratio meaningless): their mean with a Student-t interval.

Invariants: pure functions of their inputs; the interval contains the (geometric) mean;
with fewer than two values there is no interval (`low` and `high` are None); every ratio
must be > 0 and every difference finite (ValueError otherwise).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""The 0.975 quantile of Student's t for 1..30 degrees of freedom."""


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (two-sided 95%);
    beyond 30, the large-sample approximation 1.96 + 2.4 / df (within 0.003 of exact)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.96 + 2.4 / df


@dataclass(frozen=True)
class RatioInterval:
    n: int
    """Paired ratios (seeds)."""
    mean: float
    """Geometric mean of the ratios."""
    low: float | None
    """Lower end of the 95% interval (None with fewer than two ratios)."""
    high: float | None

    def text(self) -> str:
        """E.g. `1.39x [1.12, 1.72]`."""
        if self.low is None or self.high is None:
            return f"{self.mean:.2f}x"
        return f"{self.mean:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def paired_ratio_interval(ratios: Sequence[float]) -> RatioInterval:
    """Geometric mean of per-seed ratios and its two-sided 95% t-interval (on logs)."""
    if not ratios:
        raise ValueError("no ratios")
    if any(not r > 0 for r in ratios):
        raise ValueError("ratios must be > 0")
    logs = [math.log(r) for r in ratios]
    center = statistics.fmean(logs)
    if len(logs) < 2:
        return RatioInterval(len(logs), math.exp(center), None, None)
    half = t_quantile_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return RatioInterval(
        len(logs), math.exp(center), math.exp(center - half), math.exp(center + half)
    )


def paired_ratios(values: dict[int, float], control: dict[int, float]) -> list[float]:
    """`values[seed] / control[seed]` for the seeds both have (sorted by seed; seeds
    whose control is 0 are left out)."""
    return [values[s] / control[s] for s in sorted(values) if s in control and control[s] > 0]


@dataclass(frozen=True)
class DifferenceInterval:
    n: int
    """Paired differences (seeds)."""
    mean: float
    """Mean of the differences."""
    low: float | None
    """Lower end of the 95% interval (None with fewer than two differences)."""
    high: float | None

    def text(self, scale: float = 1.0) -> str:
        """E.g. `+12.0 [+4.1, +19.9]` (values times `scale`: 100 for percentage points)."""
        if self.low is None or self.high is None:
            return f"{self.mean * scale:+.1f}"
        return f"{self.mean * scale:+.1f} [{self.low * scale:+.1f}, {self.high * scale:+.1f}]"


def paired_difference_interval(differences: Sequence[float]) -> DifferenceInterval:
    """Mean of per-seed differences and its two-sided 95% Student-t interval."""
    if not differences:
        raise ValueError("no differences")
    if any(not math.isfinite(d) for d in differences):
        raise ValueError("differences must be finite")
    center = statistics.fmean(differences)
    if len(differences) < 2:
        return DifferenceInterval(len(differences), center, None, None)
    sd = statistics.stdev(differences)
    half = t_quantile_975(len(differences) - 1) * sd / math.sqrt(len(differences))
    return DifferenceInterval(len(differences), center, center - half, center + half)
