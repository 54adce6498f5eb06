"""Human-facing views of a node's metrics: one line per round, and `swarm status`."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from node.metrics import read_metrics
from swarm.errors import ConfigError


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_round(console: Console, name: str, record: dict[str, Any]) -> None:
    seconds = record.get("seconds", {})
    console.print(
        f"[bold]{name}[/bold] round {record['round']:>4}  v{record['policy_version']:<4} "
        f"reward {_fmt(record['mean_local_reward'])}  "
        f"external {record['external_groups']} from {len(record['external_by_sender'])} peers  "
        f"peers {record['peers']}  pool {record['pool_groups']}  "
        f"{seconds.get('total', 0):.2f}s",
        highlight=False,
    )


def summarize(records: list[dict[str, Any]], last: int) -> dict[str, Any]:
    tail = records[-last:]
    rewards = [r["mean_local_reward"] for r in tail if r["mean_local_reward"] is not None]
    first = [r["mean_local_reward"] for r in records[:last] if r["mean_local_reward"] is not None]
    by_sender: Counter[str] = Counter()
    for record in records:
        by_sender.update(record["external_by_sender"])
    final = records[-1]
    seconds = Counter()
    for record in records:
        seconds.update(record["seconds"])
    work = seconds["sample"] + seconds["score"] + seconds["train"]
    evals = [(r["round"], r["eval"]) for r in records if r.get("eval")]
    return {
        "eval_first": evals[0] if evals else None,
        "eval_last": evals[-1] if evals else None,
        "rounds": final["round"],
        "policy_version": final["policy_version"],
        "peers": final.get("peers", 0),
        "first_external_round": final.get("first_external_round"),
        "rounds_with_external": sum(1 for r in records if r["external_groups"]),
        "reward_first": statistics.fmean(first) if first else None,
        "reward_last": statistics.fmean(rewards) if rewards else None,
        "cumulative_reward": sum(r["mean_local_reward"] or 0.0 for r in records),
        "external_groups": sum(r["external_groups"] for r in records),
        "external_by_sender": dict(by_sender),
        "drops": final["drops"],
        "peer_scores": final.get("peer_scores"),  # absent in metrics of older versions
        "bytes_in": final["bytes_in"],
        "bytes_out": final["bytes_out"],
        "overhead_fraction": 1 - work / seconds["total"] if seconds["total"] else None,
    }


def status_table(data_dir: Path, last: int) -> Table:
    records = read_metrics(data_dir / "metrics.jsonl")
    if not records:
        raise ConfigError(
            f"{data_dir}: no metrics.jsonl with rounds yet (is this a node's data_dir?)"
        )
    s = summarize(records, last)
    table = Table(title=f"node {data_dir}", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("rounds / policy version", f"{s['rounds']} / {s['policy_version']}")
    table.add_row("peers (said hello)", str(s["peers"]))
    first = s["first_external_round"]
    table.add_row(
        "first round with external groups / rounds with them",
        f"{first if first is not None else '-'} / {s['rounds_with_external']}",
    )
    table.add_row(f"mean reward, first {last} rounds", _fmt(s["reward_first"]))
    table.add_row(f"mean reward, last {last} rounds", _fmt(s["reward_last"]))
    table.add_row("cumulative reward", f"{s['cumulative_reward']:.2f}")
    for label, entry in (("first", s["eval_first"]), ("latest", s["eval_last"])):
        if entry is not None:
            rnd, ev = entry
            table.add_row(
                f"held-out accuracy, {label} (v{ev['policy_version']}, round {rnd})",
                f"{ev['accuracy']:.3f} of {ev['n']} (greedy; {100 * ev['finished']:.0f}% ended)",
            )
    table.add_row("external groups used", str(s["external_groups"]))
    for sender, count in sorted(s["external_by_sender"].items()):
        table.add_row(f"  from {sender[:16]}…", str(count))
    table.add_row(
        "dropped (reason: count)", ", ".join(f"{k}: {v}" for k, v in s["drops"].items()) or "none"
    )
    table.add_row("bytes in / out", f"{s['bytes_in']:,} / {s['bytes_out']:,}")
    scores = s["peer_scores"]
    if scores is not None:
        table.add_row(
            "peers ignored now / ignore periods / forgiven",
            f"{scores['ignored_now']} / {scores['ignores_started']} / {scores['forgiven']}",
        )
        for peer, info in scores["peers"].items():
            state = (
                f"ignored {info['ignored_for_s']:.0f} s more"
                if info["ignored_for_s"] is not None
                else "heard"
            )
            reasons = ", ".join(f"{k}: {v}" for k, v in info["reasons"].items())
            table.add_row(f"  {peer[:16]}… score {info['score']:.1f}", f"{state}; {reasons or '-'}")
    if s["overhead_fraction"] is not None:
        table.add_row("time outside sample/score/train", f"{100 * s['overhead_fraction']:.1f}%")
    return table
