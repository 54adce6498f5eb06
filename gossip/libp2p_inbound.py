"""Inbound connection slots for py-libp2p 0.8.1: held while a connection is open, and
bounded per address.

What the library does (pinned to libp2p==0.8.1: `install_inbound_slots` raises at start
if either replaced method's source changed, naming the installed version and the pin;
`gossip.libp2p_selfcheck` holds the pinned sources' digests and checks the private
`Swarm._build_remote_multiaddr` used here): `Swarm._handle_inbound_connection` takes a
slot of a `trio.CapacityLimiter(max_connections - min_connections)` for each accepted
TCP connection and gives it back when `_do_handle_inbound_connection` returns; after a
successful upgrade that method ends in `await self.manager.wait_finished()`, which
returns only when the whole swarm stops. So every inbound connection that ever
completed its handshake kept its slot after it closed, and with our limits
(`max_connections = max_peers = 64`, `min_connections = 0`) the 65th inbound
connection of a node's lifetime, and every later one, was reset at accept, while the
node held no connection at all. Honest peers coming and going (and peers holding relay
reservations) used the slots up within a day; 64 keys did it in seconds.

What replaces it (`InboundHandler.handle`, installed on the swarm instance; the
listener looks the method up per connection):
- A slot is taken at accept and given back when the connection closes (its `SwarmConn`
  is closed: the peer left, the muxer failed, or the swarm closed it), when the upgrade
  fails, or when the swarm stops. The handler has to live as long as the connection:
  trio closes an accepted socket when its handler returns.
- `InboundSlots` bounds inbound connections being set up or open *now*: at most
  `max_peers` in all, `max_inbound_per_ip` per IPv4 address (per IPv6 /64, which one
  host usually holds whole) and `max_inbound_per_subnet` per IPv4 /24 (IPv6 /48).
  Loopback peers are exempt from the address bounds (tests run many nodes on
  127.0.0.1; a local process can exhaust us anyway). A refused connection is closed at
  once, before any handshake, and counted by reason.
- The library's own registration check (`Swarm.add_conn`: at most `max_connections`
  open connections, both directions) still runs: the total cap is on what is open now.
- Everything else is the library's: the connection gate, the upgrade
  (`upgrade_inbound_raw_conn`, with its 10 s handshake timeout), registration.
Relayed inbound connections (circuit relay STOP) and DCUtR's hole-punched ones do not
pass through here: the library upgrades them directly, bounded only by `add_conn`'s cap.

Invariants: `InboundSlots.used` equals the number of slots taken and not given back,
and the per-address tables hold only keys with a live slot (memory bounded by
`max_peers`); releasing a slot twice raises (our bug). Refusals are logged once per
reason per `_LOG_REPEAT_S` (with the count since), otherwise at DEBUG. Nothing here
owns a thread; the handler runs in the swarm's trio listener.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import IMuxedConn
from libp2p.io.abc import ReadWriteCloser
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.network.swarm import Swarm
from multiaddr import Multiaddr

from gossip.libp2p_selfcheck import check_instance, check_swarm, reaches

log = logging.getLogger("gossip.libp2p")

_LOG_REPEAT_S = 600.0

REFUSE_REASONS = ("max_peers", "per_ip", "per_subnet")
"""Why an inbound connection was refused at accept (`InboundSlots.refused`)."""


@dataclass(eq=False)
class Slot:
    """One inbound connection's place; `ip_key`/`subnet_key` are None when exempt."""

    ip_key: str | None
    subnet_key: str | None
    released: bool = False


def address_keys(ip: str | None) -> tuple[str | None, str | None]:
    """The (address, subnet) a connection from `ip` counts against; (None, None) for
    loopback and for connections without an IP (no address bound applies).

    IPv4: the address and its /24. IPv6: its /64 and /48. An IPv4-mapped IPv6 address
    counts as the IPv4 address.
    """
    if ip is None:
        return None, None
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip, None  # not an IP (the listener always gives one): its own key
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback:
        return None, None
    if isinstance(addr, ipaddress.IPv4Address):
        return str(addr), str(ipaddress.ip_network(f"{addr}/24", strict=False))
    return (
        str(ipaddress.ip_network(f"{addr}/64", strict=False)),
        str(ipaddress.ip_network(f"{addr}/48", strict=False)),
    )


def network_key(ip: str | None) -> str | None:
    """The network a peer seen at `ip` belongs to, for telling apart who may be one
    operator (`node.trust`'s networks): an IPv4 address's /24, an IPv6 address's /48
    (an IPv4-mapped address as IPv4), `127.0.0.0/8` or `::1/128` for this machine itself;
    None without an IP. A text that is not an IP is its own key."""
    if ip is None:
        return None
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback:
        return "127.0.0.0/8" if isinstance(addr, ipaddress.IPv4Address) else "::1/128"
    prefix = 24 if isinstance(addr, ipaddress.IPv4Address) else 48
    return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))


class InboundSlots:
    """Accounting of inbound connections being set up or open: see the module docstring."""

    def __init__(self, max_slots: int, per_ip: int, per_subnet: int) -> None:
        if min(max_slots, per_ip, per_subnet) < 1:
            raise ValueError("max_slots, per_ip and per_subnet must be >= 1")
        self.max_slots = max_slots
        self.per_ip = per_ip
        self.per_subnet = per_subnet
        self.used = 0
        self.accepted = 0
        self.by_ip: dict[str, int] = {}
        self.by_subnet: dict[str, int] = {}
        self.refused: dict[str, int] = dict.fromkeys(REFUSE_REASONS, 0)
        self._logged: dict[str, tuple[float, int]] = {}

    def acquire(self, ip: str | None) -> Slot | None:
        """A slot for a connection from `ip`, or None (refused, counted, logged)."""
        ip_key, subnet_key = address_keys(ip)
        reason = None
        if self.used >= self.max_slots:
            reason = "max_peers"
        elif ip_key is not None and self.by_ip.get(ip_key, 0) >= self.per_ip:
            reason = "per_ip"
        elif subnet_key is not None and self.by_subnet.get(subnet_key, 0) >= self.per_subnet:
            reason = "per_subnet"
        if reason is not None:
            self._refuse(reason, ip)
            return None
        self.used += 1
        self.accepted += 1
        if ip_key is not None:
            self.by_ip[ip_key] = self.by_ip.get(ip_key, 0) + 1
        if subnet_key is not None:
            self.by_subnet[subnet_key] = self.by_subnet.get(subnet_key, 0) + 1
        return Slot(ip_key, subnet_key)

    def release(self, slot: Slot) -> None:
        if slot.released:
            raise RuntimeError("inbound slot released twice")
        slot.released = True
        self.used -= 1
        for table, key in ((self.by_ip, slot.ip_key), (self.by_subnet, slot.subnet_key)):
            if key is not None:
                left = table[key] - 1
                if left:
                    table[key] = left
                else:
                    del table[key]

    def stats(self) -> dict[str, Any]:
        return {
            "slots_used": self.used,
            "slots_max": self.max_slots,
            "accepted": self.accepted,
            "refused_by_reason": dict(self.refused),
        }

    def _refuse(self, reason: str, ip: str | None) -> None:
        self.refused[reason] += 1
        now = time.monotonic()
        last = self._logged.get(reason)
        if last is not None and now - last[0] < _LOG_REPEAT_S:
            self._logged[reason] = (last[0], last[1] + 1)
            log.debug("inbound connection from %s refused: %s", ip, reason)
            return
        since = f"; {last[1]} more since the last report" if last is not None and last[1] else ""
        limit = {"max_peers": self.max_slots, "per_ip": self.per_ip}.get(reason, self.per_subnet)
        log.warning(
            "inbound connection from %s refused: %s (%d)%s (counted in stats; repeats are "
            "logged at DEBUG for %.0f s)",
            ip,
            reason,
            limit,
            since,
            _LOG_REPEAT_S,
        )
        self._logged[reason] = (now, 0)


def _remote_ip(read_write_closer: ReadWriteCloser) -> str | None:
    try:
        remote = read_write_closer.get_remote_address()
    except Exception as exc:  # noqa: BLE001 - a transport without addresses: no IP bound
        log.debug("inbound connection without a remote address: %r", exc)
        return None
    return None if remote is None else str(remote[0])


async def _close_quietly(closer: Any, what: str) -> None:
    try:
        await closer.close()
    except Exception as exc:  # noqa: BLE001 - the peer's socket may already be gone
        log.debug("closing %s: %r", what, exc)


class InboundHandler:
    """Replaces `Swarm._handle_inbound_connection` on one swarm: see the module docstring."""

    def __init__(self, swarm: Swarm, slots: InboundSlots) -> None:
        self.swarm = swarm
        self.slots = slots
        self.failed = 0
        """Accepted connections whose upgrade or registration failed."""

    async def handle(self, read_write_closer: ReadWriteCloser, maddr: Multiaddr) -> None:
        slot = self.slots.acquire(_remote_ip(read_write_closer))
        if slot is None:
            await _close_quietly(read_write_closer, "a refused inbound connection")
            return
        try:
            await self._serve(read_write_closer, maddr)
        finally:
            self.slots.release(slot)

    async def _serve(self, read_write_closer: ReadWriteCloser, maddr: Multiaddr) -> None:
        """The library's `_do_handle_inbound_connection`, returning once the connection
        is closed instead of once the swarm stops."""
        swarm = self.swarm
        remote_maddr = swarm._build_remote_multiaddr(read_write_closer)
        if remote_maddr is not None and not await swarm.connection_gate.is_allowed(remote_maddr):
            log.debug("inbound connection from %s denied by the connection gate", remote_maddr)
            await _close_quietly(read_write_closer, "a gated inbound connection")
            return
        if isinstance(read_write_closer, IMuxedConn):  # pre-multiplexed (QUIC): no upgrade
            try:
                await swarm.add_conn(read_write_closer, direction="inbound")
            except Exception as exc:  # noqa: BLE001 - the peer's or the cap's: counted
                self.failed += 1
                log.debug("inbound connection from %s not registered: %r", remote_maddr, exc)
                await _close_quietly(read_write_closer, "an unregistered connection")
                return
            await self._until_closed(read_write_closer)
            return
        raw_conn = RawConnection(read_write_closer, False)
        try:
            muxed_conn = await swarm.upgrade_inbound_raw_conn(raw_conn, maddr)
        except Exception as exc:  # noqa: BLE001 - handshake, cap or peer failure: counted
            self.failed += 1
            log.debug("inbound connection from %s failed: %r", remote_maddr, exc)
            await _close_quietly(raw_conn, "a failed inbound connection")
            return
        await self._until_closed(muxed_conn)

    async def _until_closed(self, muxed_conn: IMuxedConn) -> None:
        """Wait until the swarm's connection over `muxed_conn` is closed; close
        `muxed_conn` at once if the swarm did not keep it (trimmed, or closed while
        registering)."""
        for conn in self.swarm.get_connections(muxed_conn.peer_id):
            if getattr(conn, "muxed_conn", None) is muxed_conn:
                check_instance(conn, [("event_closed", trio.Event)], "gossip/libp2p_inbound.py")
                await conn.event_closed.wait()
                return
        if not muxed_conn.is_closed:
            await _close_quietly(muxed_conn, "a connection the swarm did not keep")

    def stats(self) -> dict[str, Any]:
        return {**self.slots.stats(), "failed": self.failed}


def check_pinned() -> None:
    """Raise `LibraryInternalsChanged` unless the library's inbound path is the one
    `InboundHandler` replaces (`gossip.libp2p_selfcheck.check_swarm`)."""
    r = reaches()
    check_swarm(r, None)
    r.raise_if_missing()


def install_inbound_slots(network: Any, slots: InboundSlots) -> InboundHandler:
    """Make `network` (the host's swarm) admit inbound connections through `slots`.

    Call before `host.run` (before it listens). Raises if the swarm is not the pinned
    library's.
    """
    check_pinned()
    if type(network) is not Swarm:
        raise RuntimeError("py-libp2p's Swarm changed; gossip/libp2p_inbound.py needs updating")
    if network.metric_send_channel is not None:
        raise RuntimeError("the replaced inbound path sends no swarm metric events")
    handler = InboundHandler(network, slots)
    # An instance attribute shadows the method: the listener's per-connection callback
    # looks up `self._handle_inbound_connection` each time.
    setattr(network, "_handle_inbound_connection", handler.handle)  # noqa: B010
    return handler
