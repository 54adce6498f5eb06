"""Held-out accuracy per task source in simnet reports (heterogeneous swarms).

Nodes with `eval.sources` score one held-out set per source at the start of every
`eval.every`-th round (`node.evaluation`); this module reads those scores back from each
node's metrics and summarises them per configuration, node group and source: the base
(before any training), the last evaluation, and for every non-silo configuration the
difference to each silo control (J = 0) run with the same seed.

Invariants:
- Read-only over the runs. An evaluation recorded in round r was made after r - 1 rounds
  of training (`trained` below); a round redone after a crash counts once (its last
  record). Runs without per-source evaluations yield no rows, and the report then has
  no held-out section.
- Per run, a group's accuracy on a source is the mean over the group's nodes (each node
  has its own held-out set of `eval.num_tasks` references). The "last" evaluation is the
  largest `trained` every node of the run reached.
- Paired differences are per seed, group and source: configuration minus control, then
  their mean with a 95% t-interval (`simnet.stats.paired_difference_interval`); ratios
  are left out because a silo's accuracy on a task it never saw can be 0.
- Where the nodes recorded their answers' statistics (`node.evaluation.answer_stats`),
  the summary adds, per configuration, group and source, what a constant answer scores on
  the held-out sets (`constant_answer_accuracy`) and the share of the policy's answers
  that are its most common one at the last evaluation: an accuracy at the first figure
  with a share near 1 is a guess learned, not the task.
- matplotlib is imported only in `plot_heldout`, with the Agg backend.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.metrics import read_metrics
from simnet.stats import DifferenceInterval, paired_difference_interval

if TYPE_CHECKING:
    from simnet.report import RunData

HELDOUT_FILE = "heldout_per_source.png"

Curve = dict[int, dict[str, float]]
"""Rounds trained before an evaluation -> source -> accuracy."""

CONSTANT = "constant_answer_accuracy"
MODAL_SHARE = "modal_answer_share"


def _source_entries(records: Iterable[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """Rounds trained -> source -> that evaluation's per-source entry (records without a
    per-source evaluation skipped; a redone round: its last record)."""
    by_round: dict[int, dict[str, Any]] = {}
    for record in records:
        by_round[int(record["round"])] = record
    entries: dict[int, dict[str, dict[str, Any]]] = {}
    for round_number in sorted(by_round):
        evaluation = by_round[round_number].get("eval") or {}
        sources = evaluation.get("sources")
        if isinstance(sources, dict) and sources:
            entries[round_number - 1] = dict(sorted(sources.items()))
    return entries


def source_curve(records: Iterable[dict[str, Any]], key: str = "accuracy") -> Curve:
    """Per-source held-out accuracy (or another per-source figure, `key`) by rounds
    trained, from one node's metrics records (records without a per-source evaluation
    are skipped, and sources without `key`)."""
    return {
        trained: {name: float(e[key]) for name, e in sources.items() if key in e}
        for trained, sources in _source_entries(records).items()
    }


@dataclass
class RunCurves:
    """Per-source held-out curves of one run's nodes, by node group."""

    label: str
    seed: int
    silo: bool
    groups: dict[str, list[Curve]] = field(default_factory=dict)
    answer_curves: dict[str, dict[str, list[Curve]]] = field(default_factory=dict)
    """`CONSTANT` and `MODAL_SHARE` -> group -> the nodes' curves of that figure."""

    def last_trained(self) -> int | None:
        """The largest rounds-trained every node of the run was evaluated at."""
        ends = [max(c) for curves in self.groups.values() for c in curves if c]
        if not ends or any(not c for curves in self.groups.values() for c in curves):
            return None
        return min(ends)

    def group_accuracy(
        self, group: str, source: str, trained: int, figure: str = "accuracy"
    ) -> float | None:
        """Mean over the group's nodes of their accuracy (or `figure`: `CONSTANT`,
        `MODAL_SHARE`) on `source` after `trained` rounds; None where none recorded it."""
        curves = (
            self.groups[group]
            if figure == "accuracy"
            else self.answer_curves.get(figure, {}).get(group, [])
        )
        values = [c[trained][source] for c in curves if source in c.get(trained, {})]
        return statistics.fmean(values) if values else None


def load_curves(runs: list[RunData]) -> list[RunCurves]:
    """Per-source curves of every run (empty when no node evaluated per source)."""
    found = []
    for run in runs:
        curves = RunCurves(run.label, run.seed, all(n.external_groups == 0 for n in run.nodes))
        for node in run.nodes:
            records = list(read_metrics(run.directory / node.name / "metrics.jsonl"))
            curves.groups.setdefault(node.group, []).append(source_curve(records))
            for figure in (CONSTANT, MODAL_SHARE):
                by_group = curves.answer_curves.setdefault(figure, {})
                by_group.setdefault(node.group, []).append(source_curve(records, figure))
        found.append(curves)
    if not any(c for rc in found for curves in rc.groups.values() for c in curves):
        return []
    return found


def _labels(curves: list[RunCurves]) -> list[str]:
    labels: list[str] = []
    for rc in curves:
        if rc.label not in labels:
            labels.append(rc.label)
    return labels


def _sources(curves: list[RunCurves]) -> list[str]:
    names = {
        s for rc in curves for cs in rc.groups.values() for c in cs for p in c.values() for s in p
    }
    return sorted(names)


def summary_rows(curves: list[RunCurves]) -> list[dict[str, Any]]:
    """Per configuration, group and source: base and last accuracy, mean ± std over seeds."""
    rows = []
    for label in _labels(curves):
        runs = [rc for rc in curves if rc.label == label]
        for group in runs[0].groups:
            for source in _sources(curves):
                base = [rc.group_accuracy(group, source, 0) for rc in runs]
                last = [
                    rc.group_accuracy(group, source, t)
                    for rc in runs
                    if (t := rc.last_trained()) is not None
                ]
                base_v = [b for b in base if b is not None]
                last_v = [v for v in last if v is not None]
                if not last_v:
                    continue
                answers = {
                    figure: [
                        v
                        for rc in runs
                        if (t := rc.last_trained()) is not None
                        and (v := rc.group_accuracy(group, source, t, figure)) is not None
                    ]
                    for figure in (CONSTANT, MODAL_SHARE)
                }
                rows.append(
                    {
                        "label": label,
                        "group": group,
                        "source": source,
                        "seeds": len(last_v),
                        "trained": min(t for rc in runs if (t := rc.last_trained()) is not None),
                        "base": statistics.fmean(base_v) if base_v else None,
                        "last": statistics.fmean(last_v),
                        "last_std": statistics.stdev(last_v) if len(last_v) > 1 else 0.0,
                        "constant": statistics.fmean(answers[CONSTANT])
                        if answers[CONSTANT]
                        else None,
                        "modal_share": statistics.fmean(answers[MODAL_SHARE])
                        if answers[MODAL_SHARE]
                        else None,
                    }
                )
    return rows


def paired_rows(curves: list[RunCurves]) -> list[dict[str, Any]]:
    """Per non-silo configuration, silo control, group and source: the paired difference
    of last held-out accuracy (configuration minus control, same seed)."""
    labels = _labels(curves)
    controls = [lab for lab in labels if all(rc.silo for rc in curves if rc.label == lab)]
    rows = []
    for label in labels:
        if label in controls:
            continue
        for control in controls:
            mine = {rc.seed: rc for rc in curves if rc.label == label}
            theirs = {rc.seed: rc for rc in curves if rc.label == control}
            seeds = sorted(set(mine) & set(theirs))
            for group in mine[seeds[0]].groups if seeds else []:
                for source in _sources(curves):
                    diffs = []
                    for seed in seeds:
                        t = _common_last(mine[seed], theirs[seed])
                        a = None if t is None else mine[seed].group_accuracy(group, source, t)
                        b = None if t is None else theirs[seed].group_accuracy(group, source, t)
                        if a is not None and b is not None:
                            diffs.append(a - b)
                    if diffs:
                        rows.append(
                            {
                                "label": label,
                                "control": control,
                                "group": group,
                                "source": source,
                                "differences": diffs,
                                "interval": paired_difference_interval(diffs),
                            }
                        )
    return rows


def _common_last(a: RunCurves, b: RunCurves) -> int | None:
    ta, tb = a.last_trained(), b.last_trained()
    if ta is None or tb is None:
        return None
    return min(ta, tb)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def markdown_lines(curves: list[RunCurves]) -> list[str]:
    """The held-out section of `report.md` (no lines without per-source evaluations)."""
    if not curves:
        return []
    rows = summary_rows(curves)
    answers = any(row["constant"] is not None for row in rows)
    lines = [
        "",
        "Held-out accuracy per task source (% correct: greedy answers, or all sampled "
        "completions with `eval.samples`; per run the mean over a group's nodes, each with "
        "its own held-out set; then mean ± std over seeds). Base: before any training; "
        "last: the last evaluation every node reached."
        + (
            " Constant answer: what answering each set's most common gold answer to every "
            "task scores (exact match); mode share: the share of the policy's answers that "
            "are its most common one, at the last evaluation (an accuracy near the first "
            "with a share near 100 is a guess learned, not the task)."
            if answers
            else ""
        ),
        "",
        "| configuration | group | source | seeds | base | last (rounds trained) |"
        + (" constant answer | mode share |" if answers else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if answers else ""),
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['group']} | {row['source']} | {row['seeds']} "
            f"| {_pct(row['base'])} | {_pct(row['last'])} ± {100 * row['last_std']:.1f} "
            f"({row['trained']}) |"
            + (f" {_pct(row['constant'])} | {_pct(row['modal_share'])} |" if answers else "")
        )
    paired = paired_rows(curves)
    if paired:
        lines += [
            "",
            "Paired by seed: last held-out accuracy minus the silo control's, in percentage "
            "points, mean [95% t-interval] over seeds.",
            "",
            "| configuration | control | group | source | difference (points) | per seed |",
            "|---|---|---|---|---|---|",
        ]
        for row in paired:
            interval: DifferenceInterval = row["interval"]
            per_seed = ", ".join(f"{100 * d:+.0f}" for d in row["differences"])
            lines.append(
                f"| {row['label']} | {row['control']} | {row['group']} | {row['source']} "
                f"| {interval.text(100)} | {per_seed} |"
            )
    return lines


def plot_heldout(curves: list[RunCurves], path: Path) -> bool:
    """Held-out accuracy per source over rounds: one panel per node group, one line per
    (configuration, source), mean over seeds. False (nothing written) without data."""
    if not curves:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(curves[0].groups)
    labels, sources = _labels(curves), _sources(curves)
    fig, axes = plt.subplots(
        1, len(groups), figsize=(3.6 * len(groups), 3.4), squeeze=False, sharey=True
    )
    styles = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, group in zip(axes[0], groups, strict=True):
        for li, label in enumerate(labels):
            runs = [rc for rc in curves if rc.label == label]
            points = sorted({t for rc in runs for c in rc.groups.get(group, []) for t in c})
            for si, source in enumerate(sources):
                xs, ys = [], []
                for t in points:
                    values = [rc.group_accuracy(group, source, t) for rc in runs]
                    values = [v for v in values if v is not None]
                    if values:
                        xs.append(t)
                        ys.append(100 * statistics.fmean(values))
                ax.plot(
                    xs,
                    ys,
                    ls=styles[li % len(styles)],
                    color=colors[si % len(colors)],
                    marker="o",
                    ms=3,
                    label=f"{label}: {source}",
                )
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("rounds trained")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy (%)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(
        "Held-out accuracy per source (mean over seeds and the group's nodes)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
