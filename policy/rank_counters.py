"""A training step's counters summed over a node's ranks (`policy.parallel`).

Invariants: each rank counts only its own micro-batches; every rank calls these in the
same order with values of the same length (one all-reduce each, float64), and gets the
whole step's totals back, as one process would have counted them.
"""

from __future__ import annotations

from collections import defaultdict

from policy.parallel import ParallelModel
from policy.train_types import StepStats


def left_out_across_ranks(
    parallel: ParallelModel,
    n_left_out: int,
    tokens_left_out: int,
    stats: StepStats,
    sums: dict[bool, list],
) -> tuple[int, int]:
    """The plausibility counters in `stats` and the weight sums in `sums` (peer? ->
    [weight sum, tokens]) made the step's; returns the rows and tokens left out."""
    total = parallel.sum(
        [
            n_left_out,
            tokens_left_out,
            stats.n_peer_plausible,
            stats.n_peer_implausible,
            *sums[False],
            *sums[True],
        ]
    )
    stats.n_peer_plausible, stats.n_peer_implausible = int(total[2]), int(total[3])
    sums[False] = [total[4], int(total[5])]
    sums[True] = [total[6], int(total[7])]
    return int(total[0]), int(total[1])


def computed_across_ranks(
    parallel: ParallelModel,
    tokens_computed: int,
    padding_tokens: int,
    group_lp: defaultdict[int, list[float]],
    n_groups: int,
) -> tuple[int, int]:
    """Tokens computed and padded, and each group's [logprob sum, tokens] in `group_lp`
    (updated in place), over all ranks; returns (tokens computed, padding tokens)."""
    flat = [float(tokens_computed), float(padding_tokens)]
    for i in range(n_groups):
        flat += group_lp[i] if i in group_lp else [0.0, 0]
    total = parallel.sum(flat)
    group_lp.clear()
    for i in range(n_groups):
        if total[3 + 2 * i]:
            group_lp[i] = [total[2 + 2 * i], int(total[3 + 2 * i])]
    return int(total[0]), int(total[1])
