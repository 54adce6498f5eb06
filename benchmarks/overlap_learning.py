"""Learning with and without `sampler.overlap`: the reward curves of a simnet run of
`examples/scenarios/overlap_learning.toml`, per round and per modeled second, as one plot,
plus the paired cumulative-reward ratio (overlap / plain) per configuration.

    swarm simnet run examples/scenarios/overlap_learning.toml -o runs/overlap
    .venv/bin/python benchmarks/overlap_learning.py runs/overlap -o docs/overlap_learning.png

Each curve is the mean over nodes and seeds of the nodes' reward on their own samples,
smoothed over 10 rounds; the per-time panel places round k of a node at its record's
modeled time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.metrics import read_metrics
from simnet.stats import paired_ratio_interval

PAIRS = {"i8-j0": "i8-j0-overlap", "i4-j4-signal": "i4-j4-signal-overlap"}
SMOOTH = 10


def runs_of(root: Path) -> dict[str, dict[int, Path]]:
    """variant -> seed -> run directory (any depth under `root`)."""
    runs: dict[str, dict[int, Path]] = defaultdict(dict)
    for path in root.rglob("run.json"):
        summary = json.loads(path.read_text())
        runs[summary["variant"]][summary["seed"]] = path.parent
    return runs


def curve(run_dirs: list[Path]) -> tuple[list[float], list[float]]:
    """(mean modeled time, mean reward) per round over every node of every run."""
    rewards: dict[int, list[float]] = defaultdict(list)
    times: dict[int, list[float]] = defaultdict(list)
    for run_dir in run_dirs:
        for metrics in run_dir.glob("*/metrics.jsonl"):
            for record in read_metrics(metrics):
                if record["mean_local_reward"] is not None:
                    rewards[record["round"]].append(record["mean_local_reward"])
                    times[record["round"]].append(record["time"])
    rounds = sorted(rewards)
    means = [statistics.fmean(rewards[k]) for k in rounds]
    smooth = [statistics.fmean(means[max(0, i - SMOOTH + 1) : i + 1]) for i in range(len(means))]
    return [statistics.fmean(times[k]) for k in rounds], smooth


def cumulative(run_dir: Path) -> float:
    return float(json.loads((run_dir / "run.json").read_text())["cumulative_reward"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("-o", "--out", type=Path, default=Path("overlap_learning.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = runs_of(args.runs)
    fig, (by_round, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for (plain, overlapped), color in zip(PAIRS.items(), ("tab:gray", "tab:blue"), strict=True):
        if plain not in runs or overlapped not in runs:
            continue
        seeds = sorted(set(runs[plain]) & set(runs[overlapped]))
        ratio = paired_ratio_interval(
            [cumulative(runs[overlapped][s]) / cumulative(runs[plain][s]) for s in seeds]
        )
        interval = "" if ratio.low is None else f" [{ratio.low:.2f}, {ratio.high:.2f}]"
        print(
            f"{overlapped} / {plain}: cumulative reward {ratio.mean:.3f}x{interval} "
            f"({len(seeds)} seeds paired); "
            + ", ".join(
                f"seed {s}: {cumulative(runs[overlapped][s]):.2f} vs "
                f"{cumulative(runs[plain][s]):.2f}"
                for s in seeds
            )
        )
        for variant, style in ((plain, "--"), (overlapped, "-")):
            times, rewards = curve([runs[variant][s] for s in seeds])
            label = f"{variant} ({len(seeds)} seeds)"
            by_round.plot(range(1, len(rewards) + 1), rewards, style, color=color, label=label)
            by_time.plot(times, rewards, style, color=color, label=label)
    by_round.set_xlabel("round")
    by_time.set_xlabel("modeled seconds")
    by_round.set_ylabel("reward on own samples")
    for ax in (by_round, by_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        "sampler.overlap (solid) vs the plain alternation (dashed): mean over nodes and "
        f"seeds, {SMOOTH}-round moving mean"
    )
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
