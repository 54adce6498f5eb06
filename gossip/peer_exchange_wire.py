"""The `/swarm/peers/1` wire format (peer exchange) and its checks: pure, no sockets.

The protocol (language-neutral; one request per stream): the asker opens a stream with
protocol id `/swarm/peers/1` and sends nothing; the answerer writes one msgpack value
and closes the stream:

    [1, [[peer_id, [multiaddr, ...]], ...]]     # version 1; base58 ids, text multiaddrs

listing at most `MAX_REPLY_PEERS` peers it is connected to (never the asker), each with
at most `MAX_ADDRS_PER_PEER` listen addresses (without `/p2p/<id>`), in at most
`MAX_REPLY_BYTES`.

Invariants: `decode_reply` refuses a whole reply over `MAX_REPLY_BYTES` (`oversize`),
of another shape, with maps, binary or extension values, any array over
`MAX_REPLY_PEERS` or a string over 1 KiB (`malformed`), or another version
(`unknown_version`), before building anything large (msgpack's own limits);
`parse_entries` then drops bad entries one by one (`bad_peer_id`, `no_valid_addr`,
`other_network`, `self`) and returns only addresses `gossip.peer_book.clean_addrs`
accepted, on networks the caller may dial (`gossip.peer_book.address_scope`).
"""

from __future__ import annotations

from collections.abc import Collection

import msgpack
from libp2p.peer.id import ID

from gossip.peer_book import MAX_PEER_ID_CHARS, address_scope, clean_addrs

REPLY_VERSION = 1
MAX_REPLY_PEERS = 32
MAX_REPLY_BYTES = 64 * 1024
REPLY_DROP_REASONS = ("oversize", "malformed", "unknown_version")
ENTRY_DROP_REASONS = ("bad_peer_id", "no_valid_addr", "other_network", "self")


class ReplyError(ValueError):
    """A peer-exchange reply refused as a whole; `reason` is one of `REPLY_DROP_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def encode_reply(peers: list[tuple[str, list[str]]]) -> bytes:
    """The reply bytes for `peers` (the caller bounds the list)."""
    data = msgpack.packb([REPLY_VERSION, [[pid, addrs] for pid, addrs in peers]])
    assert isinstance(data, bytes)
    return data


def decode_reply(data: bytes) -> list[tuple[object, object]]:
    """Parse a reply's shape (entries are checked by `parse_entries`); raises `ReplyError`."""
    if len(data) > MAX_REPLY_BYTES:
        raise ReplyError("oversize", f"{len(data)} bytes over {MAX_REPLY_BYTES}")
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            max_str_len=1024,
            max_bin_len=0,
            max_array_len=MAX_REPLY_PEERS,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for junk
        raise ReplyError("malformed", f"{type(exc).__name__}: {exc}"[:200]) from None
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], list):
        raise ReplyError("malformed", "not [version, [entries]]")
    if value[0] != REPLY_VERSION:
        raise ReplyError("unknown_version", f"version {value[0]!r}")
    entries: list[tuple[object, object]] = []
    for entry in value[1]:
        if not isinstance(entry, list) or len(entry) != 2:
            raise ReplyError("malformed", "an entry is not [peer_id, addrs]")
        entries.append((entry[0], entry[1]))
    return entries


def parse_entries(
    entries: list[tuple[object, object]], me: str, *, scopes: Collection[str]
) -> tuple[list[tuple[ID, list[str]]], dict[str, int]]:
    """The usable (peer id, cleaned addresses) of a decoded reply, and what was dropped.

    Only addresses whose `address_scope` is in `scopes` are kept (the caller allows
    `public` and the networks it shares with the replying peer); an entry left with
    none of its valid addresses is dropped as `other_network`."""
    dropped = dict.fromkeys(ENTRY_DROP_REASONS, 0)
    good: list[tuple[ID, list[str]]] = []
    for raw_id, raw_addrs in entries:
        if not isinstance(raw_id, str) or not 0 < len(raw_id) <= MAX_PEER_ID_CHARS:
            dropped["bad_peer_id"] += 1
            continue
        try:
            peer_id = ID.from_base58(raw_id)
        except Exception:  # noqa: BLE001 - base58/multihash errors for junk ids
            dropped["bad_peer_id"] += 1
            continue
        if raw_id == me:
            dropped["self"] += 1
            continue
        valid = clean_addrs(raw_addrs, raw_id)
        if not valid:
            dropped["no_valid_addr"] += 1
            continue
        addrs = [a for a in valid if address_scope(_relay_host(a)) in scopes]
        if not addrs:
            dropped["other_network"] += 1
            continue
        good.append((peer_id, addrs))
    return good, dropped


def _relay_host(addr: str) -> str:
    """A relay address's relay part (the part before `/p2p-circuit`), else `addr`."""
    return addr.split("/p2p-circuit", 1)[0]
