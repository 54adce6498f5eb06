"""Host names in peer addresses, resolved as the rest of the machine resolves them.

py-libp2p 0.8.1 resolves `/dns4|dns6|dns/<name>/...` with dnspython, which asks the DNS
servers only: a name from `/etc/hosts` (`localhost`, a LAN machine listed there) or from
mDNS (`box.local`) stays unresolved and every dial to it fails (found by hand:
`--bootstrap /dns4/localhost/tcp/4301/p2p/...` never connected, where `ssh localhost`
and the README's `/ip4/127.0.0.1/...` do). Before each dial such addresses are resolved
here with the system resolver (`getaddrinfo`: /etc/hosts, DNS, whatever nsswitch says),
anew each time (an address may change).

Invariants: an address without a DNS host passes unchanged, and order is kept; a DNS one
is replaced by one address per IP it resolves to (at most `MAX_IPS`, in the resolver's
order, with the same transport and `/p2p/` parts); a name that does not resolve keeps its
address as it was (the library then tries it its way and reports its own error).
"""

from __future__ import annotations

import logging
import socket

import multiaddr
import trio

log = logging.getLogger("gossip.libp2p")

MAX_IPS = 4
_FAMILIES = {"dns4": socket.AF_INET, "dns6": socket.AF_INET6, "dns": socket.AF_UNSPEC}


def with_ip(addr: str, ip: str) -> str:
    """`addr` (`/dns*/<name>/<rest>`) with its host replaced by `ip`."""
    parts = addr.split("/")
    if len(parts) < 3 or parts[1] not in _FAMILIES:
        raise ValueError(f"not a DNS multiaddr: {addr}")
    kind = "ip6" if ":" in ip else "ip4"
    return "/".join(["", kind, ip, *parts[3:]])


async def resolve_host_names(addrs: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """`addrs` with each DNS host resolved by the system resolver (see the module)."""
    out: list[multiaddr.Multiaddr] = []
    for addr in addrs:
        text = str(addr)
        parts = text.split("/")
        family = _FAMILIES.get(parts[1]) if len(parts) > 2 else None
        if family is None:
            out.append(addr)
            continue
        try:
            infos = await trio.socket.getaddrinfo(parts[2], None, family, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            log.debug("cannot resolve %s: %r", parts[2], exc)
            out.append(addr)
            continue
        ips = list(dict.fromkeys(str(info[4][0]) for info in infos))[:MAX_IPS]
        out.extend(multiaddr.Multiaddr(with_ip(text, ip)) for ip in ips)
        if not ips:
            out.append(addr)
    return out
