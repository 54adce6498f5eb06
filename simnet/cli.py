"""`swarm simnet run SCENARIO` and `swarm report DIR`: parsing and printing only.

Registered with the `swarm` CLI through the `swarm.cli` entry point (`register`), so the
production CLI never imports simnet by name; without simnet installed the commands are
simply absent.

Invariants:
- simnet (and matplotlib, and torch for real-model scenarios) is imported inside the
  commands, so importing this module costs nothing.
- A user mistake (bad scenario, missing directory, existing output) prints one line per
  problem starting with `error:` and exits with status 2, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from swarm.errors import ConfigError

simnet_app = typer.Typer(
    no_args_is_help=True,
    help="Simulated swarms: many real nodes on a virtual clock over a modeled network.",
)
# Piped or logged output is not cut at rich's default of 80 columns (a terminal's width
# is used where there is one).
PIPED_WIDTH = 160
console = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
err = Console(stderr=True, width=None if sys.stderr.isatty() else PIPED_WIDTH)


def _fail(exc: ConfigError) -> typer.Exit:
    for line in str(exc).splitlines():
        err.print(f"[red]error:[/red] {line}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _print_summary(result: dict[str, Any]) -> None:
    table = Table(title=f"simnet: {result['scenario']} ({result['rounds']} rounds)")
    for column in (
        "configuration",
        "seeds",
        "cumulative reward",
        "min-max",
        "vs first",
        "final reward",
        "external/round",
    ):
        table.add_column(column)
    for row in result["configurations"]:
        final = "-" if row["final_reward"] is None else f"{row['final_reward']:.3f}"
        ratio = "-" if row["vs_first"] is None else f"{row['vs_first']:.2f}x"
        table.add_row(
            row["label"],
            str(row["seeds"]),
            f"{row['cumulative_mean']:.2f} ± {row['cumulative_std']:.2f}",
            f"{row['cumulative_min']:.2f}-{row['cumulative_max']:.2f}",
            ratio,
            final,
            f"{row['external_per_round']:.2f}",
        )
    console.print(table)


@simnet_app.command("run")
def run_command(
    scenario: Annotated[Path, typer.Argument(help="A scenario TOML file.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Output directory (default: runs/simnet/<name>)."),
    ] = None,
    seed: Annotated[
        list[int] | None, typer.Option("--seed", help="Run only this seed (repeatable).")
    ] = None,
    variant: Annotated[
        list[str] | None, typer.Option("--variant", help="Run only this variant (repeatable).")
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Replace existing run directories.", metavar="")
    ] = False,
    report: Annotated[
        bool, typer.Option(help="Write plots and a table when done.", metavar="")
    ] = True,
) -> None:
    """Run a scenario: every variant x seed, with progress; per-node JSONL and a summary."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from simnet.report import write_report
    from simnet.runs import run_scenario
    from simnet.scenario import load_scenario
    from simnet.sim_nodes import Progress as SimProgress

    try:
        loaded = load_scenario(scenario)
        target = out if out is not None else Path("runs/simnet") / loaded.name
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            tasks: dict[str, Any] = {}

            def on_progress(p: SimProgress) -> None:
                task = tasks.get(p.run)
                if task is None:
                    task = bar.add_task(
                        f"[{p.run_index + 1}/{p.runs_total}] {p.run}",
                        total=p.node_rounds_total,
                        info="",
                    )
                    tasks[p.run] = task
                bar.update(task, completed=p.node_rounds_done, info=f"t={p.virtual_s:,.0f}s")
                if p.finished and p.summary is not None:
                    final = p.summary["final_reward"]
                    bar.console.print(
                        f"{p.run}: cumulative reward {p.summary['cumulative_reward']:.2f}, "
                        f"final reward {'-' if final is None else f'{final:.3f}'}, "
                        f"{p.summary['virtual_s']:,.0f} virtual s",
                        highlight=False,
                    )

            result = run_scenario(
                loaded, target, on_progress, seeds=seed, variants=variant, overwrite=force
            )
        _print_summary(result)
        console.print(f"wrote {target}/summary.json", highlight=False)
        if report:
            for path in write_report(target):
                console.print(f"wrote {path}", highlight=False)
    except ConfigError as exc:
        raise _fail(exc) from None


def report_command(
    directory: Annotated[Path, typer.Argument(help="A `swarm simnet run` output directory.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Where to write (default: DIRECTORY).")
    ] = None,
) -> None:
    """Write PNG plots (reward per round per node, cumulative reward per configuration)
    and a markdown table for the simnet runs under DIRECTORY."""
    from simnet.report import write_report

    try:
        paths = write_report(directory, out)
    except ConfigError as exc:
        raise _fail(exc) from None
    for path in paths:
        console.print(f"wrote {path}", highlight=False)
    console.print(paths[-1].read_text(), highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Entry point `swarm.cli`: mount `swarm simnet ...` and `swarm report` on `app`."""
    app.add_typer(
        simnet_app, name="simnet", help="Simulated networks of many nodes in one process."
    )
    app.command("report")(report_command)
