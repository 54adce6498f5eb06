"""Human-facing views of a node's metrics: one line per round, and `swarm status`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from node.metrics_segments import iter_metrics
from node.peer_table import read_peer_table
from node.run_summary import RunSummary, no_signal
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
        soft_wrap=True,  # one line per round in a log file too (not folded at 80 columns)
    )


def headline(s: dict[str, Any], last: int) -> list[tuple[str, str, str]]:
    """(key, label, value) of a run's headline figures, as `swarm status` and the
    dashboard both show them (`s`: `RunSummary.summary()`)."""
    drops = s["drops"]
    without_signal = no_signal(drops)
    latest = s["eval_last"]
    overhead = s["overhead_fraction"]
    return [
        ("round", "rounds done", str(s["rounds"])),
        ("policy_version", "policy version", str(s["policy_version"])),
        ("peers", "peers (said hello)", str(s["peers"])),
        ("reward_last", f"mean reward, last {last} rounds", _fmt(s["reward_last"])),
        ("reward_first", f"mean reward, first {last} rounds", _fmt(s["reward_first"])),
        ("eval", "held-out accuracy, latest", _fmt(latest[1]["accuracy"] if latest else None)),
        ("external_groups", "peers' groups trained on", str(s["external_groups"])),
        ("rounds_with_external", "rounds with peers' groups", str(s["rounds_with_external"])),
        ("no_signal", "peers' groups without signal", str(without_signal)),
        ("refused", "refused (other reasons)", str(sum(drops.values()) - without_signal)),
        ("overhead", "time outside sample/score/train",
         "-" if overhead is None else f"{100 * overhead:.1f}%"),
    ]  # fmt: skip


def status_table(data_dir: Path, last: int) -> Table:
    summary = RunSummary(last)
    for record in iter_metrics(data_dir / "metrics.jsonl"):  # streamed: runs can be long
        summary.add(record)
    if not summary.rounds_seen:
        raise ConfigError(
            f"{data_dir}: no metrics.jsonl with rounds yet (is this a node's data_dir?)"
        )
    s = summary.summary()
    restarts = f", {s['restarts']} restart(s)" if s["restarts"] else ""
    table = Table(title=f"node {data_dir} (whole run{restarts})", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for _, label, value in headline(s, last):
        table.add_row(label, value)
    first = s["first_external_round"]
    table.add_row("first round with external groups", str(first if first is not None else "-"))
    table.add_row("cumulative reward", f"{s['cumulative_reward']:.2f}")
    for label, entry in (("first", s["eval_first"]), ("latest", s["eval_last"])):
        if entry is not None:
            rnd, ev = entry
            table.add_row(
                f"held-out accuracy, {label} (v{ev['policy_version']}, round {rnd})",
                f"{ev['accuracy']:.3f} of {ev['n']} (greedy; {100 * ev['finished']:.0f}% ended)",
            )
    for sender, count in sorted(s["external_by_sender"].items()):
        table.add_row(f"  from {sender[:16]}…", str(count))
    peers = read_peer_table(data_dir / "peers.json")
    if peers is not None and peers["peers"]:
        table.add_row(f"peer table (round {peers['round']})", "model, version (claimed); link; "
                      "reward as we re-scored it")  # fmt: skip
        for row in peers["peers"][:10]:
            reward = "-" if row["reward"] is None else f"{row['reward']:.3f}"
            claimed = row.get("claimed") or {}
            said = ", ".join(f"{k} {v:g}" for k, v in claimed.items()) or "-"
            table.add_row(
                f"  {row['peer'][:16]}…",
                f"{row['model_id']} v{row['policy_version']}; {row['link']}; reward {reward}; "
                f"claims {said}; seen {row['last_seen_s']:.0f} s before",
            )
    table.add_row(
        "dropped (reason: count)", ", ".join(f"{k}: {v}" for k, v in s["drops"].items()) or "none"
    )
    table.add_row("bytes in / out", f"{s['bytes_in']:,} / {s['bytes_out']:,}")
    if s["degraded"]:
        table.add_row(
            "library fallbacks (internals gone; see the log)",
            ", ".join(f"{library}: {count}" for library, count in s["degraded"].items()),
        )
    table.add_row(
        "publishes not sent / transport reconnects",
        f"{s['not_sent']:,} / {s['reconnects']:,} (a broker or network outage shows here)",
    )
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
    return table
