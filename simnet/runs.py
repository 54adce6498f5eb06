"""Running a scenario's seeds and variants: output directories, aggregates, the summary.

Invariants: `run_scenario` refuses an existing non-empty run dir unless `overwrite`, and
writes `summary.json` only after every run finished. A run restricted to some variants or
seeds adds its runs to the ones an earlier run of the same scenario recorded there (still
on disk), so a grid run variant by variant, seed by seed, ends with one summary of every
configuration; runs and configurations are listed in the scenario's variant order, then
by seed (the first configuration is the one every ratio in the summary is taken to).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from simnet.engine import Simulation
from simnet.scenario import (
    Scenario,
    VariantSpec,
    load_scenario,
)
from simnet.sim_nodes import Progress, ProgressFn
from swarm.errors import ConfigError


def run_dir_for(out_dir: Path, variant: VariantSpec | None, seed: int) -> Path:
    base = Path(out_dir) / variant.name if variant is not None else Path(out_dir)
    return base / f"seed-{seed}"


def _prepare(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise ConfigError(f"{run_dir}: exists and is not empty (use --force to replace it)")
        shutil.rmtree(run_dir)


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration (variant): mean, std, min and max over seeds of the node-mean
    cumulative reward, with the ratio to the first configuration."""
    order: list[str] = []
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["label"] not in by_label:
            order.append(run["label"])
        by_label.setdefault(run["label"], []).append(run)
    rows = []
    baseline: float | None = None
    for label in order:
        group = by_label[label]
        values = [r["cumulative_reward"] for r in group]
        mean = statistics.fmean(values)
        if baseline is None:
            baseline = mean
        finals = [r["final_reward"] for r in group if r["final_reward"] is not None]
        rows.append(
            {
                "label": label,
                "variant": group[0]["variant"],
                "seeds": len(group),
                "cumulative_mean": mean,
                "cumulative_std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "cumulative_min": min(values),
                "cumulative_max": max(values),
                "vs_first": mean / baseline if baseline else None,
                "final_reward": statistics.fmean(finals) if finals else None,
                "external_per_round": statistics.fmean(r["external_per_round"] for r in group),
            }
        )
    return rows


def _with_earlier_runs(
    out: Path, scenario: Scenario, runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`runs` plus the runs `<out>/summary.json` lists for the same scenario (of the same
    length) that this call did not redo and whose directory still holds a `run.json`, in
    the scenario's variant order, then by seed."""
    earlier: list[dict[str, Any]] = []
    try:
        recorded = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        recorded = None
    if (
        isinstance(recorded, dict)
        and recorded.get("scenario") == scenario.name
        and recorded.get("rounds") == scenario.rounds
        and isinstance(recorded.get("runs"), list)
    ):
        redone = {r["dir"] for r in runs}
        earlier = [
            r
            for r in recorded["runs"]
            if isinstance(r, dict)
            and r.get("dir") not in redone
            and (out / str(r.get("dir")) / "run.json").is_file()
        ]
    order = {(v.name if v is not None else None): i for i, v in enumerate(scenario.variant_list())}
    return sorted(
        earlier + runs, key=lambda r: (order.get(r.get("variant"), len(order)), r.get("seed", 0))
    )


def run_scenario(
    scenario: Scenario | str | Path,
    out_dir: str | Path,
    progress: ProgressFn | None = None,
    *,
    seeds: list[int] | None = None,
    variants: list[str] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run every (variant, seed) of a scenario under `out_dir`; return the summary that is
    also written to `<out_dir>/summary.json`.

    Layout: `<out_dir>[/<variant>]/seed-<n>/<node>/metrics.jsonl` and `.../run.json`.
    `seeds` and `variants` (names) restrict what runs.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    out = Path(out_dir)
    chosen_seeds = list(scenario.seeds if seeds is None else seeds)
    chosen = scenario.variant_list()
    if variants is not None:
        known = {v.name for v in scenario.variants}
        unknown = sorted(set(variants) - known)
        if unknown:
            raise ConfigError(f"unknown variant(s) {unknown}; the scenario has {sorted(known)}")
        chosen = [v for v in chosen if v is not None and v.name in variants]
    if any(g.model != "stub" for g in scenario.nodes):
        import torch  # only real models need it

        torch.set_num_threads(scenario.torch_threads)
    plan = [(v, s) for v in chosen for s in chosen_seeds]
    for variant, seed in plan:
        _prepare(run_dir_for(out, variant, seed), overwrite)
    runs = []
    for number, (variant, seed) in enumerate(plan):
        run_dir = run_dir_for(out, variant, seed)
        label = str(run_dir.relative_to(out))

        def report(done: int, total: int, now: float, label: str = label, i: int = number) -> None:
            if progress is not None:
                progress(Progress(label, i, len(plan), done, total, now))

        started = time.perf_counter()
        summary = Simulation(scenario, variant, seed, run_dir, progress=report).run()
        wall = time.perf_counter() - started
        runs.append(
            {
                "dir": label,
                "variant": summary["variant"],
                "label": summary["label"],
                "seed": seed,
                "cumulative_reward": summary["cumulative_reward"],
                "final_reward": summary["final_reward"],
                "external_per_round": summary["external_per_round"],
                "wall_s": round(wall, 3),
            }
        )
        if progress is not None:
            total = len(summary["nodes"]) * scenario.rounds
            progress(
                Progress(
                    label, number, len(plan), total, total, summary["virtual_s"], True, summary
                )
            )
    runs = _with_earlier_runs(out, scenario, runs)
    result = {
        "scenario": scenario.name,
        "description": scenario.description,
        "rounds": scenario.rounds,
        "runs": runs,
        "configurations": aggregate(runs),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    return result
