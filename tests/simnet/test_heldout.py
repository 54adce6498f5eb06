"""Held-out accuracy per source in simnet reports: curves, paired differences, output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simnet.heldout import load_curves, markdown_lines, paired_rows, source_curve, summary_rows
from simnet.report import load_runs, write_report


def _eval(add: float, copy: float) -> dict:
    return {
        "accuracy": (add + copy) / 2,
        "n": 20,
        "sources": {"copy": {"accuracy": copy, "n": 10}, "add": {"accuracy": add, "n": 10}},
    }


def test_source_curve_keys_by_rounds_trained_and_keeps_a_redone_rounds_last_record() -> None:
    records = [
        {"round": 1, "eval": _eval(0.1, 0.2)},
        {"round": 2, "eval": None},
        {"round": 3, "eval": {"accuracy": 0.5, "n": 4}},  # no per-source scores: skipped
        {"round": 5, "eval": _eval(0.0, 0.0)},
        {"round": 5, "eval": _eval(0.3, 0.6)},  # redone after a crash: this one counts
    ]
    assert source_curve(records) == {0: {"add": 0.1, "copy": 0.2}, 4: {"add": 0.3, "copy": 0.6}}
    assert source_curve([{"round": 1, "eval": None}]) == {}


ACC = {
    # (label, seed, group) -> [(add, copy) at rounds trained 0, 2]; two nodes per group
    # get the same add score and copy +-0.1 around the given one.
    ("silo", 0, "a"): [(0.1, 0.2), (0.5, 0.2)],
    ("silo", 1, "a"): [(0.1, 0.2), (0.4, 0.1)],
    ("silo", 2, "a"): [(0.1, 0.2), (0.6, 0.3)],
    ("swarm", 0, "a"): [(0.1, 0.2), (0.4, 0.5)],
    ("swarm", 1, "a"): [(0.1, 0.2), (0.3, 0.4)],
    ("swarm", 2, "a"): [(0.1, 0.2), (0.5, 0.6)],
}


def _write_runs(root: Path, answer_stats: bool = False) -> None:
    for (label, seed, group), points in ACC.items():
        run = root / label / f"seed-{seed}"
        external = 0 if label == "silo" else 4
        nodes = []
        for i, delta in enumerate((-0.1, 0.1)):
            name = f"{group}-{i}"
            nodes.append(
                {
                    "name": name,
                    "group": group,
                    "model": "builtin:tiny",
                    "local_groups": 8 - external,
                    "external_groups": external,
                }
            )
            (run / name).mkdir(parents=True)
            lines = []
            for r in range(1, 4):  # 3 rounds, evaluated at the start of rounds 0 and 2
                entry = None
                if r in (1, 3):
                    add, copy = points[0 if r == 1 else 1]
                    entry = _eval(add, round(copy + delta, 6))
                    if answer_stats:  # the silo answers one string more often as it trains
                        share = 0.5 + (0.3 if label == "silo" and r == 3 else 0.0) + delta
                        for source in entry["sources"].values():
                            source.update(constant_answer_accuracy=0.4, modal_answer_share=share)
                lines.append({"round": r, "mean_local_reward": 0.5, "eval": entry})
            text = "\n".join(json.dumps(line) for line in lines) + "\n"
            (run / name / "metrics.jsonl").write_text(text)
        summary = {"label": label, "seed": seed, "nodes": nodes, "scenario": "t"}
        (run / "run.json").write_text(json.dumps(summary))


def test_summary_and_paired_differences_against_the_silo(tmp_path: Path) -> None:
    _write_runs(tmp_path)
    curves = load_curves(load_runs(tmp_path))
    rows = {(r["label"], r["source"]): r for r in summary_rows(curves)}
    assert rows[("silo", "add")]["base"] == pytest.approx(0.1)
    assert rows[("silo", "add")]["last"] == pytest.approx(0.5)
    assert rows[("swarm", "copy")]["last"] == pytest.approx(0.5)
    assert rows[("swarm", "copy")]["trained"] == 2 and rows[("swarm", "copy")]["seeds"] == 3
    paired = {r["source"]: r for r in paired_rows(curves)}
    assert set(paired) == {"add", "copy"}  # swarm vs the one silo control, group a
    assert paired["add"]["control"] == "silo" and paired["add"]["label"] == "swarm"
    assert paired["add"]["differences"] == pytest.approx([-0.1, -0.1, -0.1])
    assert paired["copy"]["differences"] == pytest.approx([0.3, 0.3, 0.3])
    assert paired["copy"]["interval"].low == pytest.approx(0.3)  # the same every seed
    text = "\n".join(markdown_lines(curves))
    assert "| swarm | silo | a | copy | +30.0 [+30.0, +30.0] | +30, +30, +30 |" in text
    assert "| silo | a | add | 3 | 10.0 | 50.0 ± 10.0 (2) |" in text


def test_report_adds_the_heldout_plot_and_section_only_with_per_source_evals(
    tmp_path: Path,
) -> None:
    _write_runs(tmp_path / "with")
    paths = write_report(tmp_path / "with")
    assert (tmp_path / "with" / "heldout_per_source.png").stat().st_size > 0
    assert paths[-1].name == "report.md" and "heldout_per_source.png" in {p.name for p in paths}
    assert "Held-out accuracy per task source" in paths[-1].read_text()
    for path in (tmp_path / "with").rglob("metrics.jsonl"):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for line in lines:
            line["eval"] = None
        dest = tmp_path / "without" / path.relative_to(tmp_path / "with")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        run_json = path.parent.parent / "run.json"
        (dest.parent.parent / "run.json").write_text(run_json.read_text())
    assert load_curves(load_runs(tmp_path / "without")) == []
    paths = write_report(tmp_path / "without")
    assert "heldout_per_source.png" not in {p.name for p in paths}
    assert "Held-out" not in paths[-1].read_text()


def test_the_summary_says_what_a_constant_answer_scores_where_nodes_recorded_it(
    tmp_path: Path,
) -> None:
    _write_runs(tmp_path, answer_stats=True)
    curves = load_curves(load_runs(tmp_path))
    rows = {(r["label"], r["source"]): r for r in summary_rows(curves)}
    assert rows[("silo", "add")]["constant"] == pytest.approx(0.4)
    assert rows[("silo", "add")]["modal_share"] == pytest.approx(0.8)  # last evaluation
    assert rows[("swarm", "add")]["modal_share"] == pytest.approx(0.5)
    text = "\n".join(markdown_lines(curves))
    assert "| silo | a | add | 3 | 10.0 | 50.0 ± 10.0 (2) | 40.0 | 80.0 |" in text
    assert "constant answer | mode share |" in text
    # runs without the statistics keep the old table
    _write_runs(tmp_path / "old")
    old = summary_rows(load_curves(load_runs(tmp_path / "old")))
    assert all(r["constant"] is None and r["modal_share"] is None for r in old)
