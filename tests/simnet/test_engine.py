"""Real stub nodes on the virtual clock: determinism, partitions, churn, loss, relaying."""

from __future__ import annotations

import json
from pathlib import Path

from simnet.engine import Simulation
from simnet.runs import run_scenario
from tests.simnet.helpers import records, scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def _metrics_bytes(run_dir: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in sorted(run_dir.glob("*/metrics.jsonl"))}


def test_same_scenario_and_seed_give_byte_identical_metrics(tmp_path: Path) -> None:
    # The example has loss, reordering, random latency, a partition and a crash/rejoin.
    a = run_scenario(EXAMPLES / "stub_small.toml", tmp_path / "a", seeds=[0])
    b = run_scenario(EXAMPLES / "stub_small.toml", tmp_path / "b", seeds=[0])
    first, second = (
        _metrics_bytes(tmp_path / "a" / "seed-0"),
        _metrics_bytes(tmp_path / "b" / "seed-0"),
    )
    assert len(first) == 6 and first == second
    assert (tmp_path / "a/seed-0/run.json").read_bytes() == (
        tmp_path / "b/seed-0/run.json"
    ).read_bytes()
    assert a["configurations"] == b["configurations"]
    # What each run cost this machine is written apart (it differs run to run).
    cost = json.loads((tmp_path / "a/seed-0/cost.json").read_text())
    assert set(cost) == {"wall_s", "cpu_s", "children_cpu_s"}
    assert cost["wall_s"] > 0 and cost["cpu_s"] > 0 and cost["children_cpu_s"] >= 0
    other = run_scenario(EXAMPLES / "stub_small.toml", tmp_path / "c", seeds=[1])
    assert _metrics_bytes(tmp_path / "c" / "seed-1") != first
    assert other["runs"][0]["cumulative_reward"] != a["runs"][0]["cumulative_reward"]


def test_every_round_is_recorded_with_virtual_time(tmp_path: Path) -> None:
    summary = Simulation(scenario(), None, 0, tmp_path).run()
    for node in summary["nodes"]:
        lines = records(tmp_path, node["name"])
        assert [r["round"] for r in lines] == list(range(1, 13))
        times = [r["time"] for r in lines]
        # virtual_s is rounded to 6 decimals in the summary
        assert times == sorted(times) and times[-1] <= summary["virtual_s"] + 1e-6
        # 2 groups x 1 s sampling + 4 groups x 0.5 s training + 1 s, with +-20% jitter
        assert all(3.2 <= r["seconds"]["total"] <= 6.0 for r in lines)
        assert node["policy_version"] == 12
    assert summary["external_per_round"] > 1.0


def test_nodes_sample_only_the_rounds_they_run(tmp_path: Path, monkeypatch) -> None:
    """No sampling ahead after a node's last round (a round that never comes)."""
    from simnet.stub import StubLearner

    sampled: list[int] = []
    original = StubLearner.sample

    def counted(self: StubLearner, refs: list, seed: int):  # type: ignore[no-untyped-def]
        sampled.append(seed)
        return original(self, refs, seed)

    monkeypatch.setattr(StubLearner, "sample", counted)
    summary = Simulation(scenario(), None, 0, tmp_path).run()
    assert len(sampled) == 12 * len(summary["nodes"])


def test_partition_heals_and_messages_flow_again(tmp_path: Path) -> None:
    sides = {"n-0": 0, "n-1": 0, "n-2": 1, "n-3": 1}
    run = scenario(
        rounds=24,
        faults=[{"type": "partition", "start_s": 30, "end_s": 70, "groups": [["n-0", "n-1"]]}],
    )
    summary = Simulation(run, None, 0, tmp_path).run()
    peers = {n["peer_id"]: n["name"] for n in summary["nodes"]}
    assert summary["network"]["counters"]["partitioned"] > 0
    for node in summary["nodes"]:
        name = node["name"]
        lines = records(tmp_path, name)
        crossing = [
            (r["time"], peers[p])
            for r in lines
            for p in r["external_by_sender"]
            if sides[peers[p]] != sides[name]
        ]
        # Nothing from the other side is trained on once the pool's pre-split groups are
        # stale (well inside the split), but plenty once it has healed.
        assert not [t for t, _ in crossing if 50 <= t <= 70], name
        assert [t for t, _ in crossing if t < 30], name
        assert len([t for t, _ in crossing if t > 80]) >= 3, name
    assert [e["event"] for e in summary["events"]] == ["partition", "healed"]


def _crash_scenario(rejoin_s: float):  # type: ignore[no-untyped-def]
    return scenario(
        rounds=20,
        checkpoint_every=4,
        defaults={
            "sapo": {"local_groups": 2, "external_groups": 2},
            "sampler": {"group_size": 4},
        },
        faults=[{"type": "leave", "node": "n-3", "at_s": 32, "rejoin_s": rejoin_s}],
    )


def test_crashed_node_rejoins_from_its_checkpoint(tmp_path: Path) -> None:
    summary = Simulation(_crash_scenario(50), None, 0, tmp_path).run()
    events = [(e["event"], e.get("node")) for e in summary["events"]]
    assert events == [("crashed", "n-3"), ("rejoined", "n-3")]
    crashed = next(e for e in summary["events"] if e["event"] == "crashed")
    node = next(n for n in summary["nodes"] if n["name"] == "n-3")
    assert node["incarnations"] == 2
    checkpointed = crashed["rounds_done"] // 4 * 4
    assert node["resumed_from"] == [checkpointed] and 0 < checkpointed < crashed["rounds_done"]
    lines = records(tmp_path, "n-3")
    rounds = [r["round"] for r in lines]
    # rounds after the checkpoint were lost with the crash and done again
    assert rounds == list(range(1, crashed["rounds_done"] + 1)) + list(range(checkpointed + 1, 21))
    assert node["policy_version"] == 20 and node["rounds_done"] == 20
    assert all(r["time"] < 32 or r["time"] > 50 for r in lines)
    after = [r for r in lines if r["time"] > 50]
    assert sum(r["external_groups"] for r in after) > 0  # it receives again
    peer = node["peer_id"]
    used_by_others = [
        r
        for other in ("n-0", "n-1", "n-2")
        for r in records(tmp_path, other)
        if r["time"] > 55 and peer in r["external_by_sender"]
    ]
    assert used_by_others  # and its new groups (fresh sequence numbers) are accepted


def test_rejoined_node_far_behind_shares_at_once(tmp_path: Path) -> None:
    # Down for 50 s (about 10 of its peers' rounds), it comes back with an older policy
    # version than it had claimed before the crash: peers judge it by what it runs now.
    summary = Simulation(_crash_scenario(82), None, 0, tmp_path).run()
    node = next(n for n in summary["nodes"] if n["name"] == "n-3")
    after = [r for r in records(tmp_path, "n-3") if r["time"] > 82]
    # Its first round after the rejoin starts with an empty pool; the next ones use peers'.
    assert [r["external_groups"] > 0 for r in after[1:4]] == [True, True, True], after[:4]
    used_by_others = sorted(
        r["time"]
        for other in ("n-0", "n-1", "n-2")
        for r in records(tmp_path, other)
        if r["time"] > 82 and node["peer_id"] in r["external_by_sender"]
    )
    assert used_by_others and used_by_others[0] < 82 + 4 * 5.0, used_by_others
    for other in summary["nodes"][:3]:
        assert other["drops_last_incarnation"].get("stale_version", 0) == 0


def test_graceful_leave_checkpoints_and_loses_nothing(tmp_path: Path) -> None:
    run = scenario(
        rounds=14,
        checkpoint_every=0,
        faults=[{"type": "leave", "node": "n-1", "at_s": 21, "rejoin_s": 30, "graceful": True}],
    )
    summary = Simulation(run, None, 0, tmp_path).run()
    left = next(e for e in summary["events"] if e["event"] == "left")
    assert left["time"] >= 21 and left["graceful"]
    node = next(n for n in summary["nodes"] if n["name"] == "n-1")
    assert node["resumed_from"] == [left["rounds_done"]]
    assert [r["round"] for r in records(tmp_path, "n-1")] == list(range(1, 15))


def test_ten_percent_loss_still_shares(tmp_path: Path) -> None:
    run = scenario(rounds=15, network={"loss": 0.1, "reorder": 0.1})
    summary = Simulation(run, None, 0, tmp_path).run()
    counters = summary["network"]["counters"]
    assert counters["lost"] > 0 and counters["held_back"] > 0
    for node in summary["nodes"]:
        assert node["external_used"] > 0, node["name"]
    assert summary["network"]["mean_reach"]["swarm/t/rollouts"] < 3.0  # some were lost


def test_mesh_relays_deduplicated_and_hop_limited(tmp_path: Path) -> None:
    nodes = [{"name": "m", "count": 24, "model": "stub"}]
    flood = scenario(rounds=4, nodes=nodes, network={"topology": "mesh", "degree": 4})
    sim = Simulation(flood, None, 0, tmp_path / "flood")
    sim.probe("m-0", 3.0, "p")
    summary = sim.run()
    probe = sim.link.probes["p"]
    assert len(probe.arrivals) == 23  # everyone else, exactly once
    assert summary["network"]["counters"]["duplicate"] > 0
    assert summary["network"]["mean_reach"]["swarm/t/rollouts"] == 23.0
    limited = scenario(
        rounds=4, nodes=nodes, network={"topology": "mesh", "degree": 4, "max_hops": 1}
    )
    summary = Simulation(limited, None, 0, tmp_path / "limited").run()
    assert summary["network"]["mean_reach"]["swarm/t/rollouts"] <= 4.0
    assert summary["external_per_round"] > 0.5


def test_shared_pure_work_changes_nothing_but_speed(tmp_path: Path) -> None:
    faults = [{"type": "churn", "fraction": 0.5, "start_s": 10, "end_s": 30, "down_s": 8}]
    network = {"topology": "mesh", "degree": 4, "loss": 0.05}
    nodes = [{"name": "n", "count": 8, "model": "stub"}]
    plain = scenario(rounds=10, checkpoint_every=3, faults=faults, network=network, nodes=nodes)
    shared = scenario(
        rounds=10,
        checkpoint_every=3,
        faults=faults,
        network=network,
        nodes=nodes,
        share_pure_work=True,
    )
    a = Simulation(plain, None, 3, tmp_path / "a").run()
    b = Simulation(shared, None, 3, tmp_path / "b").run()
    assert [e["event"] for e in a["events"]].count("crashed") == 4
    assert _metrics_bytes(tmp_path / "a") == _metrics_bytes(tmp_path / "b")
    assert a == b


def test_hellos_fill_every_peers_table(tmp_path: Path) -> None:
    run = scenario(
        rounds=6,
        announce_every_s=5.0,
        nodes=[{"name": "m", "count": 12, "model": "stub"}],
        network={"topology": "mesh", "degree": 4, "max_hops": 1},
    )
    summary = Simulation(run, None, 0, tmp_path).run()
    for node in summary["nodes"]:
        assert records(tmp_path, node["name"])[-1]["peers"] == 11  # hellos flood the mesh
    assert summary["network"]["mean_reach"]["swarm/t/peers"] == 11.0
