"""Honest tiny-model nodes merging deltas beside a peer that publishes poison.

Production `Node` + `PolicyLearner` over the memory transport on the wall clock
(`tests.node.delta_swarm`, the delta frontier benchmark's swarm), sequential and seeded
(so the comparison is exact, not noisy between runs).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.node.delta_swarm import run_swarm

pytestmark = pytest.mark.slow


def test_poisoned_deltas_do_not_hurt_honest_nodes(tmp_path: Path) -> None:
    off = run_swarm(tmp_path / "off", None, seed=0, rounds=12, nodes=3)
    poisoned = run_swarm(tmp_path / "poisoned", {}, seed=0, rounds=12, nodes=3, poisoners=1)
    assert poisoned["bytes_per_share"] > 0  # deltas really were exchanged
    # ...and merged, the poisoner's among them (2 honest peers + the poisoner per node).
    assert poisoned["merges"] > 0 and poisoned["most_peers_merged"] == 3, poisoned
    assert math.isfinite(poisoned["cumulative"])
    # "Not worse than with delta sharing off": within 10% (one seed, 12 rounds).
    assert poisoned["cumulative"] >= 0.9 * off["cumulative"], (poisoned, off)
