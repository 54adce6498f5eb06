"""`gossip.mqtt_connect.BrokerClient` registers paho's socket for writing only while it is
open: a connection the broker drops between paho's request (from its thread) and the
event loop's turn is a lost connection, not a traceback from inside the loop."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from gossip.mqtt_connect import BrokerClient


class _Paho:
    """paho's client as the write callback sees it: `loop_write` writes nothing here."""

    def __init__(self) -> None:
        self.writes = 0

    def loop_write(self) -> int:
        self.writes += 1
        return 0


def _run(close_first: bool) -> tuple[list[dict[str, Any]], int, bool]:
    errors: list[dict[str, Any]] = []

    async def main() -> tuple[int, bool]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        client = BrokerClient("127.0.0.1", 1)
        paho = _Paho()
        ours, theirs = socket.socketpair()
        try:
            client._on_socket_register_write(paho, None, ours)
            if close_first:
                ours.close()  # the broker dropped us before the loop ran the registration
            await asyncio.sleep(0.05)
            if not close_first:
                loop.remove_writer(ours.fileno())
        finally:
            ours.close()
            theirs.close()
        return paho.writes, client._disconnected.done()

    writes, disconnected = asyncio.run(main())
    return errors, writes, disconnected


def test_a_socket_closed_before_the_loop_registers_it_is_no_loop_error() -> None:
    errors, writes, _ = _run(close_first=True)
    assert errors == []
    assert writes == 0


def test_an_open_socket_is_registered_and_written() -> None:
    errors, writes, disconnected = _run(close_first=False)
    assert errors == []
    assert writes >= 1  # a socketpair is writable at once
    assert not disconnected
