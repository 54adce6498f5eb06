"""A TCP proxy in its own thread, for putting a network between a client and a broker.

`DelayProxy(target_host, target_port, delay_ms)` listens on 127.0.0.1:`port` and relays
every connection to the target, holding each byte `delay_ms` in each direction (a
link with a round trip of 2 x `delay_ms`; order kept, no bandwidth limit). The
target-to-client direction can be held back with `pause_downstream` (nothing reaches
the clients, e.g. no broker acknowledgement) until `resume_downstream`; `drop_all`
closes every relayed connection at once (a network cut). Run as a module it is a proxy
in its own process (`main`).

Invariants:
- Bytes are relayed in order per direction and per connection, each no earlier than
  `delay_ms` after it was read; while paused, downstream bytes are kept, not lost.
- `stop` closes the listener and every connection and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any


class DelayProxy:
    def __init__(self, target_host: str, target_port: int, delay_ms: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_ms / 1000.0
        self.host = "127.0.0.1"
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._downstream_open: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.resets = 0
        """Relayed connections that ended with a connection error (a side went away)."""

    def __enter__(self) -> DelayProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def pause_downstream(self) -> None:
        self._loop.call_soon_threadsafe(self._event().clear)

    def resume_downstream(self) -> None:
        self._loop.call_soon_threadsafe(self._event().set)

    def drop_all(self) -> None:
        """Close every relayed connection (the listener stays: clients may reconnect)."""
        self._call(self._close_connections())

    def _call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _event(self) -> asyncio.Event:
        assert self._downstream_open is not None, "proxy not started"
        return self._downstream_open

    async def _listen(self) -> None:
        self._downstream_open = asyncio.Event()
        self._downstream_open.set()
        self._server = await asyncio.start_server(self._relay, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_connections(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_connections()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            target_r, target_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, target_w))
        upstream_open = asyncio.Event()
        upstream_open.set()  # only the target-to-client direction is ever held back
        pumps = [
            asyncio.create_task(self._pump(client_r, target_w, upstream_open)),
            asyncio.create_task(self._pump(target_r, client_w, self._event())),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for writer in (client_w, target_w):
            writer.close()
            self._writers.discard(writer)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        gate: asyncio.Event,
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await gate.wait()
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((time.monotonic() + self.delay_s, data))
            while not queue.empty() and not sender.done():
                await asyncio.sleep(0.01)  # let what was read go out before closing
        except (ConnectionError, OSError):
            self.resets += 1  # a side went away: the relay ends, closing both
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await sender


def main(argv: list[str]) -> None:
    """`python -m tests.gossip.tcp_proxy HOST PORT DELAY_MS`: print the listening port,
    relay until stdin closes (a proxy in its own process shares no GIL with a client)."""
    host, port, delay_ms = argv[0], int(argv[1]), float(argv[2])
    with DelayProxy(host, port, delay_ms) as proxy:
        print(proxy.port, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1:])
