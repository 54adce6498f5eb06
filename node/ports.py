"""Free TCP ports for nodes started by the demo and the tests.

Invariant: a returned port lies below the kernel's ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`) and was bindable on 127.0.0.1 when chosen.
Binding to port 0 would hand out an ephemeral port, which the kernel may give to any
outgoing connection or `bind(0)` between our check and the node's own bind (a
check-then-use race that broke a process test on a loaded machine). Below that range
only a process that names the very same port can take it. Ports are drawn at random so
concurrent test runs rarely collide, and checked so they never return a port in use.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20_000
"""Below the usual service ports people run (and above the well-known ones)."""


def ephemeral_floor() -> int:
    """The first port the kernel hands out for `bind(0)` / outgoing connections."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; other systems use 49152 and above


def free_port(rng: random.Random | None = None, attempts: int = 200) -> int:
    """A TCP port on 127.0.0.1, outside the ephemeral range, free when checked."""
    rng = rng or random.SystemRandom()
    high = ephemeral_floor() - 1
    if high < LOWEST:
        raise RuntimeError(f"no ports between {LOWEST} and the ephemeral range ({high + 1})")
    for _ in range(attempts):
        port = rng.randint(LOWEST, high)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {LOWEST}-{high} after {attempts} attempts")
