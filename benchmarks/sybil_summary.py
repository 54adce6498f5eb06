"""The Sybil grid (issue 35, `examples/scenarios/sybil/`): each attacker row against the
honest swarm and the plain silo, paired by seed, and the slots the attacker took.

    .venv/bin/python benchmarks/sybil_summary.py runs/sybil [--plot docs/sybil.png]

Reads `<root>/<scenario>/<variant>/seed-<s>/run.json` and the nodes' `metrics.jsonl`, as
`swarm simnet run examples/scenarios/sybil/<scenario>.toml -o <root>/<scenario>` writes
them. Every scenario keeps the long grid's name (its swarm id, link model and node
seeds), so seed s of any row pairs with seed s of `honest/open` (the honest swarm without
the bounds: the reference) and `honest/i8-j0` (the plain silo).

Per row: cumulative reward (the mean over the honest nodes of their summed per-round
mean reward), its geometric-mean ratio to the honest swarm and to the silo over the
seeds both have, with a 95% t-interval on the logs (`simnet.stats`), and the attacker's
share of the honest nodes' external slots over the whole run and after it joined.

`late_joiner` runs (an honest 9th node joining at about round 50) get a table of their
own: the share of the 8 other nodes' external slots that went to the newcomer, per 10
of its rounds, next to an average established sender's share.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from simnet.stats import paired_ratio_interval, paired_ratios

LATE_JOINER = "late_joiner"
REFERENCE = ("honest", "open")
SILO = ("honest", "i8-j0")
OPEN = {
    "defended": "open",
    "defended-ramp64": "open",
    "defended-earned": "open",
    "i4-j4-signal-wild-cohorts": "i4-j4-signal-wild",
    "i4-j4-signal-wild-earned": "i4-j4-signal-wild",
    "defended-half": "open",
    "i4-j4-signal-wild-half": "i4-j4-signal-wild",
    "defended-net": "open",
    "i4-j4-signal-wild-net": "i4-j4-signal-wild",
}
"""A defended variant -> the same scenario's variant without cohorts."""
REFINES = {
    "defended-earned": "defended",
    "i4-j4-signal-wild-earned": "i4-j4-signal-wild-cohorts",
    "defended-half": "defended-earned",
    "i4-j4-signal-wild-half": "i4-j4-signal-wild-earned",
    "defended-net": "defended-half",
    "i4-j4-signal-wild-net": "i4-j4-signal-wild-half",
}
"""A variant -> the same scenario's variant it refines: `earned` the cohorts weighing one
sender, `half` (`cohort_older_share = 0.5`) the `earned` ones, `net` (`networks_first`)
the `half` ones."""


def runs(root: Path) -> dict[tuple[str, str], dict[int, Path]]:
    """(scenario, variant) -> seed -> run folder (finished runs only)."""
    out: dict[tuple[str, str], dict[int, Path]] = {}
    for summary in sorted(root.glob("*/*/seed-*/run.json")):
        folder = summary.parent
        key = (folder.parents[1].name, folder.parent.name)
        out.setdefault(key, {})[int(folder.name.removeprefix("seed-"))] = folder
    return out


def attacker_slots(folder: Path, run: dict[str, Any]) -> tuple[float, float | None]:
    """The attacker keys' share of the honest nodes' external slots: over the whole
    run, and over the rounds after the attacker's first slot anywhere (None: never)."""
    keys = {k for a in run.get("attackers", []) for k in a["peer_ids"]}
    total = taken = 0
    per_round: dict[int, list[int]] = {}
    for path in folder.glob("*/metrics.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "external_by_sender" not in record:
                continue
            slots = record["external_by_sender"]
            mine = sum(n for sender, n in slots.items() if sender in keys)
            all_slots = sum(slots.values())
            total += all_slots
            taken += mine
            row = per_round.setdefault(record["round"], [0, 0])
            row[0] += mine
            row[1] += all_slots
    first = min((r for r, (mine, _) in per_round.items() if mine), default=None)
    after = None
    if first is not None:
        mine = sum(m for r, (m, _) in per_round.items() if r >= first)
        every = sum(a for r, (_, a) in per_round.items() if r >= first)
        after = mine / every if every else None
    return (taken / total if total else 0.0), after


def table(root: Path) -> tuple[list[dict[str, Any]], str]:
    found = runs(root)
    cumulative = {
        key: {
            s: json.loads((f / "run.json").read_text())["cumulative_reward"]
            for s, f in seeds.items()
        }
        for key, seeds in found.items()
    }
    reference, silo = cumulative.get(REFERENCE, {}), cumulative.get(SILO, {})
    rows = []
    lines = [
        "| row | seeds | cumulative reward | vs honest swarm [95% CI] | vs plain silo [95% CI] "
        "| vs the same row open | vs the variant it refines (earned: one; half: earned; "
        "net: half) "
        "| attacker's slot share (whole run / after its first slot) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(found):
        if key[0] == LATE_JOINER:
            continue
        values = cumulative[key]
        mean = statistics.fmean(values.values())
        spread = statistics.stdev(values.values()) if len(values) > 1 else 0.0
        vs_honest = paired_ratios(values, reference)
        vs_silo = paired_ratios(values, silo)
        open_key = (key[0], OPEN.get(key[1], ""))
        vs_open = paired_ratios(values, cumulative[open_key]) if open_key in cumulative else []
        one_key = (key[0], REFINES.get(key[1], ""))
        vs_one = paired_ratios(values, cumulative[one_key]) if one_key in cumulative else []
        shares = [
            attacker_slots(f, json.loads((f / "run.json").read_text())) for f in found[key].values()
        ]
        whole = statistics.fmean(s[0] for s in shares)
        afters = [s[1] for s in shares if s[1] is not None]
        after = statistics.fmean(afters) if afters else None
        row = {
            "row": f"{key[0]}/{key[1]}",
            "seeds": sorted(values),
            "mean": mean,
            "honest": paired_ratio_interval(vs_honest) if vs_honest else None,
            "silo": paired_ratio_interval(vs_silo) if vs_silo else None,
            "open": paired_ratio_interval(vs_open) if vs_open else None,
            "one": paired_ratio_interval(vs_one) if vs_one else None,
            "slots": whole,
            "slots_after": after,
        }
        rows.append(row)
        lines.append(
            f"| {row['row']} | {len(values)} | {mean:.2f} ± {spread:.2f} "
            f"| {row['honest'].text() if row['honest'] else '-'} "
            f"| {row['silo'].text() if row['silo'] else '-'} "
            f"| {row['open'].text() if row['open'] else '-'} "
            f"| {row['one'].text() if row['one'] else '-'} "
            f"| {100 * whole:.0f}% / {'-' if after is None else f'{100 * after:.0f}%'} |"
        )
    return rows, "\n".join(lines)


def late_joiner_shares(folder: Path, bins: int = 6, width: int = 10) -> list[float]:
    """Per `width` of the newcomer's rounds: its share of the other nodes' external
    slots (each of them has 8 senders then: a fair share is 1/8)."""
    run = json.loads((folder / "run.json").read_text())
    late = next(n for n in run["nodes"] if n["group"] == "late")
    times = sorted(
        json.loads(line)["time"]
        for line in (folder / late["name"] / "metrics.jsonl").read_text().splitlines()
    )
    got = [[0, 0] for _ in range(bins)]  # [the newcomer's slots, all slots]
    for node in run["nodes"]:
        if node["name"] == late["name"]:
            continue
        for line in (folder / node["name"] / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            done = sum(1 for t in times if t <= record["time"])  # the newcomer's rounds
            if not times or record["time"] < times[0] or done // width >= bins:
                continue
            slots = record["external_by_sender"]
            got[done // width][0] += slots.get(late["peer_id"], 0)
            got[done // width][1] += sum(slots.values())
    return [mine / every if every else 0.0 for mine, every in got]


def late_joiner_table(root: Path) -> str:
    found = {k: v for k, v in runs(root).items() if k[0] == LATE_JOINER}
    if not found:
        return ""
    lines = [
        "| variant | seeds | "
        + " | ".join(f"rounds {10 * b}-{10 * b + 9}" for b in range(6))
        + " |",
        "|---|---|" + "---|" * 6,
    ]
    for key, seeds in sorted(found.items()):
        per_seed = [late_joiner_shares(f) for f in seeds.values()]
        cells = [f"{100 * statistics.fmean(s[b] for s in per_seed):.1f}%" for b in range(6)]
        lines.append(f"| {key[1]} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["honest"] is not None and r["row"] != "/".join(REFERENCE)]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(shown) + 1.2))
    for y, row in enumerate(shown):
        ci = row["honest"]
        baseline = row["row"].endswith(("open", "i8-j0"))
        color = "tab:gray" if baseline else "tab:green"
        ax.plot([ci.low or ci.mean, ci.high or ci.mean], [y, y], color=color, lw=2)
        ax.plot([ci.mean], [y], "o", color=color)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(0.9, color="tab:red", lw=0.8, ls="--", label="target 0.9x")
    ax.set_yticks(range(len(shown)), [r["row"] for r in shown])
    ax.set_xlabel("cumulative reward / honest swarm's (paired by seed, 95% CI)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--plot", type=Path, help="write the ratios to the honest swarm here")
    args = parser.parse_args()
    rows, text = table(args.root)
    print(text)
    late = late_joiner_table(args.root)
    if late:
        print(
            "\nThe honest newcomer's share of the other nodes' external slots, by its rounds"
            " (a fair share: 1 of 8 senders, 12.5%):\n"
        )
        print(late)
    if args.plot is not None:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
