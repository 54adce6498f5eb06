"""A hostile peer publishing poisoned weight deltas (-1000x its true update) in simnet:
with the default robust merge (trimmed mean + norm clipping) the honest nodes learn at
least about as well as with delta sharing off."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from simnet.engine import Simulation
from simnet.scenario import parse_scenario
from swarm.errors import ConfigError
from tests.simnet.helpers import records

HONEST = ["h-0", "h-1", "h-2"]


def _scenario(deltas: dict[str, Any]) -> dict[str, Any]:
    """3 honest nodes + 1 poisoner of one model family learning `digit` from scratch."""
    return {
        "name": "poison",
        "rounds": 12,
        "seeds": [0],
        "checkpoint_every": 0,
        "defaults": {
            "sampler": {"group_size": 8, "max_new_tokens": 2},
            "train": {"learning_rate": 3e-4},
            "rewards": {"format_weight": 0.5},
            "tasks": {"mixture": [{"source": "digit"}]},
            "sapo": {"local_groups": 4, "external_groups": 4, "max_staleness": 4},
            "deltas": deltas,
        },
        "nodes": [
            {"name": "h", "count": 3, "model": "builtin:tiny", "init": "family"},
            {
                "name": "bad",
                "model": "builtin:tiny",
                "init": "family",
                "behavior": "poison_deltas",
            },
        ],
        "network": {"latency": {"type": "constant", "ms": 20}},
    }


def _run(tmp: Path, deltas: dict[str, Any]) -> tuple[float, list[dict[str, Any]], Simulation]:
    sim = Simulation(parse_scenario(_scenario(deltas)), None, 0, tmp)
    sim.run()
    lines = [r for name in HONEST for r in records(tmp, name)]
    cumulative = sum(r["mean_local_reward"] or 0.0 for r in lines) / len(HONEST)
    return cumulative, lines, sim


def test_poisoner_is_refused_on_stub_nodes() -> None:
    data = _scenario({"enabled": False})
    data["nodes"][1]["model"] = "stub"
    with pytest.raises(ConfigError, match="poison_deltas"):
        parse_scenario(data)


@pytest.mark.slow
def test_honest_nodes_survive_poisoned_deltas(tmp_path: Path) -> None:
    off, _, _ = _run(tmp_path / "off", {"enabled": False})
    on, lines, sim = _run(tmp_path / "on", {"enabled": True, "every_k_steps": 2})
    shared = [r["deltas"] for r in lines if r.get("deltas") and r["deltas"].get("bytes_out")]
    assert shared, "honest nodes never published a delta"
    # the poisoner's packets were accepted (same family): 2 honest peers + it, and clipped
    merges = [d["aggregate"] for d in shared if d.get("aggregate")]
    assert any(m["peers"] == 3 and m["clipped"] >= 1 for m in merges)
    assert all(math.isfinite(r["mean_local_reward"] or 0.0) for r in lines)
    for sn in sim.nodes:
        if sn.plan.name in HONEST:
            assert sn.node is not None
            learner = sn.node.learner.inner  # TimedLearner around the PolicyLearner
            assert all(torch.isfinite(p).all() for p in learner.model.parameters())
    assert on >= 0.9 * off, f"with poisoner {on:.3f} vs deltas off {off:.3f}"
