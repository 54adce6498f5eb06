"""Where a libp2p node listens: the listen port checked before use, and the addresses
the node announces.

Invariants:
- `refuse_unusable_listen` raises `ConfigError` when another socket already listens on the
  configured TCP address, naming the process where /proc tells it (py-libp2p's
  SO_REUSEPORT would otherwise let a second node share the port), when the address is
  not one of this machine's, or when the port needs privileges; never for a free port,
  a port in TIME_WAIT or port 0.
- `announced_addrs` lists every listen address with `/p2p/<peer id>`, a wildcard
  `0.0.0.0` expanded to this machine's IPv4 interfaces (a peer cannot dial 0.0.0.0).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import multiaddr
from libp2p.abc import IHost
from libp2p.utils.address_validation import get_available_interfaces

from swarm.errors import ConfigError

_FAMILIES = {"ip4": socket.AF_INET, "ip6": socket.AF_INET6}


def announced_addrs(host: IHost, peer_id: str) -> list[str]:
    """`host`'s listen addresses as peers dial them (module docstring)."""
    suffix = f"/p2p/{peer_id}"
    out: list[str] = []
    for addr in host.get_transport_addrs():
        names = [proto.name for proto in addr.protocols()]
        ip = addr.value_for_protocol("ip4") if "ip4" in names else None
        if ip == "0.0.0.0":
            port = int(addr.value_for_protocol("tcp"))
            expanded = [a for a in get_available_interfaces(port) if "/ip4/" in str(a)]
        else:
            expanded = [addr]
        out.extend(f"{a}{suffix}" for a in expanded)
    return out


def refuse_unusable_listen(listen: str) -> None:
    """Raise ConfigError if `listen`'s TCP address cannot be ours: another socket already
    listens there, the IP is not this machine's, or the port needs privileges (`_UNUSABLE`).

    py-libp2p listens with SO_REUSEPORT (so that hole punching can dial from the listen
    port), and Linux then lets a second process of the same user listen on the very same
    address: two nodes configured with one port would both listen, and peers dialing one
    would reach either at random (the handshake then fails on the peer id). A probe bound
    without SO_REUSEPORT fails exactly when such a listener exists. Port 0 and non-IP
    addresses are not checked."""
    try:
        parts = {proto.name: value for proto, value in multiaddr.Multiaddr(listen).items()}
    except Exception:  # noqa: BLE001 - validated by the config; libp2p reports the rest
        return
    family = next((f for name, f in _FAMILIES.items() if name in parts), None)
    port = int(parts.get("tcp", 0) or 0)
    if family is None or port == 0:
        return
    ip = parts["ip4" if family == socket.AF_INET else "ip6"]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine
        try:
            probe.bind((str(ip), port))
        except OSError as exc:
            why = _UNUSABLE.get(exc.errno or 0)
            if why is None:
                return  # libp2p's own attempt reports it
            holder = listener_of(port) if exc.errno == errno.EADDRINUSE else None
            if holder is not None:
                why = f"{why}; it is {holder}"
            raise ConfigError(f"transport.listen: could not listen on {listen}: {why}") from None


def listener_of(port: int) -> str | None:
    """`pid N (command line)` of a process of ours listening on TCP `port`, from /proc
    (Linux); None where it cannot be told (another user's process, or no /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
            if any(os.readlink(fd) in inodes for fd in fds):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                return f"pid {proc.name} ({cmdline.strip()[:120]})"
        except OSError:
            continue
    return None


_UNUSABLE = {
    errno.EADDRINUSE: "another process listens on that port (another node on this machine? "
    "give each its own port)",
    errno.EADDRNOTAVAIL: "that IP address is not one of this machine's (use /ip4/0.0.0.0/tcp/"
    "<port> to listen on all of them, and announce the public one through NAT traversal "
    "or port forwarding)",
    errno.EACCES: "ports below 1024 need root; pick one above (4001 is libp2p's usual)",
}
"""Why the probe's bind failed, as the user can act on it (others: libp2p reports them)."""
