"""NAT traversal for the libp2p transport: AutoNAT, circuit relay v2 and DCUtR.

Runs in the transport's trio thread (`Libp2pTransport` starts `NatTraversal.run` next
to its re-dialer) and uses py-libp2p 0.8.1's `libp2p.host.autonat` and
`libp2p.relay.circuit_v2`, with the fixes below.

What a node does:
- Every node answers AutoNAT dial-back requests and asks up to `MAX_AUTONAT_SERVERS`
  connected peers to dial it back: `reachability` becomes `public` once one of them
  reached us on a fresh connection, `private` once one answered that it could not and
  none reached us (one verdict is enough: swarms are small; a lying peer can only make
  us reserve relay slots we did not need, or skip them, and gossip still flows through
  GossipSub hops either way).
- A node with `relay = true` (a publicly reachable node that opts in) serves circuit
  relay v2 hops within `RELAY_LIMITS`, to members of its swarm only: a peer may reserve
  a slot, and open a circuit, only while it is subscribed to one of the GossipSub
  topics this node is subscribed to (`member`); strangers are refused
  (`relay_refused_stranger`; issue 31: anyone could reserve and push 64 MiB through),
  within byte budgets per peer, slots freed when their peer leaves (`gossip.relay`).
  Every node accepts relayed connections (STOP).
- A `private` node reserves a slot on every connected relay (refreshed by the library
  before it expires), so peers can reach it at `/p2p/<relay>/p2p-circuit/p2p/<us>`.
- For each peer whose messages reach us (origin of a GossipSub message) but that we
  hold no connection to, the transport dials it through each connected relay, at most
  `MAX_CIRCUIT_DIAL_ATTEMPTS` times per peer and `CIRCUIT_DIAL_BACKOFF_S` apart, while
  fewer than `MAX_CIRCUIT_PEERS` peers are connected. Of two private peers only the
  one with the smaller peer id dials (one circuit per pair, one DCUtR driver).
- DCUtR upgrades a relayed connection to a direct one by TCP hole punching (simultaneous
  open from the listen port). Only the side that *accepted* the relayed connection
  drives it, as the spec says (the library's auto-drive starts it from both sides).
- Which connection is relayed, and per peer whether some connection to it is direct, is
  `gossip.libp2p_connections` (`is_relayed`, `peer_links`).

Library defects worked around here (py-libp2p 0.8.1):
- `AutoNATService._try_dial` uses `host.connect`, which returns at once when a
  connection to the peer exists, as it always does for the peer that asked: every
  dial-back "succeeds" and every node looks public. `_DialBackAutoNAT` dials a fresh
  connection (`Swarm.dial_addr`) and closes it.
- The AutoNAT server dials only advertised addresses whose IP equals the observed one;
  a NATed node advertises its LAN address, so nothing is dialed and it never learns
  it is private. Here the server dials the observed IP at each advertised TCP port.
- `DCUtRProtocol._auto_drive_loop` initiates from both ends of a relayed connection.
Each of these overrides a private hook of the library (as do the relay's member checks,
`_handle_connect`, `_send_status`): `gossip.libp2p_selfcheck.check_nat` checks, when the
transport starts with NAT traversal on, that every hook still exists with these
parameters and is still called by the library, naming the version and the pin if not.
The request's observed IP, whether it came over a relay and its size limit are our own
(`observed_ip`, `stream_is_relayed`, `AUTONAT_MAX_MESSAGE_BYTES`), not the library's
private helpers.

Invariants: nothing here raises out of `run` for a network cause (each failure is
counted in `stats()`); an AutoNAT request that fails is counted
(`autonat_requests_failed`): at DEBUG when the peer's request or stream broke, at
WARNING (once per exception type, with its traceback) when our code or the library's
failed (`AttributeError`, `TypeError`, `NameError`: never a peer's doing); bounded memory
(`MAX_ORIGINS` noted origins); never more than one circuit dial at a time.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID, AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from gossip.libp2p_connections import is_relayed, peer_links
from gossip.relay import RELAY_LIMITS, Member, SwarmCircuitRelay

log = logging.getLogger("gossip.libp2p")

TICK_S = 1.0
DIAL_BACK_TIMEOUT_S = 5.0
"""An AutoNAT dial-back that has not connected by then counts as unreachable."""
AUTONAT_RECHECK_S = 600.0
"""Reachability is re-checked this often once known (every tick while unknown)."""
MAX_AUTONAT_SERVERS = 3
RESERVE_RETRY_S = 60.0
CIRCUIT_DIAL_BACKOFF_S = 20.0
MAX_CIRCUIT_DIAL_ATTEMPTS = 4
MAX_CIRCUIT_PEERS = 16
"""Circuit dials stop while this many peers are connected (GossipSub needs a mesh, not
a connection to everyone)."""
MAX_ORIGINS = 1024
AUTONAT_MAX_MESSAGE_BYTES = 64 * 1024
"""Longest AutoNAT request read (py-libp2p 0.8.1's limit too; real ones are < 1 KiB)."""
_OUR_FAILURES = (AttributeError, NameError, TypeError)
"""Exceptions no peer's request causes: our code or the library's failed."""

UNKNOWN, PUBLIC, PRIVATE = "unknown", "public", "private"


def observed_ip(stream: INetStream) -> str | None:
    """The IP a stream's peer connects from (an IPv4-mapped IPv6 address as IPv4), or
    None when the stream has no remote address."""
    try:
        remote = stream.get_remote_address()
    except Exception:  # noqa: BLE001 - a closing stream may fail any accessor
        return None
    if not remote:
        return None
    text = str(remote[0]).lower()
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def stream_is_relayed(stream: INetStream) -> bool:
    """Whether a stream runs over a relayed connection; True when that cannot be told
    (AutoNAT must not dial back a peer whose IP it cannot see: the spec)."""
    try:
        addrs = stream.muxed_conn.get_transport_addresses()
    except Exception:  # noqa: BLE001 - fail closed
        return True
    if addrs is None:
        return True
    return any("/p2p-circuit" in str(a) for a in addrs)


def reachability_of(verdicts: dict[ID, bool]) -> str:
    """`public` if any server reached us, `private` if one could not and none did."""
    if any(verdicts.values()):
        return PUBLIC
    return PRIVATE if verdicts else UNKNOWN


def dials_circuit(me: str, peer: str, reachability: str) -> bool:
    """Whether we (not `peer`) dial the circuit: a private node only towards larger ids."""
    return reachability != PRIVATE or me < peer


class _DialBackAutoNAT(AutoNATService):
    """AutoNAT v1 whose server dials the observed IP on a fresh connection, and counts a
    failed request (`counts["autonat_requests_failed"]`), logged as the module docstring
    says (the library logs an ERROR for a peer that resets its request stream)."""

    def __init__(self, host: Any, counts: dict[str, int] | None = None) -> None:
        super().__init__(host)
        self.counts = counts if counts is not None else {"autonat_requests_failed": 0}
        self._warned: set[type[BaseException]] = set()

    async def handle_stream(self, stream: INetStream) -> None:
        try:
            request = Message()
            request.ParseFromString(
                await read_varint_prefixed_bytes_limited(stream, AUTONAT_MAX_MESSAGE_BYTES)
            )
            response = await self._handle_request(
                request, observed_ip(stream), stream_is_relayed(stream)
            )
            await stream.write(encode_varint_prefixed(response.SerializeToString()))
        except Exception as exc:  # noqa: BLE001 - counted; ours or the library's: WARNING
            self._request_failed(exc)
        finally:
            with trio.move_on_after(DIAL_BACK_TIMEOUT_S):
                try:
                    await stream.close()
                except Exception as exc:  # noqa: BLE001 - already reset by the peer
                    log.debug("AutoNAT stream close failed: %r", exc)

    def _request_failed(self, exc: Exception) -> None:
        self.counts["autonat_requests_failed"] += 1
        if isinstance(exc, _OUR_FAILURES) and type(exc) not in self._warned:
            self._warned.add(type(exc))
            log.warning("AutoNAT request handling failed in our code or py-libp2p's, not "
                        "the peer's (counted in autonat_requests_failed; further %s not "
                        "logged)", type(exc).__name__, exc_info=exc)  # fmt: skip
        else:
            log.debug("AutoNAT request from a peer failed: %r", exc)

    @staticmethod
    def _filter_by_observed_ip(addrs: list[bytes], observed_ip: str | None) -> list[bytes]:
        if observed_ip is None or ":" in observed_ip:
            return []
        ports: list[str] = []
        for raw in addrs:
            try:
                port = multiaddr.Multiaddr(raw).value_for_protocol("tcp")
            except Exception:  # noqa: BLE001 - a peer's malformed address is skipped
                continue
            if port and port not in ports:
                ports.append(port)
        return [multiaddr.Multiaddr(f"/ip4/{observed_ip}/tcp/{p}").to_bytes() for p in ports[:4]]

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        network = self.host.get_network()
        for raw in addrs:
            conn = None
            with trio.move_on_after(DIAL_BACK_TIMEOUT_S):
                try:
                    conn = await network.dial_addr(multiaddr.Multiaddr(raw), peer_id)
                except Exception as exc:  # noqa: BLE001 - unreachable is the answer
                    log.debug("AutoNAT dial-back to %s failed: %r", peer_id, exc)
            if conn is not None:
                with trio.move_on_after(DIAL_BACK_TIMEOUT_S):
                    await conn.close()
                return raw
        return None


class _InboundDCUtR(DCUtRProtocol):
    """DCUtR driven only by the side that accepted the relayed connection (spec)."""

    async def _auto_drive_loop(self) -> None:
        while True:
            await trio.sleep(2.0)
            connections = self.host.get_network().connections
            for peer_id, conns in tuple(connections.items()):
                items = conns if isinstance(conns, list) else [conns]
                if peer_id in self._in_progress or peer_id in self._direct_connections:
                    continue
                if any(not is_relayed(c) for c in items):
                    continue
                inbound = any(getattr(c.muxed_conn, "is_initiator", True) is False for c in items)
                if inbound:
                    try:
                        await self.initiate_hole_punch(peer_id)
                    except Exception as exc:  # noqa: BLE001 - a failed punch stays relayed
                        log.debug("hole punch to %s failed: %r", peer_id, exc)


class NatTraversal:
    """AutoNAT, relay reservations, circuit dials and DCUtR for one host (trio side)."""

    def __init__(self, *, relay: bool, member: Member) -> None:
        self.relay = relay
        self._member = member
        self.reachability = UNKNOWN
        self._verdicts: dict[ID, bool] = {}
        self._reserved: dict[ID, float] = {}
        """Relays tried, with when to try again (never after a success: the library
        refreshes a reservation; forgotten when the relay disconnects)."""
        self._origins: set[str] = set()
        self._dial_state: dict[str, tuple[int, float]] = {}
        self._links: dict[str, str] = {}
        self.counts = {
            "relay_reservations": 0,
            "relay_reservations_failed": 0,
            "circuit_dials": 0,
            "circuit_dials_failed": 0,
            "direct_upgrades": 0,
            "relay_refused_stranger": 0,
            "relay_budget_exceeded": 0,
            "relay_reservations_released": 0,
            "autonat_requests_failed": 0,
        }

    def note_origin(self, peer: str) -> None:
        """A message from `peer` reached us (trio thread; cheap, bounded)."""
        if len(self._origins) < MAX_ORIGINS:
            self._origins.add(peer)

    def stats(self) -> dict[str, Any]:
        links = list(self._links.values())
        return {
            "nat_reachability": self.reachability,
            "relayed_peers": links.count("relayed"),
            **self.counts,
        }

    async def run(self, host: IHost) -> None:
        protocol = SwarmCircuitRelay(
            host, allow_hop=self.relay, member=self._member, counts=self.counts
        )
        autonat = _DialBackAutoNAT(host, self.counts)
        dcutr = _InboundDCUtR(host)
        config = RelayConfig(roles=RelayRole.STOP, limits=RELAY_LIMITS)
        async with background_trio_service(protocol), background_trio_service(dcutr):
            circuits = CircuitV2Transport(host, protocol, config)
            async with trio.open_nursery() as nursery:
                next_check = 0.0
                while True:
                    now = trio.current_time()
                    if now >= next_check:
                        if await self._check_reachability(host, autonat):
                            next_check = now + AUTONAT_RECHECK_S
                    if self.reachability == PRIVATE:
                        await self._reserve(host, circuits, nursery)
                    await self._dial_origins(host, circuits)
                    self._note_links(host)
                    await trio.sleep(TICK_S)

    def _peers_speaking(self, host: IHost, protocol: str) -> list[ID]:
        out = []
        for pid in tuple(host.get_network().connections):
            try:
                if protocol in host.get_peerstore().get_protocols(pid):
                    out.append(pid)
            except Exception:  # noqa: BLE001 - identify not done yet (no entry)
                continue
        return out

    async def _check_reachability(self, host: IHost, autonat: _DialBackAutoNAT) -> bool:
        """Ask up to `MAX_AUTONAT_SERVERS` peers to dial us back; True once known."""
        servers = self._peers_speaking(host, AUTONAT_PROTOCOL_ID)[:MAX_AUTONAT_SERVERS]
        ports = [a.to_bytes() for a in host.get_transport_addrs()]
        for server in servers:
            try:
                status, _ = await autonat.query_server(
                    server, ports, timeout=DIAL_BACK_TIMEOUT_S + 10.0
                )
            except Exception as exc:  # noqa: BLE001 - the server left or is mute
                log.debug("AutoNAT query to %s failed: %r", server, exc)
                continue
            if status == Message.OK:
                self._verdicts[server] = True
            elif status == Message.E_DIAL_ERROR:
                self._verdicts[server] = False
        before, self.reachability = self.reachability, reachability_of(self._verdicts)
        if before != self.reachability:
            log.info("reachability: %s (AutoNAT, %d server(s))", self.reachability,
                     len(self._verdicts))  # fmt: skip
        return self.reachability != UNKNOWN

    async def _reserve(
        self, host: IHost, circuits: CircuitV2Transport, nursery: trio.Nursery
    ) -> None:
        relays = self._peers_speaking(host, HOP_PROTOCOL_ID)
        self._reserved = {r: t for r, t in self._reserved.items() if r in relays}
        now = trio.current_time()
        for relay in relays:
            if now < self._reserved.get(relay, now):
                continue
            ok = False
            try:
                with trio.move_on_after(DIAL_BACK_TIMEOUT_S * 2):
                    stream = await host.new_stream(relay, [HOP_PROTOCOL_ID])
                    try:
                        ok = await circuits.reserve(stream, relay, nursery)
                    finally:
                        await stream.close()
            except Exception as exc:  # noqa: BLE001 - the relay left or refused
                log.debug("reservation on %s failed: %r", relay, exc)
            self._reserved[relay] = now + (float("inf") if ok else RESERVE_RETRY_S)
            if ok:
                self.counts["relay_reservations"] += 1
                log.info("reserved a relay slot on %s: reachable at /p2p/%s/p2p-circuit/p2p/%s",
                         relay, relay, host.get_id())  # fmt: skip
            else:
                self.counts["relay_reservations_failed"] += 1

    async def _dial_origins(self, host: IHost, circuits: CircuitV2Transport) -> None:
        connections = host.get_network().connections
        if len(connections) >= MAX_CIRCUIT_PEERS:
            return
        me = host.get_id().to_base58()
        relays = self._peers_speaking(host, HOP_PROTOCOL_ID)
        connected = {pid.to_base58() for pid in tuple(connections)}
        now = trio.current_time()
        for peer in sorted(self._origins - connected - {me}):
            attempts, next_at = self._dial_state.get(peer, (0, 0.0))
            if attempts >= MAX_CIRCUIT_DIAL_ATTEMPTS or now < next_at or not relays:
                continue
            if not dials_circuit(me, peer, self.reachability):
                continue
            self._dial_state[peer] = (attempts + 1, now + CIRCUIT_DIAL_BACKOFF_S)
            for relay in relays:
                addr = multiaddr.Multiaddr(f"/p2p/{relay}/p2p-circuit/p2p/{peer}")
                self.counts["circuit_dials"] += 1
                try:
                    with trio.fail_after(DIAL_BACK_TIMEOUT_S * 2):
                        await circuits.dial(addr)
                except Exception as exc:  # noqa: BLE001 - no reservation there, etc.
                    self.counts["circuit_dials_failed"] += 1
                    log.debug("circuit dial %s failed: %r", addr, exc)
                    continue
                log.info("connected to %s through relay %s", peer, relay)
                self._dial_state.pop(peer, None)
                break

    def _note_links(self, host: IHost) -> None:
        links = peer_links(host)
        for peer, link in links.items():
            if link == "direct" and self._links.get(peer) == "relayed":
                self.counts["direct_upgrades"] += 1
                log.info("connection to %s upgraded from relayed to direct (DCUtR)", peer)
        self._links = links
