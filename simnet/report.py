"""Reports over simnet output: PNG plots and a markdown table.

`write_report(directory)` finds every run (`run.json`) under `directory`, reads each
node's `metrics.jsonl`, and writes `reward_per_round.png` (reward per round per node, one
panel per configuration), `cumulative_reward.png` (cumulative reward per configuration,
mean over seeds with the min-max spread, and per-seed points) and `report.md` (the table).

Invariants:
- Read-only over the runs; writes only the three report files (and `paired_ratios.png`
  when there are silo controls, `heldout_per_source.png` and a held-out section of the
  table when nodes evaluated per task source: `simnet.heldout`).
- A node's reward in round r is its `mean_local_reward` (its own samples); a round redone
  after a crash counts once (its last record). Cumulative reward of a run is the sum over
  rounds, averaged over the run's nodes; a configuration's is the mean over its seeds.
- Configurations appear in the order of `<directory>/summary.json` when present (the
  scenario's order), else in order of first appearance by path.
- matplotlib is imported only here, with the non-interactive Agg backend.
- Controls: every configuration whose nodes all train on no external group (J = 0) is a
  silo control; each configuration is compared with each control seed by seed (paired
  ratios of cumulative reward) and summarised by the geometric mean with a 95%
  t-interval (`simnet.stats.paired_ratio_interval`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.metrics import read_metrics
from simnet import heldout
from simnet.stats import paired_ratio_interval, paired_ratios
from swarm.errors import ConfigError

REPORT_FILES = ("reward_per_round.png", "cumulative_reward.png", "report.md")
PAIRED_FILE = "paired_ratios.png"
"""Written too when the runs include silo controls (J = 0)."""


@dataclass
class NodeRun:
    name: str
    group: str
    model: str
    local_groups: int
    external_groups: int
    rewards: list[float | None]
    """Reward per round 1..n (None where a round has no local samples)."""
    external: list[int]
    trained: list[int | None]
    """Informative (non-zero-variance) groups trained per round, local + external."""
    sampled: float = 0.0
    """Own groups sampled per round, mean (S: more than `local_groups` when the node
    samples dynamically)."""


@dataclass
class RunData:
    directory: Path
    label: str
    seed: int
    summary: dict[str, Any]
    nodes: list[NodeRun] = field(default_factory=list)

    def mean_curve(self) -> list[float]:
        """Node-mean reward per round (missing values count 0)."""
        length = max((len(n.rewards) for n in self.nodes), default=0)
        curve = []
        for r in range(length):
            values = [(n.rewards[r] or 0.0) for n in self.nodes if r < len(n.rewards)]
            curve.append(statistics.fmean(values) if values else 0.0)
        return curve


def _trained(record: dict[str, Any]) -> int | None:
    stats = record.get("train") or {}
    for key in ("n_groups", "informative_groups"):  # real trainer, stub learner
        if isinstance(stats.get(key), int):
            return int(stats[key])
    return None


def _per_round(
    records: list[dict[str, Any]],
) -> tuple[list[float | None], list[int], list[int | None], float]:
    by_round: dict[int, dict[str, Any]] = {}
    for record in records:
        by_round[int(record["round"])] = record  # a redone round: the last record wins
    rounds = [by_round[r] for r in sorted(by_round)]
    rewards = [r.get("mean_local_reward") for r in rounds]
    external = [int(r.get("external_groups", 0)) for r in rounds]
    sampled = [int(r.get("local_groups", 0)) for r in rounds]
    mean_sampled = statistics.fmean(sampled) if sampled else 0.0
    return rewards, external, [_trained(r) for r in rounds], mean_sampled


def load_runs(directory: Path) -> list[RunData]:
    """Every run under `directory`, in report order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: no such directory")
    runs = []
    for path in sorted(directory.rglob("run.json")):
        summary = json.loads(path.read_text())
        run = RunData(path.parent, str(summary["label"]), int(summary["seed"]), summary)
        for node in summary["nodes"]:
            rewards, external, trained, sampled = _per_round(
                read_metrics(path.parent / node["name"] / "metrics.jsonl")
            )
            run.nodes.append(
                NodeRun(
                    node["name"],
                    node["group"],
                    node["model"],
                    int(node["local_groups"]),
                    int(node["external_groups"]),
                    rewards,
                    external,
                    trained,
                    sampled,
                )
            )
        runs.append(run)
    if not runs:
        raise ConfigError(f"{directory}: no simnet runs found (no run.json below it)")
    order = _label_order(directory, runs)
    runs.sort(key=lambda r: (order.index(r.label), r.seed))
    return runs


def _label_order(directory: Path, runs: list[RunData]) -> list[str]:
    order: list[str] = []
    summary = directory / "summary.json"
    if summary.exists():
        data = json.loads(summary.read_text())
        order = [row["label"] for row in data.get("configurations", [])]
    for run in runs:
        if run.label not in order:
            order.append(run.label)
    return order


def labels_of(runs: list[RunData]) -> list[str]:
    labels: list[str] = []
    for run in runs:
        if run.label not in labels:
            labels.append(run.label)
    return labels


def _cumulative(curve: list[float]) -> list[float]:
    total, out = 0.0, []
    for value in curve:
        total += value
        out.append(total)
    return out


def _smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out, acc = [], 0.0
    for i, value in enumerate(values):
        acc += value
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def table_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """One row per configuration: cumulative reward over seeds and companions."""
    rows = []
    baseline: float | None = None
    first_by_seed: dict[int, float] = {}
    for label in labels_of(runs):
        group = [r for r in runs if r.label == label]
        totals = [sum(r.mean_curve()) for r in group]
        if not first_by_seed:
            first_by_seed = {r.seed: t for r, t in zip(group, totals, strict=True)}
        paired = [
            t / first_by_seed[r.seed]
            for r, t in zip(group, totals, strict=True)
            if first_by_seed.get(r.seed)
        ]
        mean = statistics.fmean(totals)
        baseline = mean if baseline is None else baseline
        nodes = group[0].nodes
        mixes = sorted({_mix(n) for n in nodes})
        models = sorted({n.model for n in nodes})
        finals = [r.summary.get("final_reward") for r in group]
        finals = [f for f in finals if f is not None]
        external = [
            statistics.fmean(e for n in r.nodes for e in n.external)
            for r in group
            if any(n.external for n in r.nodes)
        ]
        trained = [t for r in group for n in r.nodes for t in n.trained if t is not None]
        rows.append(
            {
                "label": label,
                "mix": ", ".join(mixes),
                "models": ", ".join(models),
                "nodes": len(nodes),
                "seeds": len(group),
                "rounds": max((len(n.rewards) for r in group for n in r.nodes), default=0),
                "mean": mean,
                "std": statistics.stdev(totals) if len(totals) > 1 else 0.0,
                "min": min(totals),
                "max": max(totals),
                "ratio": mean / baseline if baseline else float("nan"),
                "paired": paired,
                "final": statistics.fmean(finals) if finals else None,
                "external": statistics.fmean(external) if external else 0.0,
                "trained": statistics.fmean(trained) if trained else None,
            }
        )
    return rows


def _mix(node: NodeRun) -> str:
    """`I/J`, with the groups sampled per round when the node samples more than I."""
    mix = f"{node.local_groups}/{node.external_groups}"
    if node.sampled > node.local_groups + 1e-9:
        mix += f" (S={node.sampled:g})"
    return mix


def is_silo(runs: list[RunData]) -> bool:
    """True when no node of these runs takes external groups (J = 0)."""
    return all(n.external_groups == 0 for r in runs for n in r.nodes)


def control_rows(runs: list[RunData]) -> tuple[list[str], list[dict[str, Any]]]:
    """The silo controls (configurations with J = 0), and per configuration its paired
    ratio to each control: geometric mean over common seeds with a 95% t-interval."""
    labels = labels_of(runs)
    totals = {
        label: {r.seed: sum(r.mean_curve()) for r in runs if r.label == label} for label in labels
    }
    controls = [label for label in labels if is_silo([r for r in runs if r.label == label])]
    rows = []
    for label in labels:
        row: dict[str, Any] = {"label": label, "vs": {}}
        for control in controls:
            ratios = paired_ratios(totals[label], totals[control])
            try:
                row["vs"][control] = paired_ratio_interval(ratios) if ratios else None
            except ValueError:  # a zero cumulative reward: no log ratio
                row["vs"][control] = None
        rows.append(row)
    return controls, rows


def group_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """Per configuration and node group (heterogeneous swarms): mean cumulative reward."""
    rows = []
    for label in labels_of(runs):
        group_runs = [r for r in runs if r.label == label]
        names = []
        for node in group_runs[0].nodes:
            if node.group not in names:
                names.append(node.group)
        if len(names) < 2:
            continue
        for name in names:
            totals = [
                statistics.fmean(
                    sum(v or 0.0 for v in n.rewards) for n in r.nodes if n.group == name
                )
                for r in group_runs
            ]
            model = next(n.model for n in group_runs[0].nodes if n.group == name)
            rows.append(
                {
                    "label": label,
                    "group": name,
                    "model": model,
                    "mean": statistics.fmean(totals),
                    "std": statistics.stdev(totals) if len(totals) > 1 else 0.0,
                }
            )
    return rows


def markdown(runs: list[RunData], title: str) -> str:
    rows = table_rows(runs)
    first = rows[0]["label"]
    lines = [
        f"# {title}",
        "",
        "Cumulative reward: per run, the sum over rounds of each node's mean reward on its "
        "own samples, averaged over the run's nodes; then mean ± std (and min-max) over "
        f"seeds. `vs {first}` divides by the first configuration's mean; `paired` is the "
        f"ratio to {first} run with the same seed (same base model and task streams), mean "
        "and min-max over seeds. Final reward: mean "
        "over the last 10% of rounds. Informative groups: groups with reward variance "
        "(the only ones with a GRPO signal) trained per round, local and external.",
        "",
        f"| configuration | I/J | model | nodes | seeds | rounds | cumulative reward "
        f"| min-max | vs {first} | paired | final reward | external groups/round "
        "| informative groups trained/round |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        final = "-" if row["final"] is None else f"{row['final']:.3f}"
        trained = "-" if row["trained"] is None else f"{row['trained']:.2f}"
        paired = (
            f"{statistics.fmean(row['paired']):.2f}x ({min(row['paired']):.2f}-"
            f"{max(row['paired']):.2f})"
            if row["paired"]
            else "-"
        )
        lines.append(
            f"| {row['label']} | {row['mix']} | {row['models']} | {row['nodes']} "
            f"| {row['seeds']} | {row['rounds']} | {row['mean']:.2f} ± {row['std']:.2f} "
            f"| {row['min']:.2f}-{row['max']:.2f} | {row['ratio']:.2f}x | {paired} | {final} "
            f"| {row['external']:.2f} | {trained} |"
        )
    controls, compared = control_rows(runs)
    if controls:
        lines += [
            "",
            "Paired ratios to each silo control (J = 0): per seed, cumulative reward over the "
            "control's with the same seed; geometric mean over seeds [95% t-interval on the "
            "log ratios].",
            "",
            "| configuration | " + " | ".join(f"vs {c}" for c in controls) + " |",
            "|---|" + "---|" * len(controls),
        ]
        for row in compared:
            cells = ["-" if row["vs"][c] is None else row["vs"][c].text() for c in controls]
            lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    groups = group_rows(runs)
    if groups:
        lines += [
            "",
            "Per node group:",
            "",
            "| configuration | group | model | cumulative reward |",
            "|---|---|---|---|",
        ]
        for row in groups:
            lines.append(
                f"| {row['label']} | {row['group']} | {row['model']} "
                f"| {row['mean']:.2f} ± {row['std']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot_rewards(runs: list[RunData], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels_of(runs)
    cols = min(len(labels), 4)
    rows = (len(labels) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(max(4.2 * cols, 6.0), 3.4 * rows), squeeze=False, sharey=True
    )
    for ax, label in zip(axes.flat, labels, strict=False):
        group = [r for r in runs if r.label == label]
        length = max(len(n.rewards) for r in group for n in r.nodes)
        window = max(1, length // 20)
        for run in group:
            for node in run.nodes:
                values = [v or 0.0 for v in node.rewards]
                ax.plot(range(1, len(values) + 1), _smooth(values, window), lw=0.6, alpha=0.3)
        curves = [r.mean_curve() for r in group]
        mean = [statistics.fmean(c[i] for c in curves if i < len(c)) for i in range(length)]
        ax.plot(range(1, length + 1), _smooth(mean, window), color="black", lw=2, label="mean")
        ax.set_title(f"{label} ({len(group)} seeds)")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(labels) :]:
        ax.set_visible(False)
    axes[0][0].set_ylabel("reward per round (own samples)")
    axes[0][0].legend(loc="upper left")
    fig.suptitle(
        "Reward per round per node (thin: each node and seed; moving average)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cumulative(runs: list[RunData], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels_of(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, label in enumerate(labels):
        group = [r for r in runs if r.label == label]
        curves = [_cumulative(r.mean_curve()) for r in group]
        length = min(len(c) for c in curves)
        xs = range(1, length + 1)
        mean = [statistics.fmean(c[j] for c in curves) for j in range(length)]
        low = [min(c[j] for c in curves) for j in range(length)]
        high = [max(c[j] for c in curves) for j in range(length)]
        (line,) = left.plot(xs, mean, label=label)
        left.fill_between(xs, low, high, color=line.get_color(), alpha=0.2)
        totals = [c[-1] for c in curves]
        right.bar(i, statistics.fmean(totals), color=line.get_color(), alpha=0.6)
        right.scatter([i] * len(totals), totals, color="black", s=12, zorder=3)
    left.set_xlabel("round")
    left.set_ylabel("cumulative reward (node mean)")
    left.set_title("Cumulative reward: mean over seeds, min-max band")
    left.legend()
    left.grid(alpha=0.3)
    right.set_xticks(range(len(labels)), labels)
    right.set_ylabel("cumulative reward at the end")
    right.set_title("Per configuration (dots: seeds)")
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_paired(runs: list[RunData], path: Path) -> bool:
    """Paired ratios to each silo control: per-seed ratios (dots), geometric mean and 95%
    t-interval (bar), one panel per control. False (nothing written) without controls."""
    controls, rows = control_rows(runs)
    if not controls:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = {
        label: {r.seed: sum(r.mean_curve()) for r in runs if r.label == label}
        for label in labels_of(runs)
    }
    fig, axes = plt.subplots(
        1, len(controls), figsize=(4.6 * len(controls), 0.45 * len(rows) + 1.6), squeeze=False
    )
    for ax, control in zip(axes[0], controls, strict=True):
        for y, row in enumerate(rows):
            ratios = paired_ratios(totals[row["label"]], totals[control])
            ax.scatter(ratios, [y] * len(ratios), color="gray", s=10, zorder=2)
            interval = row["vs"][control]
            if interval is not None:
                low = interval.low if interval.low is not None else interval.mean
                high = interval.high if interval.high is not None else interval.mean
                ax.plot([low, high], [y, y], color="black", lw=2, zorder=3)
                ax.scatter([interval.mean], [y], color="tab:red", s=24, zorder=4)
        ax.axvline(1.0, color="tab:blue", lw=1, ls="--")
        ax.set_yticks(range(len(rows)), [row["label"] for row in rows])
        ax.invert_yaxis()
        ax.set_xlabel(f"cumulative reward / {control} (same seed)")
        ax.set_title(f"vs {control}", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle("Paired ratios: seeds (gray), geometric mean (red), 95% interval", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(directory: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the plots and table for the runs under `directory` into `out` (default:
    `directory`); return the paths written."""
    directory = Path(directory)
    runs = load_runs(directory)
    target = Path(out) if out is not None else directory
    target.mkdir(parents=True, exist_ok=True)
    title = str(runs[0].summary.get("scenario", directory.name))
    paths = [target / name for name in REPORT_FILES]
    plot_rewards(runs, paths[0])
    plot_cumulative(runs, paths[1])
    paths[2].write_text(markdown(runs, f"simnet report: {title}"))
    paired = target / PAIRED_FILE
    if plot_paired(runs, paired):
        paths.insert(2, paired)  # the table stays last (the CLI prints it)
    curves = heldout.load_curves(runs)
    if heldout.plot_heldout(curves, target / heldout.HELDOUT_FILE):
        paths.insert(-1, target / heldout.HELDOUT_FILE)
        with paths[-1].open("a") as table:
            table.write("\n".join(heldout.markdown_lines(curves)) + "\n")
    return paths
