"""simnet at protocol scale: 10, 100 and 1,000 stub nodes on a GossipSub-like mesh.

Usage: .venv/bin/python benchmarks/simnet_scale.py [--nodes 10 100 1000] [--rounds 100]
       [--degree 6] [--max-hops 1] [--json out.json]

Each node is a real `Node` + `Gossip` (Ed25519 signing and verification, msgpack
codec, local re-scoring, the rollout pool) with the stub learner, on a mesh where each
node has about `degree` links and rollout batches travel `max-hops` hops (relayed once
per node, deduplicated). Per swarm size it prints: wall and CPU time (build + run); link
bytes sent per node per round (every transmission, relays included) and the node's own
published bytes; how many nodes one rollout batch reaches; rounds until 95% of nodes have seen a
message (hellos flooded from 3 nodes at rounds 10, 40 and 70, in units of the mean round
time); external groups trained per round; and the swarm round at the end (the Lamport
clock runs ahead of the per-node round count).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simnet.engine import Simulation
from simnet.scenario import Scenario, parse_scenario


def scale_scenario(
    nodes: int,
    rounds: int,
    degree: int,
    max_hops: int,
    share: bool = True,
    mix: tuple[int, int, int] = (4, 4, 8),
) -> Scenario:
    local, external, group = mix
    return parse_scenario(
        {
            "name": "scale",
            "rounds": rounds,
            "seeds": [0],
            "checkpoint_every": 0,
            "start_spread_s": 5.0,
            "share_pure_work": share,
            "defaults": {
                "sapo": {
                    "local_groups": local,
                    "external_groups": external,
                    "max_staleness": 2,
                },
                "sampler": {"group_size": group},
            },
            "compute": {
                "sample_s_per_group": 1.0,
                "train_s_per_group": 0.5,
                "round_overhead_s": 0.5,
                "jitter": 0.1,
            },
            "nodes": [{"name": "n", "count": nodes, "model": "stub"}],
            "network": {
                "topology": "mesh",
                "degree": degree,
                "max_hops": max_hops,
                "latency": {"type": "uniform", "low_ms": 20, "high_ms": 150},
                "bandwidth_mbps": 100,
            },
        },
        "simnet_scale",
    )


def measure(
    nodes: int,
    rounds: int,
    degree: int,
    max_hops: int,
    share: bool = True,
    mix: tuple[int, int, int] = (4, 4, 8),
) -> dict[str, Any]:
    scenario = scale_scenario(nodes, rounds, degree, max_hops, share, mix)
    round_s = mix[0] * 1.0 + (mix[0] + mix[1]) * 0.5 + 0.5  # nominal, to place the probes
    with tempfile.TemporaryDirectory(prefix="simnet-scale-") as tmp:
        started, cpu_started = time.perf_counter(), time.process_time()
        sim = Simulation(scenario, None, 0, Path(tmp))
        labels = []
        for k, at_round in enumerate((10, 40, 70)):
            if at_round < rounds:
                label = f"probe-{at_round}"
                sim.probe(f"n-{(k * 7919) % nodes}", at_round * round_s, label)
                labels.append(label)
        built = time.perf_counter()
        summary = sim.run()
        wall = time.perf_counter() - started  # build + run; not deleting the output
        cpu = time.process_time() - cpu_started
    mean_round = summary["virtual_s"] / rounds
    need = math.ceil(0.95 * (nodes - 1))
    reach_rounds = []
    for label in labels:
        probe = sim.link.probes.get(label)
        seconds = None if probe is None else probe.time_to_reach(need)
        reach_rounds.append(None if seconds is None else seconds / mean_round)
    reached = [r for r in reach_rounds if r is not None]
    own_bytes = statistics.fmean(
        (sn.node.gossip.counters.bytes_out if sn.node else 0) / rounds for sn in sim.nodes
    )
    network = summary["network"]
    return {
        "nodes": nodes,
        "rounds": rounds,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "build_s": round(built - started, 2),
        "node_rounds_per_s": round(nodes * rounds / wall, 1),
        "link_bytes_per_node_round": network["bytes_per_node_round"],
        "own_bytes_per_node_round": round(own_bytes, 1),
        "batch_reach": network["mean_reach"].get("swarm/scale/rollouts"),
        "rounds_to_95pct": round(max(reached), 3)
        if reached and len(reached) == len(labels)
        else None,
        "probe_rounds": [None if r is None else round(r, 3) for r in reach_rounds],
        "external_per_round": round(summary["external_per_round"], 3),
        "policy_version_end": max(n["policy_version"] for n in summary["nodes"]),
        "mean_degree": network["mean_degree"],
        "events": summary["events_run"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--degree", type=int, default=6)
    ap.add_argument("--max-hops", type=int, default=1)
    ap.add_argument(
        "--mix",
        type=int,
        nargs=3,
        default=[4, 4, 8],
        metavar=("I", "J", "G"),
        help="local groups, external groups, completions per group (default 4 4 8)",
    )
    ap.add_argument(
        "--no-share",
        action="store_true",
        help="every receiver decodes, verifies and re-scores on its own (slower, same metrics)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    header = (
        f"{'nodes':>6} {'wall s':>8} {'cpu s':>8} {'node-rounds/s':>13} {'link B/node/round':>17} "
        f"{'own B/node/round':>16} {'batch reach':>11} {'rounds to 95%':>13} "
        f"{'external/round':>14} {'max version':>11}"
    )
    print(
        f"stub nodes ({args.mix[0]} local / {args.mix[1]} external groups of "
        f"{args.mix[2]}), {args.rounds} rounds, mesh degree {args.degree}, "
        f"rollouts {args.max_hops or 'unlimited'} hop(s), hellos flooded, "
        f"shared pure work {'off' if args.no_share else 'on'}"
    )
    print(header)
    for n in args.nodes:
        row = measure(
            n, args.rounds, args.degree, args.max_hops, not args.no_share, tuple(args.mix)
        )
        rows.append(row)
        reach = "-" if row["rounds_to_95pct"] is None else f"{row['rounds_to_95pct']:.2f}"
        print(
            f"{n:>6} {row['wall_s']:>8.1f} {row['cpu_s']:>8.1f} {row['node_rounds_per_s']:>13.0f} "
            f"{row['link_bytes_per_node_round']:>17.0f} {row['own_bytes_per_node_round']:>16.0f} "
            f"{row['batch_reach']:>11.1f} {reach:>13} {row['external_per_round']:>14.2f} "
            f"{row['policy_version_end']:>11}",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
