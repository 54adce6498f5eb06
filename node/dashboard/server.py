"""The dashboard's HTTP server (aiohttp): the page, its JSON, and Prometheus `/metrics`.

Routes: `/` (the page), `/static/...` (its script and style, shipped in the package: no
CDN, so it works offline), `/api/nodes`, `/api/node/{index}`, `/metrics`.

Invariants:
- Read-only: the server reads data dirs and never writes them; it holds no state a
  request can change.
- Bound to 127.0.0.1 unless told otherwise (the page shows peers and completions).
- Followers are polled at most once per `POLL_MIN_S` however often the page or a
  scraper asks, and a node's view is rebuilt only when its data dir changed, so a busy
  browser costs the node a bounded amount of reading and computing.
- In a node (`swarm join --dashboard`) the server runs in its own thread and event loop:
  a slow request never delays the node's rounds or gossip.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from node.dashboard.follow import DataDirFollower
from node.dashboard.prometheus import exposition, registry_for
from node.dashboard.view import node_view, seen_ago
from swarm.clock import WallClock
from swarm.errors import ConfigError

STATIC = Path(__file__).with_name("static")
POLL_MIN_S = 0.5
DEFAULT_PORT = 8600


def parse_listen(value: str) -> tuple[str, int]:
    """`PORT`, `HOST:PORT` or `:PORT` (host 127.0.0.1) -> (host, port)."""
    host, _, port = value.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise ConfigError(f"dashboard address {value!r}: expected PORT or HOST:PORT, e.g. 8600")
    return host or "127.0.0.1", number


class Dashboard:
    """The followers of some data dirs and the web app over them."""

    def __init__(self, data_dirs: Sequence[Path]) -> None:
        names = [d.name for d in data_dirs]
        self.followers = [
            # Two dirs with one name (run-a/node, run-b/node) are told apart by parent.
            DataDirFollower(d, d.name if names.count(d.name) == 1 else f"{d.parent.name}/{d.name}")
            for d in data_dirs
        ]
        self._polled_at = -POLL_MIN_S
        self._views: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        """Per node: the last view and the follower state it was built from."""
        self.registry = registry_for(lambda: self.followers)

    def poll(self) -> None:
        now = time.monotonic()
        if now - self._polled_at >= POLL_MIN_S:
            self._polled_at = now
            for follower in self.followers:
                follower.poll()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_static("/static/", STATIC)
        app.router.add_get("/api/nodes", self._nodes)
        app.router.add_get("/api/node/{index}", self._node)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _nodes(self, request: web.Request) -> web.Response:
        self.poll()
        return web.json_response(
            [
                {"index": i, "name": f.name, "rounds": f.summary.rounds_seen}
                for i, f in enumerate(self.followers)
            ]
        )

    async def _node(self, request: web.Request) -> web.Response:
        index = request.match_info["index"]
        if not (index.isdigit() and int(index) < len(self.followers)):
            raise web.HTTPNotFound(text="no such node")
        self.poll()
        view = self.view(int(index))
        # The one figure that moves without the data dir: read on the node's clock.
        return web.json_response({**view, "seen_ago_s": seen_ago(view, WallClock().now())})

    def names(self) -> dict[str, str]:
        """Peer id -> name of the followed nodes whose peer id is known."""
        out = {}
        for follower in self.followers:
            peer_id = follower.node_info()["peer_id"]
            if peer_id is not None:
                out[peer_id] = follower.name
        return out

    def view(self, index: int) -> dict[str, Any]:
        """The node's view, rebuilt only when its data dir (or a followed node's peer
        id) changed since the last one."""
        follower = self.followers[index]
        names = self.names()
        key = (follower.state_key(), tuple(sorted(names.items())))
        cached = self._views.get(index)
        if cached is None or cached[0] != key:
            cached = self._views[index] = (key, node_view(follower, names))
        return cached[1]

    async def _metrics(self, request: web.Request) -> web.Response:
        self.poll()
        response = web.Response(body=exposition(self.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response


async def serve(dashboard: Dashboard, host: str, port: int) -> web.AppRunner:
    """Start serving; raises ConfigError naming the address when it cannot listen."""
    runner = web.AppRunner(dashboard.app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"dashboard: cannot listen on {host}:{port} ({exc.strerror}): "
            "choose another address or port, e.g. 127.0.0.1:8601"
        ) from None
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port actually bound (useful with port 0), from aiohttp's public
    `AppRunner.addresses` (each listening socket's address)."""
    for address in runner.addresses:
        return int(address[1])
    raise RuntimeError("dashboard is not listening")


class DashboardThread:
    """A dashboard served from its own thread and event loop (inside a node process)."""

    def __init__(self, data_dirs: Sequence[Path], host: str, port: int) -> None:
        self.dashboard = Dashboard(data_dirs)
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._runner: web.AppRunner | None = None
        self.port = port
        self._thread = threading.Thread(target=self._main, name="dashboard", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = self._loop.run_until_complete(
                serve(self.dashboard, self.host, self.port)
            )
            self.port = bound_port(self._runner)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the starting thread
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
