"""Late joins in simnet: a node that comes online long after the others shares both ways.

The first design's global round clock made such a node refuse every peer message as
"from the future" and its own groups look stale to everyone; staleness is now measured
by each receiver alone (`swarm.staleness`), so the join time must not matter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simnet.engine import Simulation
from tests.simnet.helpers import records, scenario

ROUND_S = 5.0
"""About one round of the helpers' BASE scenario, in virtual seconds."""


@pytest.mark.parametrize("head_start_rounds", [0, 60])
def test_a_late_joiner_uses_and_is_used_within_a_few_rounds(
    tmp_path: Path, head_start_rounds: int
) -> None:
    join_s = head_start_rounds * ROUND_S
    run = scenario(
        rounds=head_start_rounds + 20,
        nodes=[
            {"name": "early", "count": 3, "model": "stub", "stub": {"skill": 0.3}},
            {"name": "late", "model": "stub", "join_s": join_s, "rounds": 10},
        ],
    )
    summary = Simulation(run, None, 0, tmp_path).run()
    nodes = {n["name"]: n for n in summary["nodes"]}
    late = nodes["late"]
    assert late["rounds_done"] == 10
    assert late["first_external_round"] is not None and late["first_external_round"] <= 3
    for name in ("early-0", "early-1", "early-2"):
        lines = records(tmp_path, name)
        if head_start_rounds:
            assert sum(r["time"] <= join_s for r in lines) >= head_start_rounds - 5
        used_late = [r["round"] for r in lines if late["peer_id"] in r["external_by_sender"]]
        assert used_late, name
        joined_at = sum(r["time"] <= join_s for r in lines)
        assert used_late[0] - joined_at <= 10, (name, joined_at, used_late[:3])


def test_join_s_and_group_rounds_are_validated() -> None:
    with pytest.raises(ValueError, match="join_s"):
        scenario(nodes=[{"name": "n", "model": "stub", "join_s": -1}])
    with pytest.raises(ValueError, match="rounds"):
        scenario(nodes=[{"name": "n", "model": "stub", "rounds": 0}])


def test_a_node_100x_slower_and_its_fast_peers_use_each_others_groups(tmp_path: Path) -> None:
    slow_compute = {"sample_s_per_group": 100.0, "train_s_per_group": 50.0, "jitter": 0.2}
    run = scenario(
        rounds=5,
        nodes=[
            {
                "name": "fast",
                "count": 2,
                "model": "stub",
                # Slow learning keeps reward variance (usable groups) for 640 rounds.
                "stub": {"skill": 0.3, "rate": 0.0005},
                "rounds": 640,  # outlasts the slow node's 5 rounds
            },
            {"name": "slow", "model": "stub", "compute": {**slow_compute, "round_overhead_s": 100}},
        ],
    )
    summary = Simulation(run, None, 0, tmp_path).run()
    nodes = {n["name"]: n for n in summary["nodes"]}
    slow_lines = records(tmp_path, "slow")
    fast_lines = records(tmp_path, "fast-0")
    assert len(slow_lines) == 5
    # About 100 fast rounds per slow one (5 s against ~500 s of virtual time).
    assert 60 <= len([r for r in fast_lines if r["time"] <= slow_lines[0]["time"]]) <= 140
    # Every slow round trains on fast groups, chosen at most max_version_lag (4) versions
    # behind their sender although ~100 fast versions pass per slow round.
    assert all(r["external_groups"] > 0 for r in slow_lines), slow_lines
    lags = [int(lag) for r in slow_lines for lag in r["version_lag"]]
    assert lags and max(lags) <= 4, lags
    for name in ("fast-0", "fast-1"):
        used = [
            r
            for r in records(tmp_path, name)
            if nodes["slow"]["peer_id"] in r["external_by_sender"]
        ]
        # every slow round's groups are used by each fast node
        assert len(used) >= 4, (name, len(used))
