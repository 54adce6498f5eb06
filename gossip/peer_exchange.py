"""Discovery beyond a list: peer exchange over `/swarm/peers/1` and the peer book.

A node given one reachable peer finds the rest of the swarm by itself, and a restarted
node rejoins through the peers it remembers. Runs in the libp2p transport's trio
thread; dials go through the transport's `Redialer` (its backoff and concurrency cap).

The wire format of `/swarm/peers/1` and its checks: `gossip.peer_exchange_wire`.

Invariants:
- What a peer replies is untrusted. A reply over `MAX_REPLY_BYTES` is cut off there and
  dropped (`oversize`); one of another shape is dropped (`malformed`,
  `unknown_version`); within a good reply each bad entry is dropped alone
  (`bad_peer_id`, `no_valid_addr`, `other_network`, `self`). Every drop is counted by reason in
  `stats()`, logged once per (reason, peer) per `_LOG_REPEAT_S`, and survived: the
  connection to the peer is kept.
- Addresses are filtered by `gossip.peer_book.clean_addrs`, and by network
  (`gossip.peer_book.address_scope`): a public address is always dialable; a private
  one (per RFC 1918 block, CGNAT, IPv6 ULA) if this machine has an interface on that
  block or reaches the replying peer over it; a loopback, link-local or reserved one
  only if the replying peer is reached over that kind of address itself, so
  a peer cannot make a public node probe private networks (issue 31: one peer's replies
  had a node dial 338 private addresses).
- Bounded: at most `MAX_CANDIDATES` peers heard of are remembered (a random one leaves
  when full); at most `NEW_DIALS_PER_TICK` of them are handed to the redialer per
  `TICK_S`, and only while connected peers plus recent unanswered dials are below
  `target_peers`; a candidate handed over is not handed over again for
  `CANDIDATE_RETRY_S`; the redialer gives one that never connects up after
  `MAX_CANDIDATE_FAILURES` dials. The host refuses connections beyond `max_peers`
  open now (`connection_limits`; inbound slots: `gossip.libp2p_inbound`).
- Asking: every peer once per connection, as soon as identify says it speaks the
  protocol, and while below `target_peers` one random peer every `exchange_interval_s`;
  at most `MAX_QUERIES_IN_FLIGHT` at once, each within `REQUEST_TIMEOUT_S`.
- Answering: at most one request per peer per `MIN_REQUEST_GAP_S` and
  `MAX_SERVING` at once; others are refused (stream reset) and counted.
- Peer book (when a path is given): peers we held a connection to are recorded, saved
  within `BOOK_NEW_PEER_SAVE_S` of a new peer, every `BOOK_SAVE_PERIOD_S` otherwise and
  at stop; loaded at start, its entries dialed first (newest first).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ifaddr
import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError
from libp2p.pubsub.gossipsub import GossipSub

from gossip.libp2p_dialer import Redialer
from gossip.peer_book import (
    MAX_ADDRS_PER_PEER,
    PUBLIC,
    SOURCES,
    PeerBook,
    address_scope,
    clean_addrs,
)
from gossip.peer_exchange_wire import (
    ENTRY_DROP_REASONS,
    MAX_REPLY_BYTES,
    MAX_REPLY_PEERS,
    REPLY_DROP_REASONS,
    ReplyError,
    decode_reply,
    encode_reply,
    parse_entries,
)
from swarm.bounded import BoundedDict
from swarm.config.network import Libp2pTransportConfig

log = logging.getLogger("gossip.libp2p")

PROTOCOL_ID = TProtocol("/swarm/peers/1")
REQUEST_TIMEOUT_S = 15.0
"""Covers the library's 10 s stream negotiation: on a loaded machine (20 nodes on 2
busy cores) 5 s timed out nearly every exchange."""
TICK_S = 1.0
NEW_DIALS_PER_TICK = 4
MAX_CANDIDATES = 256
CANDIDATE_RETRY_S = 300.0
PENDING_DIAL_S = 10.0
"""A handed-over candidate counts towards `target_peers` for this long while unanswered."""
CANDIDATE_ADDR_TTL_S = 600
MIN_REQUEST_GAP_S = 1.0
MAX_SERVING = 8
MAX_QUERIES_IN_FLIGHT = 2
BOOK_SAVE_PERIOD_S = 30.0
BOOK_NEW_PEER_SAVE_S = 2.0
_MAX_REMEMBERED = 4096
_LOG_REPEAT_S = 600.0
_LOCAL_SCOPES_S = 60.0

QUERY_FAIL_REASONS = ("timeout", "stream_error", "no_answer")
SERVE_REFUSE_REASONS = ("rate_limited", "busy", "write_failed")


def connection_limits(config: Libp2pTransportConfig) -> ConnectionConfig:
    """The host's connection manager limits: at most `max_peers` open connections
    (checked by the library when a connection registers), and never pruned below the cap
    (a pruned peer would only be re-dialed by the redialer). The library's inbound
    limiter (`max_connections - min_connections` slots, kept until the swarm stops) is
    replaced by `gossip.libp2p_inbound`, which also takes `max_peers` as its cap."""
    return ConnectionConfig(
        max_connections=config.max_peers,
        min_connections=0,
        low_watermark=config.max_peers,
        high_watermark=config.max_peers,
    )


@dataclass
class _Candidate:
    addrs: list[str]
    source: str
    last_seen: float
    """Unix time (book entries: last connected; exchange: when heard of)."""


def local_scopes() -> set[str]:
    """`address_scope` of every address of this machine's network interfaces."""
    scopes = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            text = ip.ip[0] if isinstance(ip.ip, tuple) else ip.ip
            kind = "ip6" if ":" in text else "ip4"
            scopes.add(address_scope(f"/{kind}/{text.split('%')[0]}/tcp/1"))
    return scopes


def _remote_scope(stream: INetStream) -> str | None:
    """`address_scope` of the remote end of the connection `stream` runs on (the IP we
    really reach the peer at, not what it advertises), None where the transport has none."""
    try:
        remote = stream.get_remote_address()
    except Exception as exc:  # noqa: BLE001 - a closing connection may fail any accessor
        log.debug("no remote address for a peer-exchange stream: %r", exc)
        return None
    if remote is None:
        return None
    kind = "ip6" if ":" in remote[0] else "ip4"
    return address_scope(f"/{kind}/{remote[0]}/tcp/{remote[1]}")


def _addrs_of(host: IHost, peer_id: ID) -> list[str]:
    try:
        return [str(a) for a in host.get_peerstore().addrs(peer_id)]
    except PeerStoreError:
        return []


def _identified(host: IHost, peer_id: ID) -> bool:
    try:
        return bool(host.get_peerstore().get_protocols(peer_id))
    except PeerStoreError:
        return False


async def _read_bounded(stream: INetStream, limit: int) -> bytes:
    """Everything the peer writes before closing, or `limit` + 1 bytes if it sends more."""
    buf = bytearray()
    while len(buf) <= limit:
        try:
            piece = await stream.read(min(64 * 1024, limit + 1 - len(buf)))
        except EOFError:
            break
        if not piece:
            break
        buf += piece
    return bytes(buf)


class PeerExchange:
    """Peer exchange, the peer book and connection targets; see the module docstring."""

    def __init__(
        self,
        config: Libp2pTransportConfig,
        redialer: Redialer,
        *,
        book_path: Path | None,
        bootstrap: list[ID],
    ) -> None:
        self.enabled = config.peer_exchange
        self.target_peers = config.target_peers
        self.interval_s = config.exchange_interval_s
        self.redialer = redialer
        self.book = PeerBook(book_path if config.peer_book else None)
        self.counts: dict[str, int] = dict.fromkeys(
            ("served", "queries", "discovered", "dials_started", "candidates_evicted"), 0
        )
        self.refused = dict.fromkeys(SERVE_REFUSE_REASONS, 0)
        self.query_failed = dict.fromkeys(QUERY_FAIL_REASONS, 0)
        self.replies_dropped = dict.fromkeys(REPLY_DROP_REASONS, 0)
        self.entries_dropped = dict.fromkeys(ENTRY_DROP_REASONS, 0)
        self.learned_from: BoundedDict[ID, str] = BoundedDict(_MAX_REMEMBERED, fifo=True)
        self.learned_from.update((p, "bootstrap") for p in bootstrap)
        self.candidates: dict[ID, _Candidate] = {}
        self._scopes: set[str] = set()
        self._scopes_read_at: float | None = None
        self._host: IHost | None = None
        self.router: GossipSub | None = None
        """Set by the transport: the mesh sizes per topic go into `stats()`."""
        self._handed: dict[ID, float] = {}
        self._queried: set[ID] = set()
        self._queries_in_flight = 0
        self._serving = 0
        self._last_request: BoundedDict[ID, float] = BoundedDict(_MAX_REMEMBERED)
        self._next_periodic = 0.0
        self._next_save = 0.0
        self._logged: BoundedDict[tuple[str, str], float] = BoundedDict(_MAX_REMEMBERED, fifo=True)

    # ---- set-up and the periodic loop -----------------------------------------------

    def install(self, host: IHost) -> None:
        """Answer `/swarm/peers/1` on `host`; call before `host.run` so that identify
        advertises it to the very first peers."""
        self._host = host
        if self.enabled:
            host.set_stream_handler(PROTOCOL_ID, self._serve)

    async def run(self, host: IHost) -> None:
        """Load the book, then every `TICK_S`: record, ask, dial. Saves the book at exit."""
        self._host = host
        me = host.get_id()
        for entry in self.book.load(time.time()):
            try:
                pid = ID.from_base58(entry.peer_id)
            except Exception:  # noqa: BLE001 - a damaged id in the file
                self.book.counts["load_dropped"] += 1
                continue
            if pid != me:
                self._remember(pid, _Candidate(entry.addrs, "book", entry.last_seen))
        if self.book.entries:
            log.info("peer book: %d peers to try", len(self.book.entries))
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    now = trio.current_time()
                    connected = set(tuple(host.get_network().connections))
                    connected.discard(me)
                    self._note_connected(host, connected, now)
                    if self.enabled:
                        self._ask(nursery, host, connected, now)
                    self._dial(host, connected, now)
                    await trio.sleep(TICK_S)
        finally:  # small and synchronous: also runs when cancelled
            connected = set(tuple(host.get_network().connections))
            connected.discard(me)
            self._note_connected(host, connected, trio.current_time())
            self.book.save()

    def _note_connected(self, host: IHost, connected: set[ID], now: float) -> None:
        wall = time.time()
        new_in_book = False
        for pid in connected:
            source = self.learned_from.get(pid)
            if source is None:
                source = "inbound"
                self._learned(pid, source)
            self.candidates.pop(pid, None)
            if self.book.path is not None and _identified(host, pid):
                new_in_book |= self.book.note(pid.to_base58(), _addrs_of(host, pid), wall, source)
        self._queried &= connected
        if new_in_book:
            self._next_save = min(self._next_save, now + BOOK_NEW_PEER_SAVE_S)
        if self.book.dirty and now >= self._next_save:
            self.book.save()
            self._next_save = now + BOOK_SAVE_PERIOD_S

    def _ask(self, nursery: trio.Nursery, host: IHost, connected: set[ID], now: float) -> None:
        store = host.get_peerstore()
        speaks = [p for p in connected if store.supports_protocols(p, [PROTOCOL_ID])]
        for pid in speaks:
            if pid not in self._queried and self._queries_in_flight < MAX_QUERIES_IN_FLIGHT:
                self._queried.add(pid)
                self._queries_in_flight += 1
                nursery.start_soon(self._query, host, pid)
        if speaks and len(connected) < self.target_peers and now >= self._next_periodic:
            self._next_periodic = now + self.interval_s
            if self._queries_in_flight < MAX_QUERIES_IN_FLIGHT:
                self._queries_in_flight += 1
                nursery.start_soon(self._query, host, random.choice(speaks))

    def _dial(self, host: IHost, connected: set[ID], now: float) -> None:
        self._handed = {p: t for p, t in self._handed.items() if now - t < CANDIDATE_RETRY_S}
        pending = sum(
            1 for p, t in self._handed.items() if p not in connected and now - t < PENDING_DIAL_S
        )
        room = min(NEW_DIALS_PER_TICK, self.target_peers - len(connected) - pending)
        if room <= 0:
            return
        pool = [(p, c) for p, c in self.candidates.items() if p not in self._handed]
        book = sorted((x for x in pool if x[1].source == "book"), key=lambda x: -x[1].last_seen)
        heard = [x for x in pool if x[1].source != "book"]
        random.shuffle(heard)
        for pid, cand in (book + heard)[:room]:
            try:
                addrs = [multiaddr.Multiaddr(a) for a in cand.addrs]
            except Exception:  # noqa: BLE001 - cleaned already; a parser change at worst
                self.candidates.pop(pid, None)
                continue
            host.get_peerstore().add_addrs(pid, addrs, CANDIDATE_ADDR_TTL_S)
            self.redialer.add_candidate(pid)
            self._handed[pid] = now
            self.counts["dials_started"] += 1

    def _remember(self, pid: ID, cand: _Candidate) -> None:
        if pid not in self.candidates and len(self.candidates) >= MAX_CANDIDATES:
            del self.candidates[random.choice(tuple(self.candidates))]
            self.counts["candidates_evicted"] += 1
        self.candidates[pid] = cand
        if pid not in self.learned_from:
            self._learned(pid, cand.source)

    def _learned(self, pid: ID, source: str) -> None:
        self.learned_from[pid] = source

    # ---- asking ---------------------------------------------------------------------

    async def _query(self, host: IHost, pid: ID) -> None:
        """Ask `pid` for its peers and remember the new ones; never raises."""
        self.counts["queries"] += 1
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                stream = await host.new_stream(pid, [PROTOCOL_ID])
                via = _remote_scope(stream)
                data = b""
                try:
                    data = await _read_bounded(stream, MAX_REPLY_BYTES)
                finally:
                    if len(data) > MAX_REPLY_BYTES:
                        await _reset_quietly(stream)  # stop the peer sending more
                    else:
                        await _close_quietly(stream)
        except trio.TooSlowError:
            self.query_failed["timeout"] += 1
            return
        except Exception as exc:  # noqa: BLE001 - whatever the library raises
            self.query_failed["stream_error"] += 1
            log.debug("peer exchange with %s failed: %r", pid, exc)
            return
        finally:
            self._queries_in_flight -= 1
        if not data:
            # A peer that refuses (busy, or asked again too soon) resets the stream, which
            # reads here as an empty reply: a refusal, not a malformed answer.
            self.query_failed["no_answer"] += 1
            return
        self._take_reply(host, pid, data, via)

    def _take_reply(self, host: IHost, pid: ID, data: bytes, via: str | None) -> None:
        """Remember the new peers of `pid`'s reply, which came over a connection whose
        remote address has the scope `via` (None: unknown)."""
        peer = pid.to_base58()
        try:
            entries = decode_reply(data)
        except ReplyError as exc:
            self.replies_dropped[exc.reason] += 1
            self._log_once(exc.reason, peer, f"peer-exchange reply dropped ({exc})")
            return
        # Loopback and link-local only where we reach the replying peer that way: every
        # machine has them, so "this machine is on that network" proves nothing.
        lans = {s for s in self._local_scopes() if s.startswith("private:")}
        scopes = {PUBLIC} | lans | ({via} if via else set())
        good, dropped = parse_entries(entries, host.get_id().to_base58(), scopes=scopes)
        for reason, n in dropped.items():
            if n:
                self.entries_dropped[reason] += n
                if reason != "self":
                    self._log_once(reason, peer, f"{n} peer-exchange entries dropped")
        connected = host.get_network().connections
        wall = time.time()
        for other, addrs in good:
            if other in connected or other in self.candidates:
                continue
            if other not in self.learned_from:
                self.counts["discovered"] += 1
            self._remember(other, _Candidate(addrs, "exchange", wall))

    # ---- answering ------------------------------------------------------------------

    async def _serve(self, stream: INetStream) -> None:
        """Answer one request (a stream handler: never raises)."""
        host = self._host
        requester: ID = stream.muxed_conn.peer_id
        now = trio.current_time()
        last = self._last_request.get(requester)
        reason = None
        if self._serving >= MAX_SERVING:
            reason = "busy"
        elif last is not None and now - last < MIN_REQUEST_GAP_S:
            reason = "rate_limited"
        if host is None or reason is not None:
            self.refused[reason or "busy"] += 1
            await _reset_quietly(stream)
            return
        self._last_request[requester] = now
        self._serving += 1
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                await stream.write(self.reply_for(host, requester))
                await stream.close()
            self.counts["served"] += 1
        except Exception as exc:  # noqa: BLE001 - the asker left, reset, or is too slow
            self.refused["write_failed"] += 1
            log.debug("peer-exchange answer to %s failed: %r", requester, exc)
            await _reset_quietly(stream)
        finally:
            self._serving -= 1

    def reply_for(self, host: IHost, requester: ID) -> bytes:
        """Our reply to `requester`: up to `MAX_REPLY_PEERS` identified connected peers."""
        me = host.get_id()
        peers = [p for p in tuple(host.get_network().connections) if p not in (me, requester)]
        random.shuffle(peers)
        out: list[tuple[str, list[str]]] = []
        for pid in peers:
            if not _identified(host, pid):
                continue
            addrs = clean_addrs(_addrs_of(host, pid), pid.to_base58())[:MAX_ADDRS_PER_PEER]
            if addrs:
                out.append((pid.to_base58(), addrs))
                if len(out) == MAX_REPLY_PEERS:
                    break
        return encode_reply(out)

    # ---- reporting ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters (safe to read from another thread: fixed keys, copied in C)."""
        by_source = dict.fromkeys(SOURCES, 0)
        host, router = self._host, self.router
        if host is not None:
            for pid in tuple(host.get_network().connections):
                by_source[self.learned_from.get(pid, "inbound")] += 1
        return {
            **dict(self.counts),
            "candidates": len(self.candidates),
            "serve_refused_by_reason": dict(self.refused),
            "query_failed_by_reason": dict(self.query_failed),
            "replies_dropped_by_reason": dict(self.replies_dropped),
            "entries_dropped_by_reason": dict(self.entries_dropped),
            "connected_by_source": by_source,
            "mesh_degree": {t: len(p) for t, p in tuple(router.mesh.items())}
            if router is not None
            else {},
            "book_peers": len(self.book.entries),
            "book": dict(self.book.counts),
        }

    def source_of(self, peer_id: str) -> str | None:
        """How we first learned of `peer_id` (one of `SOURCES`), if we remember."""
        try:
            return self.learned_from.get(ID.from_base58(peer_id))
        except Exception:  # noqa: BLE001 - not a peer id
            return None

    def _local_scopes(self) -> set[str]:
        """The networks this machine is on (its interfaces' addresses), re-read at most
        every `_LOCAL_SCOPES_S`."""
        now = time.monotonic()
        if self._scopes_read_at is None or now - self._scopes_read_at > _LOCAL_SCOPES_S:
            self._scopes = local_scopes()
            self._scopes_read_at = now
        return self._scopes

    def _log_once(self, reason: str, peer: str, detail: str) -> None:
        key = (reason, peer)
        now = time.monotonic()
        last = self._logged.get(key)
        if last is not None and now - last < _LOG_REPEAT_S:
            log.debug("%s (peer %s): %s", reason, peer, detail)
            return
        self._logged[key] = now
        log.warning("%s (peer %s): %s (counted in stats)", reason, peer, detail)


async def _close_quietly(stream: INetStream) -> None:
    try:
        await stream.close()
    except Exception as exc:  # noqa: BLE001 - closing a stream the peer already reset
        log.debug("closing a peer-exchange stream: %r", exc)


async def _reset_quietly(stream: INetStream) -> None:
    try:
        await stream.reset()
    except Exception as exc:  # noqa: BLE001 - resetting a stream that is already gone
        log.debug("resetting a peer-exchange stream: %r", exc)
