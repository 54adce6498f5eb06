"""The `swarm` command line: parsing and printing only; the work lives in node/.

Invariants:
- A user mistake (bad config, missing key file, bad flag value) prints one line starting
  with `error:` and exits with status 2, never a traceback.
- `swarm train` / `swarm join` keep training when a checkpoint cannot be written (disk
  full, I/O error: the node logs each failure and retries at the next interval). At the
  end they print how many writes failed; if the *final* checkpoint failed, the rounds
  since the newest checkpoint on disk would be lost on restart, so they print `error:`
  with the round a restart resumes from and exit with status 1.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.dashboard import DashboardOpt, dashboard, dashboard_for_node
from cli.node_data import export, samples, status
from cli.shell import SwarmTyper, console, err, flag_help_everywhere, user_errors
from node.instance_lock import hold_node
from swarm import __version__
from swarm.config import NodeConfig, load_config
from swarm.config.template import render_config
from swarm.errors import ConfigError
from swarm.identity import load_key_file, write_key_file

if TYPE_CHECKING:
    from node.runner import Node


app = SwarmTyper(
    no_args_is_help=True, add_completion=False, help="A decentralized RL post-training node."
)
config_app = SwarmTyper(no_args_is_help=True, help="Work with node config files.")
app.add_typer(config_app, name="config")


def _version(value: bool) -> None:
    if value:
        console.print(f"swarm {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version.", metavar=""
        ),
    ] = False,
) -> None:
    """swarm: sample, share and train with strangers' GPUs, no coordinator."""


@app.command()
@user_errors
def keygen(
    path: Annotated[Path, typer.Argument(help="Where to write the key (mode 0600).")],
    force: Annotated[
        bool, typer.Option(help="Overwrite an existing key file.", metavar="")
    ] = False,
) -> None:
    """Create an Ed25519 node key and print its peer id."""
    identity = write_key_file(path, overwrite=force)
    console.print(identity.peer_id)


@app.command()
@user_errors
def peerid(path: Annotated[Path, typer.Argument(help="A key file.")]) -> None:
    """Print the peer id of a key file."""
    console.print(load_key_file(path).peer_id)


@app.command()
@user_errors
def init(
    path: Annotated[Path, typer.Argument(help="Config file to write.")] = Path("node.toml"),
    name: Annotated[
        str | None, typer.Option(help="Node name (default: the file's name, me.toml -> me).")
    ] = None,
    swarm_id: Annotated[str, typer.Option(help="Swarm to join.")] = "swarm-demo",
    transport: Annotated[str, typer.Option(help="libp2p | mqtt | memory")] = "libp2p",
    data_dir: Annotated[Path | None, typer.Option(help="Data dir (default runs/<name>).")] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Write model/task seeds drawn from this (default: none written; a node "
            "derives its seeds from its key)."
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.", metavar="")] = False,
) -> None:
    """Write a commented node config: every option, the defaults (which learn) commented
    out, and only this node's own settings as keys."""
    if path.exists() and not force:
        raise ConfigError(f"{path}: already exists; pass --force to overwrite it")
    import random

    from node.build import apply_overrides
    from node.starter import fresh_seeds, merge

    name = name or path.stem
    overrides = merge(
        fresh_seeds(random.Random(seed)) if seed is not None else {},
        {
            "node": {
                "name": name,
                "swarm_id": swarm_id,
                "data_dir": str(data_dir or Path("runs") / name),
            },
            "transport": {"type": transport},
        },
    )
    config = apply_overrides(NodeConfig(), overrides, "swarm init")
    notes = {
        "transport": 'Choose type = "libp2p" (default, peer to peer), "mqtt" (through a broker:\n'
        'host, port) or "memory" (tests). Each type has its own keys.'
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(config, notes))
    console.print(f"wrote {path}; check it with `swarm config check {path}`")


@config_app.command("check")
@user_errors
def config_check(path: Annotated[Path, typer.Argument(help="Config file.")]) -> None:
    """Validate a config file; print a summary or the exact field that is wrong."""
    config = load_config(path)
    t = config.transport
    console.print(f"{path}: ok")
    node = config.node
    console.print(f"  node {node.name!r} in swarm {node.swarm_id!r}, data in {node.data_dir}")
    console.print(
        f"  transport {t.type}"
        + (f", listen {t.listen}, {len(t.bootstrap)} bootstrap peers" if t.type == "libp2p" else "")
    )
    sampler = config.sampler
    console.print(
        f"  model {config.model.name_or_path}, sampler {sampler.backend}, G={sampler.group_size}"
    )
    console.print(
        f"  SAPO I={config.sapo.local_groups} J={config.sapo.external_groups}, "
        f"max_staleness={config.sapo.max_staleness}, loss={config.train.loss_type}"
    )
    seeds = {"model": config.model.seed, "tasks": config.tasks.seed}
    shown = [f"{kind} {'from the node key' if s is None else s}" for kind, s in seeds.items()]
    console.print(f"  seeds: {', '.join(shown)}")


def _override_args(
    bootstrap: list[str] | None, listen: str | None, data_dir: Path | None, name: str | None
) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {"node": {}, "transport": {}}
    if data_dir is not None:
        overrides["node"]["data_dir"] = str(data_dir)
    if name is not None:
        overrides["node"]["name"] = name
    if bootstrap:
        overrides["transport"]["bootstrap"] = bootstrap
    if listen is not None:
        overrides["transport"]["listen"] = listen
    return overrides


def _source(config_path: Path, **flags: Any) -> str:
    """Where a mistake in the overridden config comes from: the file itself was already
    validated, so it is one of the flags given (named, as the user typed them)."""
    given = [f"--{name.replace('_', '-')}" for name, value in flags.items() if value]
    return f"{config_path} with {' '.join(given)}" if given else str(config_path)


BootstrapOpt = Annotated[
    list[str] | None, typer.Option("--bootstrap", help="Peer multiaddr (repeatable).")
]
ListenOpt = Annotated[
    str | None, typer.Option(help="Listen multiaddr, e.g. /ip4/0.0.0.0/tcp/4001.")
]
DataDirOpt = Annotated[Path | None, typer.Option(help="Data dir (checkpoints, metrics, key).")]
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Node config file.")]


def _report_checkpoints(node: Node) -> bool:
    """Print what went wrong with checkpoints during the run; False if the final one
    could not be written (the caller exits with status 1)."""
    from node import checkpoints

    if not node.checkpoint_errors:
        return True
    final = checkpoints.checkpoint_dir(node.data_dir, node.rounds_done)
    if checkpoints.is_valid(final):
        err.print(
            f"[yellow]warning:[/yellow] {node.checkpoint_errors} checkpoint write(s) failed "
            f"(last: {node.last_checkpoint_error}); the final checkpoint {final} was written",
            highlight=False,
            soft_wrap=True,
        )
        return True
    latest = checkpoints.latest_valid(node.data_dir)
    resumes = (
        f"a restart resumes from round {checkpoints.round_of(latest)} ({latest})"
        if latest is not None
        else "there is no checkpoint: a restart starts from scratch"
    )
    err.print(
        f"[red]error:[/red] the final checkpoint (round {node.rounds_done}) could not be "
        f"written ({node.last_checkpoint_error}); {resumes} and redoes the rounds after it",
        highlight=False,
        soft_wrap=True,
    )
    return False


def _say(line: str) -> None:
    """One status line on stderr, never wrapped (addresses must stay copyable)."""
    print(line, file=sys.stderr, flush=True)


def _install_stop_handlers(stop: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


@app.command()
@user_errors
def join(
    config_path: ConfigOpt = Path("node.toml"),
    rounds: Annotated[
        int | None, typer.Option(help="Stop after this many rounds (default: run until Ctrl-C).")
    ] = None,
    bootstrap: BootstrapOpt = None,
    listen: ListenOpt = None,
    data_dir: DataDirOpt = None,
    name: Annotated[str | None, typer.Option(help="Node name override.")] = None,
    json_progress: Annotated[
        bool, typer.Option("--json", help="Print each round's metrics as JSON.", metavar="")
    ] = False,
    wait_peers: Annotated[
        int,
        typer.Option(min=0, help="Before the first round, wait until this many peers said hello."),
    ] = 0,
    wait_timeout: Annotated[
        float,
        typer.Option(min=0, help="Seconds --wait-peers waits at most (then starts anyway)."),
    ] = 60.0,
    dashboard_at: DashboardOpt = None,
) -> None:
    """Join a swarm: sample, share, train on local + peers' rollouts, checkpoint, resume."""
    from node.build import apply_overrides, build_node
    from node.progress import print_round

    config = apply_overrides(
        load_config(config_path),
        _override_args(bootstrap, listen, data_dir, name),
        _source(config_path, bootstrap=bootstrap, listen=listen, data_dir=data_dir, name=name),
    )

    def show(report: Any) -> None:
        if json_progress:
            print(json.dumps(report.record, sort_keys=True), flush=True)
        else:
            print_round(console, config.node.name, report.record)

    def event(kind: str, info: dict[str, Any]) -> None:
        if kind == "first_peer":
            _say(
                f"first peer {info['peer']} ({info['model_id']}) "
                f"{info['after_s']:.1f} s after this node joined the swarm"
            )
        elif kind == "first_external_group":
            _say(
                f"first external groups used: {info['groups']} in round {info['round']}, "
                f"{info['after_s']:.1f} s after this node joined the swarm"
            )

    async def run() -> Node:
        node = build_node(config, on_round=show, on_event=event)
        try:
            resumed = node.resume()
            if resumed is not None:
                _say(f"resumed from {resumed} at round {node.rounds_done}")
            _install_stop_handlers(node.request_stop)

            def started() -> None:
                _say(f"peer id {node.peer_id}")
                for addr in node.listen_addrs():
                    _say(f"listening on {addr}")
                if wait_peers:
                    _say(f"waiting up to {wait_timeout:.0f} s for {wait_peers} peer(s)")

            await node.run(
                rounds, on_started=started, wait_peers=wait_peers, wait_timeout_s=wait_timeout
            )
        finally:
            node.close()
        return node

    with hold_node(config, "join"), dashboard_for_node(dashboard_at, config.node.data_dir):
        node = asyncio.run(run())
    if not _report_checkpoints(node):
        raise typer.Exit(1)
    err.print(f"stopped after round {node.rounds_done}; checkpoint written")


@app.command()
@user_errors
def train(
    config_path: ConfigOpt = Path("node.toml"),
    rounds: Annotated[int, typer.Option(help="Rounds to train.")] = 50,
    data_dir: DataDirOpt = None,
    dashboard_at: DashboardOpt = None,
) -> None:
    """Train a silo node (no network): the same loop with J = 0 and a memory transport."""
    from node.build import apply_overrides, build_node
    from node.progress import print_round

    config = apply_overrides(
        load_config(config_path),
        {
            "transport": {"type": "memory", "network": f"silo-{id(config_path)}"},
            "sapo": {"external_groups": 0},
            "node": {"data_dir": str(data_dir) if data_dir else None},
        },
        str(config_path),
    )

    async def run() -> Node:
        node = build_node(
            config, on_round=lambda r: print_round(console, config.node.name, r.record)
        )
        try:
            node.resume()
            _install_stop_handlers(node.request_stop)
            await node.run(rounds)
        finally:
            node.close()
        return node

    with hold_node(config, "train"), dashboard_for_node(dashboard_at, config.node.data_dir):
        node = asyncio.run(run())
    if not _report_checkpoints(node):
        raise typer.Exit(1)


@app.command()
@user_errors
def ranks(
    config_path: ConfigOpt = Path("node.toml"),
    first_rank: Annotated[
        int, typer.Option(min=1, help="The first of the node's ranks to run on this machine.")
    ] = 1,
    count: Annotated[
        int | None, typer.Option(min=1, help="How many (default: the rest of train.ranks).")
    ] = None,
) -> None:
    """Run training ranks of a node whose rank 0 (swarm join) runs on another machine.

    The config is the node's own file (train.ranks, train.local_ranks, train.rendezvous);
    the ranks join rank 0 at train.rendezvous and stop when it stops (docs/parallel.md)."""
    from node.ranks import serve_remote_ranks

    failed = serve_remote_ranks(load_config(config_path), first_rank, count)
    if failed:
        err.print(f"{failed} rank(s) failed: see their logs")
        raise typer.Exit(1)


app.command()(status)
app.command()(export)
app.command()(samples)


@app.command()
@user_errors
def peers(
    config_path: ConfigOpt = Path("node.toml"),
    seconds: Annotated[float, typer.Option(help="How long to listen (0 = until Ctrl-C).")] = 0.0,
    bootstrap: BootstrapOpt = None,
    listen: ListenOpt = None,
) -> None:
    """Start a gossip endpoint only and print peers and messages as they arrive."""
    from node.build import apply_overrides
    from node.listen import listen_and_print

    config = apply_overrides(
        load_config(config_path),
        _override_args(bootstrap, listen, None, None),
        _source(config_path, bootstrap=bootstrap, listen=listen),
    )
    with hold_node(config, "peers"):
        asyncio.run(listen_and_print(config, seconds, lambda line: print(line, flush=True)))


@app.command()
@user_errors
def demo(
    nodes: Annotated[int, typer.Option(help="How many local nodes.")] = 3,
    rounds: Annotated[int, typer.Option(help="Rounds per node.")] = 80,
    out: Annotated[Path, typer.Option(help="Where the demo nodes keep their data.")] = Path(
        "runs/demo"
    ),
    dashboard_at: DashboardOpt = None,
    force: Annotated[
        bool, typer.Option(help="Delete --out even if a demo did not write it.", metavar="")
    ] = False,
) -> None:
    """Run a few tiny-model nodes on 127.0.0.1 over libp2p, sharing rollouts; print a summary."""
    from node.demo import run_demo

    sys.exit(run_demo(nodes, rounds, out, console, dashboard_at, force=force))


app.command()(user_errors(dashboard))


def _mount_plugins() -> None:
    """Commands other packages register under the `swarm.cli` entry point (simnet's)."""
    for entry in entry_points(group="swarm.cli"):
        entry.load()(app)
    flag_help_everywhere(app)


_mount_plugins()

if __name__ == "__main__":
    app()
