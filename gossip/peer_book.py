"""The peer book: peers this node was connected to, kept across restarts.

A node whose bootstrap peers are gone rejoins the swarm through the peers it knew: the
transport loads `<data_dir>/peer_book.json` at start and dials its entries (newest
first) as if they were bootstrap peers, while it has fewer than `target_peers`.

Invariants:
- Only peers we held a connection to enter the book (their peer id was authenticated by
  Noise on that connection); addresses merely *heard of* from other peers never do, so
  a peer cannot poison our book with addresses of peers that do not exist.
- Every address in the book passed `clean_addrs` (on the way in and again on load, so a
  hand-edited or damaged file cannot smuggle in anything else); at most
  `MAX_ADDRS_PER_PEER` per peer and `max_peers` entries (the least recently seen leave
  first); entries not seen for `max_age_s` are dropped on load.
- The file is written by an atomic replace (temporary file in the same directory,
  fsync, `os.replace`): a reader or a restarted node sees the previous book or the new
  one, never a torn file. A file that cannot be read or parsed, or is over
  `MAX_FILE_BYTES`, is logged and counted and the node starts with an empty book; a
  failed write is logged and counted; neither ever stops the node.
- Nothing here touches the network or the event loop: pure bookkeeping and file I/O.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiaddr

log = logging.getLogger("gossip.peer_book")

BOOK_VERSION = 1
MAX_BOOK_PEERS = 256
MAX_ADDRS_PER_PEER = 4
MAX_ADDR_CHARS = 256
MAX_PEER_ID_CHARS = 128
MAX_AGE_S = 7 * 24 * 3600.0
MAX_FILE_BYTES = 1 << 20
_HOST_PROTOCOLS = ("ip4", "ip6", "dns", "dns4", "dns6")
_UNSPECIFIED = ("0.0.0.0", "::")
_LOOPBACK_PREFIXES = ("/ip4/127.", "/ip6/::1/")
SOURCES = ("bootstrap", "book", "exchange", "inbound")
"""How a peer was first learned: configured, from the peer book, from a peer's exchange
reply, or it dialed us (or mDNS found it) first."""


_PRIVATE_BLOCKS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
PUBLIC = "public"


def address_scope(addr: str) -> str:
    """The network an address can be reached on, for deciding who may dial it:
    `public` (a global IP, or a DNS name: resolved later), `loopback`, `link_local`,
    `private:<block>` (one per RFC 1918 block, CGNAT 100.64/10, IPv6 ULA) or `reserved`
    (multicast, documentation, benchmarking and other non-global ranges). Relay
    (`/p2p-circuit`) addresses have the scope of the relay's address."""
    parts = addr.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return PUBLIC
    try:
        ip = ipaddress.ip_address(parts[2])
    except ValueError:
        return "reserved"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    for block in _PRIVATE_BLOCKS:
        if ip.version == block.version and ip in block:
            return f"private:{block}"
    if ip.is_global and not ip.is_multicast:
        return PUBLIC
    return "reserved"


def is_loopback(addr: str) -> bool:
    return addr.startswith(_LOOPBACK_PREFIXES)


def clean_addr(addr: object, peer_id: str, *, allow_loopback: bool = True) -> str | None:
    """`addr` as a dialable multiaddr of `peer_id` without its `/p2p/<id>` tail, or None.

    Refused: anything not a string of at most `MAX_ADDR_CHARS`, unparseable, not
    starting with an IP or DNS component, without TCP, an unspecified IP (0.0.0.0, ::)
    or port 0, a `/p2p/` tail naming another peer, and (unless `allow_loopback`) a
    loopback address. Relay (`/p2p-circuit`) addresses pass through unchanged.
    """
    if not isinstance(addr, str) or not addr or len(addr) > MAX_ADDR_CHARS:
        return None
    try:
        parsed = multiaddr.Multiaddr(addr)
        protocols = [p.name for p in parsed.protocols()]
        if not protocols or protocols[0] not in _HOST_PROTOCOLS or "tcp" not in protocols:
            return None
        host = parsed.value_for_protocol(protocols[0])
        port = parsed.value_for_protocol("tcp")
        if protocols[-1] == "p2p":
            if parsed.value_for_protocol("p2p") != peer_id or protocols.count("p2p") > 1:
                return None
            parsed = parsed.decapsulate(multiaddr.Multiaddr(f"/p2p/{peer_id}"))
        text = str(parsed)
    except Exception:  # noqa: BLE001 - whatever the multiaddr parser raises for junk
        return None
    if host in _UNSPECIFIED or str(port) == "0":
        return None
    if not allow_loopback and is_loopback(text):
        return None
    return text


def clean_addrs(addrs: object, peer_id: str, *, allow_loopback: bool = True) -> list[str]:
    """The first `MAX_ADDRS_PER_PEER` distinct addresses of `addrs` that `clean_addr`
    accepts (an input that is not a list gives none)."""
    if not isinstance(addrs, list):
        return []
    out: list[str] = []
    for addr in addrs[: 4 * MAX_ADDRS_PER_PEER]:
        cleaned = clean_addr(addr, peer_id, allow_loopback=allow_loopback)
        if cleaned is not None and cleaned not in out:
            out.append(cleaned)
            if len(out) == MAX_ADDRS_PER_PEER:
                break
    return out


@dataclass
class BookEntry:
    peer_id: str
    addrs: list[str]
    last_seen: float
    """Unix time we last held a connection to this peer."""
    source: str
    """How we first learned of it (one of `SOURCES`)."""


class PeerBook:
    """Bounded, persisted record of peers we were connected to (see the module docstring)."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_peers: int = MAX_BOOK_PEERS,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.path = path
        self.max_peers = max_peers
        self.max_age_s = max_age_s
        self.entries: dict[str, BookEntry] = {}
        self.dirty = False
        self.counts: dict[str, int] = {
            "loaded": 0,
            "load_dropped": 0,
            "load_failed": 0,
            "saved": 0,
            "save_failed": 0,
        }

    def load(self, now: float) -> list[BookEntry]:
        """Read the file (if any) and return its entries, most recently seen first."""
        self.entries.clear()
        if self.path is None or not self.path.exists():
            return []
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"over {MAX_FILE_BYTES} bytes")
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("version") != BOOK_VERSION:
                raise ValueError("not a version-1 peer book")
            rows = data.get("peers")
            if not isinstance(rows, list):
                raise ValueError("no peer list")
        except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
            self.counts["load_failed"] += 1
            log.warning("peer book %s unusable (%s); starting without it", self.path, exc)
            return []
        for row in rows[: 4 * self.max_peers]:
            entry = _entry_from_json(row, now, self.max_age_s)
            if entry is None:
                self.counts["load_dropped"] += 1
            else:
                self.entries[entry.peer_id] = entry
        self._trim()
        self.counts["loaded"] = len(self.entries)
        return self.newest()

    def newest(self) -> list[BookEntry]:
        return sorted(self.entries.values(), key=lambda e: e.last_seen, reverse=True)

    def note(self, peer_id: str, addrs: list[str], now: float, source: str) -> bool:
        """Record that we are connected to `peer_id`, listening on `addrs` (cleaned here;
        a peer without a usable address is not recorded). True if it is new to the book."""
        cleaned = clean_addrs(addrs, peer_id)
        if not cleaned or len(peer_id) > MAX_PEER_ID_CHARS:
            return False
        entry = self.entries.get(peer_id)
        if entry is None:
            self.entries[peer_id] = BookEntry(peer_id, cleaned, now, source)
            self._trim()
            self.dirty = True
            return True
        if entry.addrs != cleaned or now - entry.last_seen >= 1.0:
            entry.addrs, entry.last_seen = cleaned, now
            self.dirty = True
        return False

    def save(self) -> bool:
        """Write the book by atomic replace if it changed; False if the write failed."""
        if self.path is None or not self.dirty:
            return True
        rows = [
            {"id": e.peer_id, "addrs": e.addrs, "last_seen": e.last_seen, "source": e.source}
            for e in self.newest()
        ]
        text = json.dumps({"version": BOOK_VERSION, "peers": rows}, indent=1)
        tmp: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".peer_book.", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            tmp = None
        except OSError as exc:
            self.counts["save_failed"] += 1
            log.warning("could not write peer book %s: %s", self.path, exc)
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError as exc:
                    log.debug("could not remove %s: %s", tmp, exc)
        self.dirty = False
        self.counts["saved"] += 1
        return True

    def _trim(self) -> None:
        while len(self.entries) > self.max_peers:
            oldest = min(self.entries.values(), key=lambda e: e.last_seen)
            del self.entries[oldest.peer_id]


def _entry_from_json(row: Any, now: float, max_age_s: float) -> BookEntry | None:
    """One book row, validated; None if anything about it is off or it is too old."""
    if not isinstance(row, dict):
        return None
    peer_id, last_seen, source = row.get("id"), row.get("last_seen"), row.get("source")
    if not isinstance(peer_id, str) or not 0 < len(peer_id) <= MAX_PEER_ID_CHARS:
        return None
    if not isinstance(last_seen, int | float) or isinstance(last_seen, bool):
        return None
    if now - last_seen > max_age_s or last_seen > now + 3600.0:
        return None
    addrs = clean_addrs(row.get("addrs"), peer_id)
    if not addrs:
        return None
    return BookEntry(peer_id, addrs, float(last_seen), source if source in SOURCES else "book")
