"""Honest nodes' learning with 0%, 10% and 30% of the swarm hostile, of each kind.

A simnet swarm of `--nodes` slots (default 10): the honest ones are `builtin:tiny` nodes
learning the `digit` task from random weights with the demo's settings (`--base weak`:
1-digit addition from a 15-step warm start instead), G = 8, SAPO 4 local / 4 external. A
hostile share of the slots is taken by wire attackers of one kind (`simnet.attackers`).
Baselines in the same run: the same honest swarm with no attacker (0%), and the *silo*:
every node alone with 8 local groups per round (no sharing).

Reported, per configuration: honest nodes' cumulative reward (sum over rounds of the mean
reward of a node's own samples, averaged over honest nodes; mean ± std over seeds), the
ratio to the silo runs of the same honest nodes, messages refused at honest nodes by
reason (per honest node, mean over seeds) and how many ignore periods honest nodes
started. The goal: with 30% hostile, honest nodes still beat the silo.

    .venv/bin/python -m benchmarks.hostile_swarm                      # the full table
    .venv/bin/python -m benchmarks.hostile_swarm --quick              # stub learners

Runs are independent simulations (deterministic for a seed) spread over `--jobs`
processes. Poisoned weight deltas are measured by `benchmarks/delta_frontier.py` and
`tests/simnet/test_poisoned_deltas.py` (deltas need one model family, which per-node
initial weights do not give).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from simnet.engine import Simulation
from simnet.scenario import ATTACK_BEHAVIORS, Scenario, parse_scenario

SILO = "silo (no sharing)"
NO_ATTACK = "0% hostile"


def scenario_data(
    label: str,
    honest: int,
    attackers: int,
    behavior: str | None,
    rounds: int,
    quick: bool,
    shape: tuple[int, int, float] = (8, 8, 3e-4),
    base: str = "scratch",
) -> dict[str, Any]:
    group_size, groups, lr = shape  # G; groups trained per round (half local when sharing)
    task = "digit" if base == "scratch" else "add"
    silo = label == SILO
    nodes: list[dict[str, Any]] = [
        {"name": "honest", "count": honest, "model": "stub" if quick else "builtin:tiny"}
    ]
    if attackers:
        nodes.append(
            {
                "name": "hostile",
                "count": attackers,
                "behavior": behavior,
                "hostile": {"every_s": 1.0, "flood_messages": 100, "sybil_keys": 8},
            }
        )
    data: dict[str, Any] = {
        "name": "hostile-swarm",
        "description": label,
        "rounds": rounds,
        "seeds": [0],
        "checkpoint_every": 0,
        "share_pure_work": True,
        "defaults": {
            "sampler": {"group_size": group_size, "max_new_tokens": 2 if task == "digit" else 3},
            "train": {"learning_rate": lr},
            "rewards": {"format_weight": 0.5 if task == "digit" else 0.0},
            "tasks": {"mixture": [{"source": task, "weight": 1.0}]},
            "sapo": {
                "local_groups": groups if silo else groups // 2,
                "external_groups": 0 if silo else groups - groups // 2,
                "max_staleness": 2,
                "per_sender_cap": 2,
            },
        },
        "compute": {
            "sample_s_per_group": 1.0,
            "train_s_per_group": 0.5,
            "round_overhead_s": 0.5,
            "jitter": 0.1,
        },
        "nodes": nodes,
        "network": {
            "topology": "full",
            "latency": {"type": "uniform", "low_ms": 20, "high_ms": 120},
            "max_message_bytes": 256 * 1024,
        },
    }
    if not quick and base == "weak":
        data["warmstart"] = {
            "tasks": [{"source": "add", "weight": 1.0}],
            "steps": 15,
            "batch": 64,
            "lr": 1e-3,
            "answers": "true",
        }
    return data


def configurations(
    slots: int, fractions: list[float], kinds: list[str]
) -> list[tuple[str, int, int, str | None]]:
    """(label, honest nodes, attackers, behaviour) for every configuration measured."""
    found: list[tuple[str, int, int, str | None]] = [
        (SILO, slots, 0, None),
        (NO_ATTACK, slots, 0, None),
    ]
    for kind in kinds:
        for fraction in fractions:
            attackers = round(slots * fraction)
            if 0 < attackers < slots:
                found.append((f"{kind} {fraction:.0%}", slots - attackers, attackers, kind))
    return found


Job = tuple[str, int, int, str | None, int, int, bool, tuple[int, int, float], str]


def run_one(job: Job) -> dict[str, Any]:
    label, honest, attackers, behavior, seed, rounds, quick, shape, base = job
    scenario: Scenario = parse_scenario(
        scenario_data(label, honest, attackers, behavior, rounds, quick, shape, base), label
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = Simulation(scenario, None, seed, Path(tmp)).run()
    refused: Counter[str] = Counter()
    ignores = 0
    for node in summary["nodes"]:
        refused.update(node["drops_last_incarnation"])
        ignores += node["peer_scores_last_incarnation"].get("ignores_started", 0)
    count = len(summary["nodes"])
    return {
        "label": label,
        "seed": seed,
        "honest": honest,
        "attackers": attackers,
        "behavior": behavior,
        "cumulative_reward": summary["cumulative_reward"],
        "per_node": {n["name"]: n["cumulative_reward"] for n in summary["nodes"]},
        "final_reward": summary["final_reward"],
        "external_per_round": summary["external_per_round"],
        "refused_per_node": {k: v / count for k, v in sorted(refused.items())},
        "ignores_per_node": ignores / count,
        "attack_messages": sum(a["messages_sent"] for a in summary["attackers"]),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_label: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_label.setdefault(result["label"], []).append(result)
    # A silo node's run does not depend on which other nodes exist (its seeds, compute
    # jitter and start time derive from its name), so each configuration is compared with
    # the silo runs of *the same* honest nodes: the ratio of their mean cumulative rewards.
    silo = {r["seed"]: r["per_node"] for r in by_label.get(SILO, [])}
    rows = []
    for label, runs in by_label.items():
        mean, std = _mean_std([r["cumulative_reward"] for r in runs])
        paired = []
        for r in runs:
            alone = silo.get(r["seed"], {})
            names = [n for n in r["per_node"] if n in alone]
            base = sum(alone[n] for n in names)
            if names and base > 0:
                paired.append(sum(r["per_node"][n] for n in names) / base)
        refused: Counter[str] = Counter()
        for r in runs:
            refused.update(r["refused_per_node"])
        rows.append(
            {
                "label": label,
                "honest": runs[0]["honest"],
                "attackers": runs[0]["attackers"],
                "behavior": runs[0]["behavior"],
                "seeds": len(runs),
                "cumulative_reward": mean,
                "std": std,
                "vs_silo": statistics.fmean(paired) if paired else None,
                "vs_silo_min": min(paired) if paired else None,
                "external_per_round": statistics.fmean(r["external_per_round"] for r in runs),
                "refused_per_node": {k: v / len(runs) for k, v in refused.items()},
                "ignores_per_node": statistics.fmean(r["ignores_per_node"] for r in runs),
                "wall_s": sum(r["wall_s"] for r in runs),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Honest nodes' cumulative reward over {args.rounds} rounds, {args.nodes} slots, "
        f"seeds {args.seeds}; `vs silo`: per seed, the honest nodes' cumulative reward over "
        "the same nodes' in the silo run; mean over seeds (worst seed).",
        "",
        "| configuration | honest / hostile | cumulative reward | vs silo | external groups "
        "/ round | ignore periods / honest node | refused / honest node (top reasons) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        top = sorted(row["refused_per_node"].items(), key=lambda kv: -kv[1])[:4]
        refused = ", ".join(f"{k} {v:,.0f}" for k, v in top if v >= 0.5) or "-"
        ratio = (
            f"{row['vs_silo']:.2f}x ({row['vs_silo_min']:.2f})"
            if row["vs_silo"] is not None
            else "-"
        )
        lines.append(
            f"| {row['label']} | {row['honest']} / {row['attackers']} | "
            f"{row['cumulative_reward']:.2f} ± {row['std']:.2f} | {ratio} | "
            f"{row['external_per_round']:.2f} | {row['ignores_per_node']:.1f} | {refused} |"
        )
    reasons = sorted({k for row in rows for k in row["refused_per_node"]})
    lines += [
        "",
        "Messages refused at each honest node, by reason (mean per honest node):",
        "",
        "| configuration | " + " | ".join(reasons) + " |",
        "|---|" + "---|" * len(reasons),
    ]
    for row in rows:
        cells = [f"{row['refused_per_node'].get(k, 0):,.0f}" for k in reasons]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, fractions: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {row["label"]: row for row in rows}
    kinds = [k for k in ATTACK_BEHAVIORS if any(r["behavior"] == k for r in rows)]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / max(len(fractions), 1)
    for i, fraction in enumerate(fractions):
        values = [by.get(f"{k} {fraction:.0%}", {}).get("cumulative_reward", 0.0) for k in kinds]
        errors = [by.get(f"{k} {fraction:.0%}", {}).get("std", 0.0) for k in kinds]
        xs = [j + (i - (len(fractions) - 1) / 2) * width for j in range(len(kinds))]
        ax.bar(xs, values, width, yerr=errors, label=f"{fraction:.0%} hostile", capsize=2)
    for label, style in ((SILO, "--"), (NO_ATTACK, ":")):
        if label in by:
            ax.axhline(by[label]["cumulative_reward"], color="k", linestyle=style, label=label)
    ax.set_xticks(range(len(kinds)), kinds, rotation=20)
    ax.set_ylabel("honest nodes' cumulative reward")
    ax.set_title("Honest learning under attack (simnet, builtin:tiny, weak shared base)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10, help="swarm slots (honest + hostile)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.3])
    parser.add_argument("--kinds", nargs="+", default=list(ATTACK_BEHAVIORS))
    parser.add_argument("--jobs", type=int, default=2, help="simulations run in parallel")
    parser.add_argument("--group-size", type=int, default=8, help="G, completions per group")
    parser.add_argument(
        "--groups", type=int, default=8, help="groups trained per round (silo: all local)"
    )
    parser.add_argument(
        "--base",
        choices=("scratch", "weak"),
        default="scratch",
        help="scratch: the `digit` task from random weights (the demo's settings); weak: "
        "1-digit addition from a 15-step warm start",
    )
    parser.add_argument("--lr", type=float, default=3e-4, help="learning rate")
    parser.add_argument("--quick", action="store_true", help="stub model (a smoke run)")
    parser.add_argument("--out", type=Path, help="write the markdown table here")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--plot", type=Path, help="write a bar chart here (PNG)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.kinds) - set(ATTACK_BEHAVIORS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {', '.join(ATTACK_BEHAVIORS)}")
    configs = configurations(args.nodes, args.fractions, args.kinds)
    shape = (args.group_size, args.groups, args.lr)
    jobs: list[Job] = [  # seed-major: every configuration of one seed finishes first
        (*c, seed, args.rounds, args.quick, shape, args.base)
        for seed in args.seeds
        for c in configs
    ]
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result in pool.map(run_one, jobs):
            results.append(result)
            print(
                f"[{len(results)}/{len(jobs)}] {result['label']} seed {result['seed']}: "
                f"cumulative {result['cumulative_reward']:.2f} ({result['wall_s']:.0f} s; "
                f"{time.perf_counter() - start:.0f} s total)",
                file=sys.stderr,
                flush=True,
            )
    rows = aggregate(results)
    table = markdown(rows, args)
    print(table)
    if args.out:
        args.out.write_text(table)
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "rows": rows}, indent=1))
    if args.plot:
        plot(rows, args.plot, args.fractions)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
