"""What a constant answer scores on each node's held-out sets of a simnet scenario, against
the accuracies its runs recorded: whether a held-out gain is a task learned or a guess.

For each seed and node, rebuilds the node's held-out sets exactly as simnet does (the same
derived model and task seeds) and prints, per source, what the best constant answer scores
under the node's own correctness (`rewards.registry.best_constant`: the one gold answer
of the set that, given to every task, scores best; partial credit counts), that answer,
the share of tasks whose gold answer is the set's most common one (the same figure under
an exact-match scorer), and the node's last recorded accuracy in each configuration
found under the run directory. The sets are built under
the scenario's first variant, or `--variant` (a variant that changes `[tasks]` or
`[eval]` has other sets; then only that variant's runs are shown).
Runs recorded since the eval records carry the scored `constant_answer_accuracy` need no
rebuild (`swarm report` shows it); this reads older runs too. No model is loaded.

    .venv/bin/python benchmarks/constant_answers.py \
        examples/scenarios/real_swarm_specialties_pilot.toml runs/real_swarm_specialties \
        --seeds 0,1,2,3

Wall time: about a second per node and source (reasoning-gym builds the items and scores
every gold answer against every task).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.evaluation import held_out_sets, modal_share
from node.metrics_segments import iter_metrics
from rewards.registry import best_constant
from rewards.tasks import make_task
from simnet.scenario import load_scenario
from simnet.sim_nodes import node_config


def last_accuracy(metrics: Path, name: str) -> float | None:
    """The node's last recorded held-out accuracy on set `name` (None: no evaluation;
    rotated segments read, a running node's torn last line skipped: `iter_metrics`)."""
    found = None
    for record in iter_metrics(metrics):
        evaluation = record.get("eval")
        if not evaluation:
            continue
        sources = evaluation.get("sources")
        found = sources[name]["accuracy"] if sources and name in sources else evaluation["accuracy"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("runs", type=Path, nargs="?", default=None, help="its run directory")
    parser.add_argument("--seeds", default="0", help="comma-separated")
    parser.add_argument("--variant", default=None, help="whose sets (default: the first)")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario)
    variants = {v.name: v for v in scenario.variants}
    if args.variant is not None and args.variant not in variants:
        raise SystemExit(f"no variant {args.variant!r}; known: {', '.join(variants)}")
    variant = variants.get(args.variant) or (scenario.variants[0] if scenario.variants else None)
    arms = sorted(p.name for p in args.runs.iterdir() if p.is_dir()) if args.runs else []
    if args.variant is not None:
        arms = [arm for arm in arms if arm == args.variant]
    by_group: dict[tuple[str, str], list[float]] = defaultdict(list)
    print(
        "| seed | node | held-out set | best constant scores | it is | most common gold's share |"
        + "".join(f" {arm} last |" for arm in arms)
    )
    print("|---|---|---|---|---|---|" + "---|" * len(arms))
    for seed in (int(s) for s in args.seeds.split(",")):
        for group in scenario.nodes:
            for name in group.node_names():
                config = node_config(scenario, variant, group, name, seed, Path("unused"))
                for set_name, refs in held_out_sets(config).items():
                    tasks = [make_task(r) for r in refs]
                    _, share = modal_share(t.answer for t in tasks)
                    best = best_constant(tasks, config.rewards)
                    if best is None:
                        raise SystemExit(f"{name} {set_name}: the constants could not be scored")
                    answer, scored = best
                    by_group[(group.name, set_name)].append(scored)
                    lasts = [
                        last_accuracy(
                            args.runs / arm / f"seed-{seed}" / name / "metrics.jsonl", set_name
                        )
                        for arm in arms
                    ]
                    shown = "".join(" - |" if v is None else f" {100 * v:.1f} |" for v in lasts)
                    print(
                        f"| {seed} | {name} | {set_name} | {100 * scored:.1f} | {answer!r} "
                        f"| {100 * share:.1f} |{shown}"
                    )
    print()
    for (group, set_name), shares in by_group.items():  # scored constants
        print(
            f"{group} on {set_name}: a constant answer scores {100 * statistics.fmean(shares):.1f}"
            f" (mean over {len(shares)} node-seeds)"
        )


if __name__ == "__main__":
    main()
