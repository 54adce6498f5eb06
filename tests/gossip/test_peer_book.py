"""Pure parts of discovery: address filtering, the peer book file, exchange replies."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
from pydantic import ValidationError

from gossip.peer_book import (
    MAX_ADDRS_PER_PEER,
    PeerBook,
    address_scope,
    clean_addr,
    clean_addrs,
)
from gossip.peer_exchange_wire import (
    MAX_REPLY_BYTES,
    MAX_REPLY_PEERS,
    ReplyError,
    decode_reply,
    encode_reply,
    parse_entries,
)
from swarm.config.network import Libp2pTransportConfig
from swarm.identity import Identity

PID = Identity.from_seed(b"\x01" * 32).peer_id
OTHER = Identity.from_seed(b"\x02" * 32).peer_id
ME = Identity.from_seed(b"\x03" * 32).peer_id
THIRD = Identity.from_seed(b"\x04" * 32).peer_id


@pytest.mark.parametrize(
    ("addr", "want"),
    [
        ("/ip4/10.0.0.1/tcp/4001", "/ip4/10.0.0.1/tcp/4001"),
        (f"/ip4/10.0.0.1/tcp/4001/p2p/{PID}", "/ip4/10.0.0.1/tcp/4001"),
        ("/dns4/node.example.org/tcp/4001", "/dns4/node.example.org/tcp/4001"),
        ("/ip6/2001:db8::1/tcp/4001", "/ip6/2001:db8::1/tcp/4001"),
        (f"/ip4/10.0.0.1/tcp/4001/p2p/{OTHER}", None),  # names another peer
        ("/ip4/0.0.0.0/tcp/4001", None),
        ("/ip4/10.0.0.1/tcp/0", None),
        ("/ip4/10.0.0.1/udp/4001", None),
        ("/tcp/4001", None),
        ("not a multiaddr", None),
        ("/ip4/999.0.0.1/tcp/1", None),
        ("/ip4/10.0.0.1/tcp/4001" + "/tcp/1" * 60, None),  # over MAX_ADDR_CHARS
        (12345, None),
        (None, None),
    ],
)
def test_clean_addr(addr: object, want: str | None) -> None:
    assert clean_addr(addr, PID) == want


def test_loopback_only_when_allowed_and_addrs_bounded() -> None:
    assert clean_addr("/ip4/127.0.0.1/tcp/4001", PID, allow_loopback=False) is None
    assert clean_addr("/ip4/127.0.0.1/tcp/4001", PID) == "/ip4/127.0.0.1/tcp/4001"
    many = [f"/ip4/10.0.0.{i}/tcp/4001" for i in range(1, 20)]
    assert clean_addrs(many + many, PID) == many[:MAX_ADDRS_PER_PEER]
    assert clean_addrs("/ip4/10.0.0.1/tcp/4001", PID) == []  # not a list


def test_book_round_trip_bounds_and_age(tmp_path: Path) -> None:
    path = tmp_path / "peer_book.json"
    book = PeerBook(path, max_peers=2, max_age_s=100.0)
    assert book.note(PID, ["/ip4/10.0.0.1/tcp/1", "junk"], 1000.0, "exchange")
    assert not book.note(PID, ["/ip4/10.0.0.1/tcp/1"], 1001.0, "exchange")  # seen again
    assert not book.note(OTHER, ["junk"], 1000.0, "book")  # no usable address: not kept
    assert book.note(OTHER, ["/ip4/10.0.0.2/tcp/1"], 1002.0, "bootstrap")
    assert book.note(ME, ["/ip4/10.0.0.3/tcp/1"], 1003.0, "inbound")  # evicts the oldest
    assert set(book.entries) == {OTHER, ME}
    assert book.save() and path.exists() and not list(tmp_path.glob(".peer_book.*"))

    loaded = PeerBook(path, max_age_s=100.0).load(now=1050.0)
    assert [e.peer_id for e in loaded] == [ME, OTHER]  # newest first
    assert loaded[1].source == "bootstrap" and loaded[1].addrs == ["/ip4/10.0.0.2/tcp/1"]
    assert PeerBook(path, max_age_s=100.0).load(now=1102.5) == [
        e for e in loaded if e.peer_id == ME
    ]  # OTHER is too old by then


def test_damaged_book_files_start_empty_and_bad_rows_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "peer_book.json"
    for text in ("{not json", json.dumps([1, 2]), json.dumps({"version": 99, "peers": []})):
        path.write_text(text)
        book = PeerBook(path)
        assert book.load(now=10.0) == []
        assert book.counts["load_failed"] == 1
    rows = [
        {"id": PID, "addrs": ["/ip4/10.0.0.1/tcp/1"], "last_seen": 5.0, "source": "evil"},
        {"id": OTHER, "addrs": ["/ip4/0.0.0.0/tcp/1"], "last_seen": 5.0, "source": "book"},
        {"id": ME, "addrs": ["/ip4/10.0.0.1/tcp/1"], "last_seen": "yesterday"},
        "not a row",
    ]
    path.write_text(json.dumps({"version": 1, "peers": rows}))
    book = PeerBook(path)
    entries = book.load(now=10.0)
    assert [(e.peer_id, e.source) for e in entries] == [(PID, "book")]
    assert book.counts["load_dropped"] == 3
    assert PeerBook(tmp_path / "missing.json").load(now=1.0) == []


def test_failed_book_write_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    book = PeerBook(blocker / "peer_book.json")  # its directory is a file
    book.note(PID, ["/ip4/10.0.0.1/tcp/1"], 1.0, "exchange")
    assert not book.save()
    assert book.counts["save_failed"] == 1


def test_reply_round_trip_and_entry_filtering() -> None:
    data = encode_reply(
        [
            (PID, ["/ip4/10.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/1"]),
            (ME, ["/ip4/10.0.0.9/tcp/1"]),
            ("not-a-peer-id", ["/ip4/10.0.0.2/tcp/1"]),
            (OTHER, ["/ip4/0.0.0.0/tcp/1"]),
        ]
    )
    on_its_lan = {"public", "private:10.0.0.0/8"}  # the replying peer is on 10/8 too
    good, dropped = parse_entries(decode_reply(data), ME, scopes=on_its_lan)
    assert [(str(p), a) for p, a in good] == [(PID, ["/ip4/10.0.0.1/tcp/1"])]
    assert dropped == {"bad_peer_id": 1, "no_valid_addr": 1, "other_network": 0, "self": 1}


@pytest.mark.parametrize(
    ("addr", "scope"),
    [
        ("/ip4/8.8.8.8/tcp/1", "public"),
        ("/dns4/example.org/tcp/1", "public"),
        ("/ip4/10.1.2.3/tcp/1", "private:10.0.0.0/8"),
        ("/ip4/172.20.0.1/tcp/1", "private:172.16.0.0/12"),
        ("/ip4/192.168.1.9/tcp/1", "private:192.168.0.0/16"),
        ("/ip4/100.64.3.4/tcp/1", "private:100.64.0.0/10"),
        ("/ip6/fd00::1/tcp/1", "private:fc00::/7"),
        ("/ip4/127.0.0.1/tcp/1", "loopback"),
        ("/ip6/::1/tcp/1", "loopback"),
        ("/ip4/169.254.1.1/tcp/1", "link_local"),
        ("/ip6/fe80::1/tcp/1", "link_local"),
        ("/ip4/203.0.113.7/tcp/1", "reserved"),  # documentation
        ("/ip4/224.0.0.1/tcp/1", "reserved"),  # multicast
        ("/ip4/240.0.0.1/tcp/1", "reserved"),
        ("/ip6/::ffff:10.0.0.1/tcp/1", "private:10.0.0.0/8"),  # IPv4-mapped
    ],
)
def test_address_scopes(addr: str, scope: str) -> None:
    assert address_scope(addr) == scope


def test_a_public_node_is_not_sent_to_probe_private_networks() -> None:
    """Issue 31: replies chosen by one peer made a public node dial 364 addresses, 338 of
    them private. Only addresses on networks the replying peer is on are kept."""
    data = encode_reply(
        [
            (PID, ["/ip4/10.0.0.1/tcp/1", "/ip4/192.168.0.1/tcp/1"]),
            (OTHER, ["/ip4/172.16.0.1/tcp/1", "/ip4/8.8.4.4/tcp/4001"]),
            (THIRD, ["/ip4/127.0.0.1/tcp/1", "/ip4/169.254.0.1/tcp/1", "/ip4/224.0.0.1/tcp/1"]),
        ]
    )
    good, dropped = parse_entries(decode_reply(data), ME, scopes={"public"})
    assert [(str(p), a) for p, a in good] == [(OTHER, ["/ip4/8.8.4.4/tcp/4001"])]
    assert dropped["other_network"] == 2
    lan = parse_entries(decode_reply(data), ME, scopes={"public", "private:192.168.0.0/16"})[0]
    assert next(a for _, a in lan) == ["/ip4/192.168.0.1/tcp/1"]
    local = parse_entries(decode_reply(data), ME, scopes={"public", "loopback"})[0]
    assert ["/ip4/127.0.0.1/tcp/1"] in [a for _, a in local]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00" * (MAX_REPLY_BYTES + 1), "oversize"),
        (b"\xc1", "malformed"),
        (msgpack.packb({"peers": []}), "malformed"),  # maps are refused
        (msgpack.packb([1, [[PID, []]] * (MAX_REPLY_PEERS + 1)]), "malformed"),
        (msgpack.packb([1, [[PID]]]), "malformed"),
        (msgpack.packb([1, [[PID, [b"\x00" * 8]]]]), "malformed"),  # bin refused
        (msgpack.packb([2, []]), "unknown_version"),
        (msgpack.packb([1, "x" * 2000]), "malformed"),
    ],
)
def test_bad_replies_are_refused_by_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ReplyError) as info:
        decode_reply(data)
    assert info.value.reason == reason


def test_config_bounds() -> None:
    assert Libp2pTransportConfig().peer_exchange
    with pytest.raises(ValidationError, match="max_peers"):
        Libp2pTransportConfig(target_peers=10, max_peers=5)
    with pytest.raises(ValidationError):
        Libp2pTransportConfig(exchange_interval_s=0)
