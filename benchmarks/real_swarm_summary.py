"""Held-out accuracy and sharing figures of a real-model simnet run, arm by arm.

    .venv/bin/python benchmarks/real_swarm_summary.py runs/real_swarm_pilot [--plot OUT.png]

Reads `<run>/<variant>/seed-<s>/<node>/metrics.jsonl` as `swarm simnet run` writes them
and prints markdown tables: per arm, the mean held-out accuracy at each evaluation
(greedy, or the sampled pass rate where the evaluation sampled: the records'
`eval.samples`, or `--samples K` for runs recorded before that field; each node on its
own held-out set); per node, its accuracy at the first and last evaluation; each arm's
last-evaluation difference to the silo arm, paired by (seed, node) (the same node of the
same seed has the same base, task stream and held-out set in every arm), with a 95%
t-interval over the pairs (the nodes of one swarm are not independent of each other:
read it as a lower bound on the uncertainty); cumulative own reward; and what the node
did with peers' groups (used per round, dropped by reason, how the trainer treated
them); and the wall and CPU time of each arm's runs (`cost.json`). Where nodes were
scored on several task sources (the specialties scenarios), a table per node group (the
node name without its index) and source as well, paired the same way, and the plot has
one panel per group and source. `swarm report` has the reward plots.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def load(
    run: Path, seeds: list[int] | None = None
) -> dict[str, dict[tuple[int, str], list[dict[str, Any]]]]:
    """variant -> (seed, node) -> metrics records (of `seeds`, or all; nodes that have not
    evaluated yet are left out)."""
    out: dict[str, dict[tuple[int, str], list[dict[str, Any]]]] = defaultdict(dict)
    for path in sorted(run.glob("*/seed-*/*/metrics.jsonl")):
        node, seed_dir, variant = path.parent.name, path.parent.parent.name, path.parents[2].name
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if evals(records) and (seeds is None or int(seed_dir.removeprefix("seed-")) in seeds):
            out[variant][(int(seed_dir.removeprefix("seed-")), node)] = records
    return out


def evals(records: list[dict[str, Any]], source: str | None = None) -> list[tuple[int, float]]:
    """(rounds trained before it, accuracy) of each evaluation: over all its sets, or on
    `source` alone (evaluations that did not score it are left out)."""
    if source is None:
        return [(r["round"] - 1, r["eval"]["accuracy"]) for r in records if r.get("eval")]
    return [
        (r["round"] - 1, r["eval"]["sources"][source]["accuracy"])
        for r in records
        if r.get("eval") and source in (r["eval"].get("sources") or {})
    ]


FALL_POINTS = 5.0
"""A node "fell" when its last held-out score is more than this many points under the one
before it."""


def fell_at_last(series: list[tuple[int, float]]) -> bool:
    """Whether the last evaluation scored more than `FALL_POINTS` under the one before it
    (the late fall of docs/real_swarm.md, "Where the swarm loses on one task")."""
    return len(series) >= 2 and 100 * (series[-2][1] - series[-1][1]) > FALL_POINTS


def mean_by_round(series: list[list[tuple[int, float]]]) -> dict[int, float]:
    """Rounds trained -> the mean accuracy of the series that evaluated then."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for points in series:
        for rounds, accuracy in points:
            by_round[rounds].append(accuracy)
    return {r: statistics.fmean(by_round[r]) for r in sorted(by_round)}


def interval(diffs: list[float]) -> str:
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return f"{100 * mean:+.1f}"
    half = T95.get(len(diffs) - 1, 2.0) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return f"{100 * mean:+.1f} [{100 * (mean - half):+.1f}, {100 * (mean + half):+.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--silo", default="silo", help="the control arm's variant name")
    parser.add_argument("--plot", type=Path, help="write held-out accuracy per round here")
    parser.add_argument("--seed", type=int, action="append", help="only this seed (repeatable)")
    parser.add_argument(
        "--samples",
        type=int,
        help="samples per held-out task, for runs recorded before evaluations said (0: greedy)",
    )
    args = parser.parse_args()
    arms = load(args.run, args.seed)
    if args.silo not in arms:
        raise SystemExit(f"no {args.silo!r} variant under {args.run}")
    print(f"held-out score: {decoding(arms, args.samples)}\n")

    print(
        "| arm | nodes | "
        + " | ".join(f"held-out after {r}" for r, _ in _rounds(arms))
        + f" | fell > {FALL_POINTS:g} points at the last evaluation |"
    )
    print("|---|---|" + "---|" * (len(_rounds(arms)) + 1))
    for variant, runs in arms.items():
        means = mean_by_round([evals(records) for records in runs.values()])
        cells = [f"{means[r]:.3f}" if r in means else "-" for r, _ in _rounds(arms)]
        fell = sum(fell_at_last(evals(records)) for records in runs.values())
        print(f"| {variant} | {len(runs)} | " + " | ".join(cells) + f" | {fell} |")

    print(
        "\n| arm | node | held-out first | last | last - silo (points) | a constant scores "
        "| answers' mode share (all its sets pooled), first / last |"
    )
    print("|---|---|---|---|---|---|---|")
    for variant, runs in arms.items():
        for key, records in sorted(runs.items()):
            first, last = evals(records)[0][1], evals(records)[-1][1]
            control = evals(arms[args.silo][key])[-1][1] if key in arms[args.silo] else None
            delta = "-" if control is None else f"{100 * (last - control):+.1f}"
            graded = [r["eval"] for r in records if r.get("eval")]
            constant = graded[-1].get("constant_answer_accuracy")
            # Records before 2026-12-07 carry the exact-match figure only (no
            # `constant_answer`); benchmarks/constant_answers.py scores theirs.
            scored = "constant_answer" in graded[-1] or any(
                "constant_answer" in per for per in (graded[-1].get("sources") or {}).values()
            )
            exact = "" if scored else " (exact match)"
            shares = [g.get("modal_answer_share") for g in (graded[0], graded[-1])]
            print(
                f"| {variant} | {key[1]} (seed {key[0]}) | {first:.3f} | {last:.3f} | {delta} "
                f"| {'-' if constant is None else f'{constant:.3f}{exact}'} "
                f"| {' / '.join('-' if v is None else f'{v:.2f}' for v in shares)} |"
            )

    print(
        "\n| arm | last held-out - silo, points [95% t] | cumulative own reward | "
        "peers' groups used / round | their age, rounds / version lag (mean) | "
        "dropped on arrival | trainer, peers' completions |"
    )
    print("|---|---|---|---|---|---|---|")
    for variant, runs in arms.items():
        diffs = [
            evals(records)[-1][1] - evals(arms[args.silo][key])[-1][1]
            for key, records in runs.items()
            if key in arms[args.silo]
        ]
        cumulative = statistics.fmean(
            sum(r["mean_local_reward"] or 0.0 for r in records) for records in runs.values()
        )
        used = statistics.fmean(r["external_groups"] for rs in runs.values() for r in rs)
        drops: Counter[str] = Counter()
        treated: Counter[str] = Counter()
        ages: Counter[int] = Counter()
        lags: Counter[int] = Counter()
        for records in runs.values():
            drops.update(records[-1]["drops"])
            for r in records:
                ages.update({int(k): v for k, v in (r.get("age") or {}).items()})
                lags.update({int(k): v for k, v in (r.get("version_lag") or {}).items()})
            for r in records:
                train = r.get("train") or {}
                for key in ("n_peer_ratio_one", "n_peer_plausible", "n_peer_implausible",
                            "n_peer_tis", "n_peer_mismatch", "n_truncated", "n_peer_as_sampled",
                            "n_peer_ids_refused", "n_peer_negative"):  # fmt: skip
                    treated[key.removeprefix("n_")] += train.get(key, 0)
        print(
            f"| {variant} | {interval(diffs) if variant != args.silo else '0'} | "
            f"{cumulative:.2f} | {used:.2f} | {_mean(ages)} / {_mean(lags)} | "
            f"{', '.join(f'{k} {v}' for k, v in drops.most_common()) or '-'} | "
            f"{', '.join(f'{k} {v}' for k, v in treated.items() if v) or '-'} |"
        )
    print_by_source(arms, args.silo)
    print_cost(args.run, list(arms), args.seed)
    if args.plot:
        if len(sources_of(arms)) > 1:
            _plot_by_source(arms, args.plot, decoding(arms, args.samples))
        else:
            _plot(arms, args.plot, decoding(arms, args.samples))


def sources_of(arms: Arms) -> list[str]:
    """The task sources the evaluations scored separately (none for one-source runs)."""
    return sorted(
        {
            source
            for runs in arms.values()
            for records in runs.values()
            for r in records
            if r.get("eval")
            for source in r["eval"].get("sources") or {}
        }
    )


def group_of(node: str) -> str:
    """`insert-1` -> `insert`: the scenario's node group (same task mixture)."""
    head, _, index = node.rpartition("-")
    return head if head and index.isdigit() else node


def print_by_source(arms: Arms, silo: str) -> None:
    """Per node group and held-out source: the base, each arm's last score, and each arm's
    last score minus the silo's, paired by (seed, node), with a 95% t-interval."""
    sources = sources_of(arms)
    if len(sources) < 2:
        return
    others = [v for v in arms if v != silo]
    groups = sorted({group_of(node) for runs in arms.values() for _, node in runs})
    _header(["nodes", "held-out on", "a constant scores", "base"], silo, others, "last",
            "points [95% t] (pairs)")  # fmt: skip
    # Each arm's score and the differences over the (seed, node) keys every arm ran.
    for group in groups:
        members = _members(arms, group)
        for source in sources:
            firsts = [
                evals(rs, source)[0][1]
                for runs in members.values()
                for rs in runs.values()
                if evals(rs, source)
            ]
            # Each pair at the last evaluation every arm has (runs still going compare
            # where they are alike).
            points = {
                v: {k: dict(evals(rs, source)) for k, rs in runs.items()}
                for v, runs in members.items()
            }
            common = {
                k: set.intersection(*(set(points[v].get(k, {})) for v in points))
                for k in set.intersection(*(set(by_key) for by_key in points.values()))
            }
            paired = {k for k, rounds in common.items() if rounds}
            lasts = {v: {k: points[v][k][max(common[k])] for k in paired} for v in points}
            last_evals = [
                [r["eval"] for r in rs if r.get("eval")][-1] for runs in members.values()
                for rs in runs.values()
            ]  # fmt: skip
            constants = [
                c
                for e in last_evals
                if (c := (e.get("sources") or {}).get(source, {}).get("constant_answer_accuracy"))
                is not None
            ]
            cells = [
                f"{100 * statistics.fmean(constants):.1f}" if constants else "-",
                f"{100 * statistics.fmean(firsts):.1f}" if firsts else "-",
            ]
            for v in [silo, *others]:
                values = [lasts[v][key] for key in paired]
                cells.append(f"{100 * statistics.fmean(values):.1f}" if values else "-")
            for v in others:
                diffs = [lasts[v][key] - lasts[silo][key] for key in paired]
                cells.append(f"{interval(diffs)} ({len(diffs)})" if diffs else "-")
            print(f"| {group} | {source} | " + " | ".join(cells) + " |")
    _header(["nodes"], silo, others, "cumulative own reward", "paired (pairs)", ratio=True)
    for group in groups:
        members = _members(arms, group)
        paired = set.intersection(*(set(by_key) for by_key in members.values()))
        rounds = {key: min(len(members[v][key]) for v in members) for key in paired}
        totals = {
            v: {
                key: sum(r["mean_local_reward"] or 0.0 for r in members[v][key][: rounds[key]])
                for key in paired
            }
            for v in members
        }
        cells = [
            f"{statistics.fmean(totals[v][k] for k in paired):.2f}" if paired else "-"
            for v in [silo, *others]
        ]
        for v in others:
            ratios = [totals[v][k] / totals[silo][k] for k in paired if totals[silo][k] > 0]
            cells.append(f"{statistics.fmean(ratios):.2f}x ({len(ratios)})" if ratios else "-")
        print(f"| {group} | " + " | ".join(cells) + " |")


def print_cost(run: Path, variants: list[str], seeds: list[int] | None) -> None:
    """Per arm: wall and CPU time of its runs on this machine (`cost.json`, written by
    `swarm simnet run` since 2026-12-05; runs without one are left out)."""
    rows = []
    for variant in variants:
        costs = [
            json.loads(path.read_text())
            for path in sorted((run / variant).glob("seed-*/cost.json"))
            if seeds is None or int(path.parent.name.removeprefix("seed-")) in seeds
        ]
        if costs:
            wall = statistics.fmean(c["wall_s"] for c in costs) / 60
            cpu = statistics.fmean(c["cpu_s"] + c["children_cpu_s"] for c in costs) / 60
            rows.append(f"| {variant} | {len(costs)} | {wall:.1f} | {cpu:.1f} |")
    if rows:
        print("\n| arm | runs | wall, min per run | CPU, min per run (all threads and workers) |")
        print("|---|---|---|---|")
        print("\n".join(rows))


def _mean(histogram: Counter[int]) -> str:
    total = sum(histogram.values())
    return f"{sum(k * v for k, v in histogram.items()) / total:.2f}" if total else "-"


def _rounds(arms: dict[str, dict[tuple[int, str], list[dict[str, Any]]]]) -> list[tuple[int, int]]:
    rounds = sorted({r for runs in arms.values() for rs in runs.values() for r, _ in evals(rs)})
    return [(r, i) for i, r in enumerate(rounds)]


Arms = dict[str, dict[tuple[int, str], list[dict[str, Any]]]]
"""variant -> (seed, node) -> metrics records."""


def decoding(arms: Arms, given: int | None) -> str:
    """How the held-out answers were decoded, from the records (or `given`)."""
    found = {
        r["eval"].get("samples", given or 0)
        for runs in arms.values()
        for records in runs.values()
        for r in records
        if r.get("eval")
    }
    if given is not None and found - {given}:
        raise SystemExit(f"--samples {given} contradicts the records (samples: {sorted(found)})")
    if len(found) != 1:
        raise SystemExit(f"evaluations decoded differently across runs: samples {sorted(found)}")
    samples = found.pop()
    return "greedy" if samples == 0 else f"sampled pass rate, {samples} per task"


def _plot(
    arms: dict[str, dict[tuple[int, str], list[dict[str, Any]]]], out: Path, how: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, runs in arms.items():
        means = mean_by_round([evals(records) for records in runs.values()])
        line = ax.plot(
            list(means),
            list(means.values()),
            marker="o",
            label=f"{variant} (mean of {len(runs)} nodes)",
        )[0]
        for records in runs.values():
            points = evals(records)
            ax.plot([p[0] for p in points], [p[1] for p in points], color=line.get_color(),
                    alpha=0.25, linewidth=0.8)  # fmt: skip
    ax.set_xlabel("rounds trained")
    ax.set_ylabel(f"held-out score, own set\n({how})")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"\nplot: {out}")


def _members(arms: Arms, group: str) -> Arms:
    """The arms' runs of one node group."""
    return {
        v: {key: rs for key, rs in runs.items() if group_of(key[1]) == group}
        for v, runs in arms.items()
    }


def _header(
    lead: list[str], silo: str, others: list[str], per_arm: str, per_pair: str, ratio: bool = False
) -> None:
    """A markdown table's header: `lead` columns, one per arm, one per arm against the silo."""
    against = "/" if ratio else "-"
    cells = [*lead, *(f"{v}, {per_arm}" for v in [silo, *others])]
    cells += [f"{v} {against} {silo}, {per_pair}" for v in others]
    print("\n| " + " | ".join(cells) + " |")
    print("|" + "---|" * len(cells))


def _plot_by_source(arms: Arms, out: Path, how: str) -> None:
    """One panel per node group (row) and held-out source (column): each arm's mean over
    its nodes and seeds per evaluation, thin lines per node."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = sources_of(arms)
    groups = sorted({group_of(node) for runs in arms.values() for _, node in runs})
    fig, axes = plt.subplots(
        len(groups), len(sources), figsize=(4 * len(sources), 3 * len(groups)),
        sharex=True, squeeze=False,
    )  # fmt: skip
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, group in enumerate(groups):
        for col, source in enumerate(sources):
            ax = axes[row][col]
            for i, (variant, runs) in enumerate(arms.items()):
                members = [rs for (_, node), rs in runs.items() if group_of(node) == group]
                color = colors[i % len(colors)]
                series = [evals(records, source) for records in members]
                for points in series:
                    ax.plot([p[0] for p in points], [p[1] for p in points], color=color,
                            alpha=0.2, linewidth=0.8)  # fmt: skip
                means = mean_by_round(series)
                ax.plot(list(means), list(means.values()), marker="o", color=color,
                        label=f"{variant} ({len(members)})")  # fmt: skip
            constants = [
                c
                for runs in arms.values()
                for (_, node), records in runs.items()
                if group_of(node) == group
                for r in records
                if r.get("eval")
                and (
                    c := (r["eval"].get("sources") or {})
                    .get(source, {})
                    .get("constant_answer_accuracy")
                )
                is not None
            ]
            if constants:
                ax.axhline(statistics.fmean(constants), color="gray", linestyle="--",
                           linewidth=0.8, label="one answer to all")  # fmt: skip
            ax.set_title(f"{group} nodes, held-out {source.removeprefix('rg:')}", fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(groups) - 1:
                ax.set_xlabel("rounds trained")
            if col == 0:
                ax.set_ylabel(f"held-out score\n({how})", fontsize=8)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"\nplot: {out}")


if __name__ == "__main__":
    main()
