"""`swarm dashboard` and the `--dashboard` option of `swarm join` / `swarm train`.

Parsing and printing only: the server lives in `node.dashboard`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from swarm.errors import ConfigError

DashboardOpt = Annotated[
    str | None,
    typer.Option(
        "--dashboard",
        help="Serve a live dashboard and Prometheus /metrics at PORT or HOST:PORT "
        "(HOST defaults to 127.0.0.1), e.g. --dashboard 8600.",
    ),
]


@contextlib.contextmanager
def dashboard_for_node(address: str | None, data_dir: Path) -> Iterator[None]:
    """Serve `data_dir`'s dashboard from a thread of this process while the block runs."""
    if address is None:
        yield
        return
    from node.dashboard.server import DashboardThread, parse_listen

    host, port = parse_listen(address)
    server = DashboardThread([data_dir], host, port)
    print(f"dashboard on {server.url} (Prometheus: {server.url}metrics)", file=sys.stderr,
          flush=True)  # fmt: skip
    try:
        yield
    finally:
        server.stop()


def dashboard(
    data_dirs: Annotated[
        list[Path], typer.Argument(help="Node data dirs (each holds metrics.jsonl).")
    ],
    listen: Annotated[
        str, typer.Option(help="PORT or HOST:PORT to serve on (HOST defaults to 127.0.0.1).")
    ] = "8600",
) -> None:
    """Serve a live dashboard (and Prometheus /metrics) over one or more node data dirs."""
    from node.dashboard.server import Dashboard, bound_port, parse_listen, serve

    missing = [str(d) for d in data_dirs if not d.is_dir()]
    if missing:
        raise ConfigError(f"not a directory: {', '.join(missing)} (give nodes' data_dir paths)")
    host, port = parse_listen(listen)

    async def run() -> None:
        runner = await serve(Dashboard(data_dirs), host, port)
        url = f"http://{host}:{bound_port(runner)}/"
        print(f"dashboard on {url} (Prometheus: {url}metrics); Ctrl-C stops", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
