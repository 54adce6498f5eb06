"""Keeping peers connected over py-libp2p: our own bounded re-dial policy.

The library's auto-connector re-dials every peer it ever saw, forever, with an ERROR
line per attempt; the transport turns it off and runs a `Redialer` in its trio thread.

Invariants:
- Bootstrap peers are re-dialed while not connected, with exponential backoff (with
  jitter) capped at `BOOTSTRAP_BACKOFF_MAX_S` (5 min), forever.
- A peer we were connected to (noted by a network notifee the moment a connection opens,
  so one that closes again before the next check, every `MAINTENANCE_PERIOD_S`, counts
  too), or found by mDNS when `mdns`, is re-dialed with backoff capped at
  `BACKOFF_MAX_S` and given up after `MAX_DIAL_FAILURES` consecutive failures, or at
  once when the peerstore holds no address for it (its addresses leave the peerstore;
  it is tracked again once it connects).
- A candidate handed over by discovery (`add_candidate`: the peer book or peer
  exchange, which choose how many and when) that never connected is given up after
  `MAX_CANDIDATE_FAILURES` failed dials; once it connects it is kept like any other.
- At most `MAX_CONCURRENT_DIALS` dials run at once, and at most one per peer.
- The log gets one line when a bootstrap peer becomes unreachable, one when it is back,
  and one per peer given up; never one per attempt. Counted: `dials_attempted`,
  `dials_failed`, `peers_given_up`.
- A failed dial never raises out of `run` (whatever the library raises for a dead peer).
  Its cause is logged in words; a node that answers with another peer id than the
  address names (a bootstrap peer that got a new key, a mistyped `/p2p/` part) is said
  to be exactly that, with the id it has (`dial_failure_cause`), not "unreachable".
- Host names in addresses are resolved by the system resolver before each dial
  (`gossip.libp2p_dns`).
- The library's own re-dialing is off: its swarm's `AutoConnector` re-dials every peer in
  the peerstore forever (cooldown capped at 5 min), each dial 4 attempts, each failed
  attempt an ERROR line (`Failed to open TCP stream`). `disable_auto_connector` and
  `quiet_dial_failures` turn both off (the latter also the ERROR for a failed stream
  negotiation). Both check that the replaced internals are libp2p==0.8.1's.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.exceptions import MultiError
from libp2p.network.auto_connector import AutoConnector
from libp2p.network.config import RetryConfig
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import PeerStoreError
from libp2p.security.noise.exceptions import PeerIDMismatchesPubkey

from gossip.libp2p_dns import resolve_host_names
from gossip.libp2p_selfcheck import reaches

log = logging.getLogger("gossip.libp2p")

DIAL_TIMEOUT_S = 10.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
"""Longest wait between dials of a peer that is not a bootstrap peer."""
BOOTSTRAP_BACKOFF_MAX_S = 300.0
"""Longest wait between dials of an unreachable bootstrap peer (retried forever)."""
MAX_DIAL_FAILURES = 8
"""Consecutive failed dials after which a peer that is not a bootstrap peer is given up
(about a minute of trying with the backoff above)."""
MAX_CANDIDATE_FAILURES = 2
"""Failed dials after which a discovered peer that never connected is given up (its
addresses came from a peer, or from a book that may be out of date)."""
MAX_CONCURRENT_DIALS = 8
MAINTENANCE_PERIOD_S = 0.25
MAX_NEWLY_CONNECTED = 4096
"""Bound on peers noted as connected between two checks (a flood of fresh keys)."""


def _known_addrs(host: IHost, peer_id: ID) -> list[multiaddr.Multiaddr]:
    """The peerstore's addresses of `peer_id`, none if it has none.

    The library raises `PeerStoreError` for a peer it holds no entry for (one that left
    before identify recorded its addresses) or whose entry expired.
    """
    try:
        return list(host.get_peerstore().addrs(peer_id))
    except PeerStoreError:
        return []


class _DialTarget:
    """One peer to keep connected: its backoff (exponential, with jitter) and failures.

    Invariant: at most one dial of a target runs at a time (`dialing`).
    """

    def __init__(
        self, peer_id: ID, *, bootstrap: PeerInfo | None, max_failures: int = MAX_DIAL_FAILURES
    ) -> None:
        self.peer_id = peer_id
        self.bootstrap = bootstrap
        """The configured address for a bootstrap peer (never given up), else None."""
        self.max_failures = max_failures
        self.max_delay = BOOTSTRAP_BACKOFF_MAX_S if bootstrap is not None else BACKOFF_MAX_S
        self.delay = BACKOFF_INITIAL_S
        self.next_at = 0.0
        self.failures = 0
        self.dialing = False

    def failed(self, now: float) -> None:
        self.failures += 1
        self.next_at = now + self.delay * random.uniform(0.8, 1.2)
        self.delay = min(self.delay * 2.0, self.max_delay)

    def reset(self) -> None:
        self.delay = BACKOFF_INITIAL_S
        self.next_at = 0.0
        self.failures = 0


class Redialer:
    """Keeps `bootstrap` peers, peers we were connected to and (with `mdns`) discovered
    peers connected, under the policy of the module docstring. Runs in the trio thread."""

    def __init__(self, bootstrap: list[PeerInfo], *, mdns: bool) -> None:
        self.bootstrap = bootstrap
        self.mdns = mdns
        self.dials_attempted = 0
        self.dials_failed = 0
        self.peers_given_up = 0
        self.newly_connected: set[ID] = set()
        """Peers whose connection opened since the last check (see `ConnectionNotes`)."""
        self.candidates: set[ID] = set()
        """Discovered peers to dial (addresses already in the peerstore), not yet taken."""

    def note_connected(self, peer_id: ID) -> None:
        if len(self.newly_connected) < MAX_NEWLY_CONNECTED:
            self.newly_connected.add(peer_id)

    def add_candidate(self, peer_id: ID) -> None:
        """Dial `peer_id` (its addresses must be in the peerstore) until it connects or
        `MAX_CANDIDATE_FAILURES` dials failed. The caller bounds how many it hands over."""
        if len(self.candidates) < MAX_NEWLY_CONNECTED:
            self.candidates.add(peer_id)

    async def run(self, host: IHost) -> None:
        """Keep bootstrap peers, peers we were connected to and (with `mdns`)
        discovered peers connected, under the re-dial policy of the module docstring."""
        targets: dict[ID, _DialTarget] = {
            info.peer_id: _DialTarget(info.peer_id, bootstrap=info) for info in self.bootstrap
        }
        me = host.get_id()
        limiter = trio.CapacityLimiter(MAX_CONCURRENT_DIALS)
        host.get_network().register_notifee(ConnectionNotes(self))
        async with trio.open_nursery() as nursery:
            while True:
                connected = host.get_network().connections
                noted, self.newly_connected = self.newly_connected, set()
                for pid in (*tuple(connected), *noted):
                    if pid != me and pid not in targets:
                        targets[pid] = _DialTarget(pid, bootstrap=None)
                candidates, self.candidates = self.candidates, set()
                for pid in candidates:
                    if pid != me and pid not in targets:
                        targets[pid] = _DialTarget(
                            pid, bootstrap=None, max_failures=MAX_CANDIDATE_FAILURES
                        )
                if self.mdns:
                    for pid in host.get_peerstore().peers_with_addrs():
                        if pid != me and pid not in targets:
                            targets[pid] = _DialTarget(pid, bootstrap=None)
                now = trio.current_time()
                for target in tuple(targets.values()):
                    if target.peer_id in connected:
                        if target.failures and target.bootstrap is not None:
                            log.info("bootstrap peer %s is connected again", target.peer_id)
                        target.reset()
                        target.max_failures = MAX_DIAL_FAILURES
                    elif not target.dialing and now >= target.next_at:
                        target.dialing = True
                        nursery.start_soon(self._dial_target, host, target, targets, limiter)
                await trio.sleep(MAINTENANCE_PERIOD_S)

    async def _dial_target(
        self,
        host: IHost,
        target: _DialTarget,
        targets: dict[ID, _DialTarget],
        limiter: trio.CapacityLimiter,
    ) -> None:
        """One dial of `target`; on failure back off, warn once (bootstrap) or give up."""
        try:
            async with limiter:
                self.dials_attempted += 1
                if target.bootstrap is not None:
                    info = target.bootstrap
                else:
                    info = PeerInfo(target.peer_id, _known_addrs(host, target.peer_id))
                cause = await self._dial(host, info) if info.addrs else "no known address"
        finally:
            target.dialing = False
        if cause is None:
            target.reset()
            return
        self.dials_failed += 1
        target.failed(trio.current_time())
        if target.bootstrap is not None:
            if target.failures == 1:
                log.warning(
                    "bootstrap peer %s unreachable (%s); retrying with backoff up to %.0f s",
                    target.peer_id,
                    cause,
                    target.max_delay,
                )
        elif target.failures >= target.max_failures or not info.addrs:
            log.info(
                "giving up on peer %s after %d failed dials (last: %s)",
                target.peer_id,
                target.failures,
                cause,
            )
            self.peers_given_up += 1
            targets.pop(target.peer_id, None)
            with contextlib.suppress(PeerStoreError):  # raised for an expired entry
                host.get_peerstore().clear_addrs(target.peer_id)

    async def _dial(self, host: IHost, info: PeerInfo) -> str | None:
        """Dial `info` once (one attempt per address); None on success, else the cause."""
        # Our own backoff replaces the swarm's 60 s negative dial cache, which would
        # otherwise refuse to redial a bootstrap peer that was down at our start.
        host.get_network().unblock_peer(info.peer_id)
        info = PeerInfo(info.peer_id, await resolve_host_names(list(info.addrs)))
        try:
            with trio.fail_after(DIAL_TIMEOUT_S):
                await host.connect(info)
        except trio.TooSlowError:
            return f"no answer within {DIAL_TIMEOUT_S:.0f} s"
        except Exception as exc:  # noqa: BLE001 - what the library raises for a dead peer
            log.debug("dial %s failed: %r", info.peer_id, exc)
            return dial_failure_cause(exc)
        log.info("connected to %s", info.peer_id)
        return None


class ConnectionNotes(INotifee):
    """Tells a `Redialer` of every connection the moment it opens (nothing else)."""

    def __init__(self, redialer: Redialer) -> None:
        self.redialer = redialer

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        muxed = getattr(conn, "muxed_conn", None)
        peer_id = getattr(muxed, "peer_id", None)
        if isinstance(peer_id, ID):
            self.redialer.note_connected(peer_id)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        return None

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def listen(self, network: INetwork, address: multiaddr.Multiaddr) -> None:
        return None

    async def listen_close(self, network: INetwork, address: multiaddr.Multiaddr) -> None:
        return None


_OTHER_ID = re.compile(r"remote_peer_id_from_pubkey=(\w+)")


def dial_failure_cause(error: BaseException) -> str:
    """What a failed dial's exception means, for the log: where the node that answered
    proved another peer id than the one dialed, that; else the root causes (such as
    "ConnectionRefusedError: ... Connection refused"), not the library's wrappers."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    roots: list[str] = []
    while pending:
        exc = pending.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, PeerIDMismatchesPubkey):
            found = _OTHER_ID.search(str(exc))
            other = found.group(1) if found else "another peer"
            return (
                f"the node at that address is {other}, not this peer: it has a new key, or "
                "the address's /p2p/ part is wrong; use the address the node prints as "
                "'listening on'"
            )
        inner: list[BaseException] = []
        if isinstance(exc, MultiError):
            inner.extend(e for e in exc.errors if isinstance(e, BaseException))
        elif isinstance(exc, BaseExceptionGroup):
            inner.extend(exc.exceptions)
        inner.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
        if inner:
            pending.extend(inner)
        else:
            root = f"{type(exc).__name__}: {exc}"
            if root not in roots:
                roots.append(root)
    return "; ".join(roots)[:300]


# ---- the library's own re-dialing, turned off -------------------------------------


class _NoAutoConnector(AutoConnector):
    """The swarm's auto-connector, never dialing (`gossip.libp2p` re-dials, bounded)."""

    async def run_background_task(self, nursery: Any) -> None:
        return

    async def maybe_connect(self) -> None:
        return


class _DialFailureFilter(logging.Filter):
    """Drops the library's per-attempt ERROR lines for failed dials; the transport counts
    dial failures and logs one line per peer it gives up on instead. Also drops its
    seven-line ERROR for a stream whose protocol negotiation failed (a peer that exits
    or resets mid-request), and the negotiator's own ERROR line for the same failure
    (`MultiselectClient handshake: read/write failed`, printed whenever a peer went away
    mid-negotiation): every caller here counts that failure (peer exchange's
    `stream_error`) or retries it (pubsub)."""

    _PREFIXES = (
        "Failed to open TCP stream",
        "failed to upgrade security for peer",
        "Failed to open stream to peer",
        "MultiselectClient handshake: read failed",
        "MultiselectClient handshake: write failed",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self._PREFIXES))


_DIAL_FAILURE_FILTER = _DialFailureFilter()
_DIAL_FAILURE_LOGGERS = (
    "libp2p.transport.tcp.tcp",
    "libp2p.network.swarm",
    "libp2p.host.basic_host",
    "libp2p.protocol_muxer.multiselect_client",
)


def disable_auto_connector(network: Any) -> None:
    """Replace the swarm's auto-connector with one that never dials, and make each dial
    one attempt per address (our backoff replaces the swarm's 4 quick retries).

    Call before `host.run`. Raises if the swarm is not the pinned library's.
    """
    if not isinstance(network, Swarm) or type(network.auto_connector) is not AutoConnector:
        r = reaches()
        r.problem(
            f"the host's network is a {type(network).__name__} with a "
            f"{type(getattr(network, 'auto_connector', None)).__name__} auto-connector, "
            "not a Swarm with an AutoConnector",
            "gossip/libp2p_dialer.py",
        )
        r.raise_if_missing()
    interval = network.auto_connector.auto_connect_interval
    network.auto_connector = _NoAutoConnector(network, interval)
    network.retry_config = RetryConfig(max_retries=0)


def quiet_dial_failures() -> None:
    """Install the filter for failed-dial ERROR lines on the library's loggers (idempotent)."""
    for name in _DIAL_FAILURE_LOGGERS:
        logger = logging.getLogger(name)
        if _DIAL_FAILURE_FILTER not in logger.filters:
            logger.addFilter(_DIAL_FAILURE_FILTER)
