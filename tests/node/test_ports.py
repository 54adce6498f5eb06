"""node.ports: ports for test and demo nodes stay out of the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

import pytest

from node import ports


def test_a_port_is_below_the_ephemeral_range_and_bindable() -> None:
    port = ports.free_port()
    assert ports.LOWEST <= port < ports.ephemeral_floor()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", busy)
        monkeypatch.setattr(ports, "ephemeral_floor", lambda: busy + 2)  # range: busy, busy+1
        seen = {ports.free_port(random.Random(seed)) for seed in range(20)}
    assert seen == {busy + 1}


def test_no_free_port_is_an_error_not_a_busy_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", busy)
        monkeypatch.setattr(ports, "ephemeral_floor", lambda: busy + 1)
        with pytest.raises(RuntimeError, match="no free port"):
            ports.free_port(attempts=5)
