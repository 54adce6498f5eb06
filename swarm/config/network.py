"""Config sections owned by `gossip/`: the transport (a discriminated union) and gossip."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from swarm.config.base import StrictModel
from swarm.identity import is_peer_id_text

ONE_MIB = 1 << 20


def _check_multiaddr(value: str) -> str:
    """The parts a user types by hand, checked: an IP address after /ip4 or /ip6, a port
    after /tcp or /udp. (Other protocols are left to libp2p, which names them.)"""
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not a multiaddr (expected e.g. /ip4/127.0.0.1/tcp/4001)")
    parts = value.split("/")[1:]
    for name, text in zip(parts, [*parts[1:], ""], strict=True):
        if name in ("ip4", "ip6"):
            version = 4 if name == "ip4" else 6
            try:
                ok = ipaddress.ip_address(text).version == version
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{value!r}: {text!r} is not an IPv{version} address")
        elif name in ("tcp", "udp") and not (text.isdigit() and int(text) < 65536):
            raise ValueError(f"{value!r}: {text!r} is not a port (0 to 65535)")
    return value


class Libp2pTransportConfig(StrictModel):
    type: Literal["libp2p"] = "libp2p"
    listen: str = "/ip4/0.0.0.0/tcp/4001"
    """Multiaddr to listen on. Use /ip4/127.0.0.1/tcp/0 for a local test (0 = any free port)."""
    bootstrap: list[str] = []
    """Multiaddrs (with /p2p/<peer id>) of peers to dial at start; empty for the first node."""
    mdns: bool = False
    """Discover peers on the local network with mDNS (off by default: it announces you)."""
    max_message_bytes: int = Field(ONE_MIB, ge=16 * 1024, le=64 * ONE_MIB)
    """Largest GossipSub message sent or accepted; gossip chunks anything larger. Keep
    1 MiB so peers of other libp2p implementations with default limits accept it."""
    degree: int = Field(6, ge=1, le=64)
    """GossipSub mesh degree D (degree_low = D-2, degree_high = 2D)."""
    heartbeat_interval_s: float = Field(1.0, gt=0, le=60)
    """GossipSub heartbeat (mesh maintenance and gossip emission) period."""
    max_queued_bytes: int = Field(64 * ONE_MIB, ge=ONE_MIB)
    """Memory bound on received messages waiting for the node to read them (at most 1024
    messages too); the newest are dropped and counted beyond it. Under pressure no origin
    peer keeps more than a quarter of it. GossipSub's cache of recent messages (answers
    to peers' IWANT requests) is bounded by the same number of bytes."""
    peer_exchange: bool = True
    """Find the rest of the swarm from any one peer: ask each new peer (and, while below
    `target_peers`, a random peer every `exchange_interval_s`) for the peers it is
    connected to over `/swarm/peers/1`, and dial those we do not know (see
    `gossip.peer_exchange`). Off: only `bootstrap`, the peer book and mDNS find peers."""
    peer_book: bool = True
    """Remember the peers we were connected to in `<data_dir>/peer_book.json` and dial
    them at start, so a restarted node rejoins when its bootstrap peers are gone."""
    target_peers: int = Field(8, ge=1, le=1024)
    """Discovered and remembered peers are dialed while fewer than this many are
    connected (bootstrap peers are always dialed; peers may still dial us)."""
    max_peers: int = Field(64, ge=2, le=4096)
    """Hard cap on open connections, inbound and outbound together: beyond it the host
    refuses new connections. At most this many inbound connections are being set up or
    open at once (a slot is taken at accept and given back when the connection closes)."""
    max_inbound_per_ip: int = Field(8, ge=1, le=4096)
    """Most inbound connections being set up or open at once from one IPv4 address (one
    IPv6 /64); more are closed at accept. Loopback is exempt. A peer needs one."""
    max_inbound_per_subnet: int = Field(16, ge=1, le=4096)
    """Most inbound connections being set up or open at once from one IPv4 /24 (one IPv6
    /48), so that one network cannot take every inbound slot. Loopback is exempt."""
    exchange_interval_s: float = Field(10.0, gt=0, le=3600)
    """How often a node below `target_peers` asks one random peer for its peers."""

    nat_traversal: bool = True
    """Learn whether peers can dial us (AutoNAT); when they cannot, reserve a slot on
    connected relays so peers reach us through `/p2p-circuit`, dial peers we only hear
    through gossip via a relay, and upgrade relayed connections to direct ones by hole
    punching (DCUtR). Off: only direct TCP connections (and GossipSub hops)."""
    relay: bool = False
    """Relay connections for NATed peers (circuit relay v2 hop; each circuit at most 1 h
    and 1 GiB, 64 at once). Only useful on a publicly reachable node; costs bandwidth."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        _check_multiaddr(v)
        parts = v.split("/")
        if len(parts) != 5 or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
            raise ValueError(
                f"{v!r}: a node listens on TCP at an IP address of this machine: "
                "/ip4/<address>/tcp/<port> (or /ip6/...), e.g. /ip4/0.0.0.0/tcp/4001"
            )
        return v

    @model_validator(mode="after")
    def _peer_counts(self) -> Libp2pTransportConfig:
        if self.max_peers < self.target_peers:
            raise ValueError("max_peers must be >= target_peers")
        if self.max_inbound_per_ip > self.max_inbound_per_subnet:
            raise ValueError("max_inbound_per_ip must be <= max_inbound_per_subnet")
        return self

    @model_validator(mode="after")
    def _relay_needs_traversal(self) -> Libp2pTransportConfig:
        if self.relay and not self.nat_traversal:
            raise ValueError(
                "transport.relay = true needs transport.nat_traversal = true "
                "(the relay service is part of it); set both, or relay = false"
            )
        return self

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, v: list[str]) -> list[str]:
        for addr in v:
            _check_multiaddr(addr)
            if "/p2p/" not in addr:
                raise ValueError(f"{addr!r} lacks /p2p/<peer id>; copy it from the peer's log")
            parts = addr.split("/")
            for peer in (parts[i + 1] for i, part in enumerate(parts[:-1]) if part == "p2p"):
                if not is_peer_id_text(peer):
                    raise ValueError(
                        f"{addr!r}: {peer!r} is not a peer id (cut short or mistyped? ids "
                        "look like 12D3KooW... and have 52 characters); copy the whole "
                        "address from the peer's log"
                    )
        return v


def _check_file(value: Path | None, what: str) -> Path | None:
    if value is not None and not value.expanduser().is_file():
        raise ValueError(f"{what} {str(value)!r} is not a file on this machine: fix the path")
    return value


class MqttTlsConfig(StrictModel):
    enabled: bool = False
    """Connect over TLS, checking the broker's certificate (a TLS listener, usually port
    8883). Use it for any broker not on this machine, and always when sending a password."""
    ca_file: Path | None = None
    """PEM file of the CA that signed the broker's certificate (a private CA or a
    self-signed broker). Unset: the system's trusted CAs. The certificate must name
    `transport.host` (DNS name or IP address in its subjectAltName)."""
    cert_file: Path | None = None
    """Client certificate (PEM) for brokers that require one (mosquitto
    `require_certificate true`); set key_file with it."""
    key_file: Path | None = None
    """Unencrypted PEM private key of cert_file (keep it mode 0600)."""

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _exists(cls, v: Path | None) -> Path | None:
        return _check_file(v, "file")

    @model_validator(mode="after")
    def _consistent(self) -> MqttTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            given = "cert_file" if self.key_file is None else "key_file"
            missing = "key_file" if self.key_file is None else "cert_file"
            raise ValueError(
                f"{given} is set without {missing}: a client certificate needs both "
                "(one PEM file holding the certificate and its key may be given as both)"
            )
        files = [n for n in ("ca_file", "cert_file", "key_file") if getattr(self, n) is not None]
        if files and not self.enabled:
            raise ValueError(
                f"{', '.join(files)} set but enabled = false: set enabled = true to use TLS "
                "(or remove them)"
            )
        return self


_HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def _check_host(value: str) -> str:
    """A broker host as the network resolves it: a DNS name or an IP address, alone. A URL
    or a port in it would only fail to resolve, again and again, while the node trains
    alone; say what to write instead."""
    scheme, sep, rest = value.partition("://")
    if sep:
        tls = " (and TLS in transport.tls)" if scheme.lower() in ("mqtts", "ssl", "tls") else ""
        raise ValueError(
            f"{value!r}: write the host alone, {rest.split('/')[0].split(':')[0]!r}; the "
            f"port goes in transport.port{tls}"
        )
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    name, colon, port = value.rpartition(":")
    if colon and port.isdigit():
        raise ValueError(f"{value!r}: write the host alone, {name!r}, and {port} in transport.port")
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    if not value or len(value) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise ValueError(f"{value!r} is not a host name or an IP address of the MQTT broker")
    return value


class MqttTransportConfig(StrictModel):
    type: Literal["mqtt"] = "mqtt"
    host: str = "127.0.0.1"
    """MQTT broker host (the broker only relays; every message is signed end to end)."""
    port: int = Field(1883, ge=1, le=65535)
    """MQTT broker port (brokers usually listen for TLS on 8883)."""
    tls: MqttTlsConfig = MqttTlsConfig()
    """TLS to the broker: its certificate checked against a CA; an optional client
    certificate."""
    username: str | None = Field(None, min_length=1)
    """User name sent to the broker (e.g. a user of mosquitto's `password_file`).
    Unset: connect anonymously."""
    password_file: Path | None = None
    """File whose first line is the broker password for `username` (keep it mode 0600).
    Passwords are never written in this config: use this or password_env."""
    password_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of an environment variable holding the broker password for `username` (e.g.
    SWARM_MQTT_PASSWORD), read when the node starts."""
    max_message_bytes: int = Field(ONE_MIB, ge=16 * 1024, le=256 * ONE_MIB)
    """Largest MQTT publish sent; gossip chunks anything larger."""
    max_inflight_publishes: int = Field(16, ge=1, le=65535)
    """Publishes awaiting the broker's acknowledgement (PUBACK) at once; a further
    publish waits for one. 1: every publish waits for its own (one round trip to the
    broker per message, chunks included)."""
    max_queued_messages: int = Field(1024, ge=1)
    """Bound on messages queued inside the client before the node reads them."""
    max_queued_bytes: int = Field(64 * ONE_MIB, ge=ONE_MIB)
    """Memory bound on received messages waiting for the node to read them; the newest
    are dropped and counted beyond it."""

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return _check_host(v)

    @field_validator("password_file")
    @classmethod
    def _password_file(cls, v: Path | None) -> Path | None:
        return _check_file(v, "password file")

    @model_validator(mode="after")
    def _credentials(self) -> MqttTransportConfig:
        if self.password_file is not None and self.password_env is not None:
            raise ValueError("password_file and password_env are both set: keep one")
        if self.username is None and (self.password_file or self.password_env):
            raise ValueError("a password is configured without username: set username too")
        return self


class MemoryTransportConfig(StrictModel):
    type: Literal["memory"] = "memory"
    network: str = "default"
    """Name of the in-process network to join (unit tests and simnet)."""
    max_message_bytes: int = Field(ONE_MIB, ge=1024)
    """Largest message carried whole."""
    max_queued_bytes: int = Field(64 * ONE_MIB, ge=1024)
    """Memory bound on messages waiting in one receiver's queue (at most 1024 messages
    too); beyond it the newest are dropped and counted (`queue_full`)."""


TransportConfig = Annotated[
    Libp2pTransportConfig | MqttTransportConfig | MemoryTransportConfig,
    Field(discriminator="type"),
]


class ScoringConfig(StrictModel):
    enabled: bool = True
    """Score peers by their refused messages and ignore the worst for a while."""
    ignore_threshold: float = Field(20.0, gt=0)
    """A peer whose score falls to minus this is ignored (a malformed message costs 10,
    a forged rollout group 5, a message over the rate limit 0.25)."""
    half_life_s: float = Field(600.0, gt=0)
    """Scores relax toward 0 with this half-life, so an honest peer's rare faults fade."""
    ignore_s: float = Field(120.0, gt=0)
    """How long a peer is ignored the first time; each repeat offence doubles it."""
    max_ignore_s: float = Field(3600.0, gt=0)
    """Longest ignore period; a peer's count of offences also halves over this time."""
    max_credit: float = Field(10.0, ge=0)
    """Most credit a peer can bank from useful rollout groups against later penalties."""
    max_peers: int = Field(4096, ge=16)
    """Peers whose scores are remembered (an ignored peer is forgotten last)."""

    @model_validator(mode="after")
    def _periods(self) -> ScoringConfig:
        if self.max_ignore_s < self.ignore_s:
            raise ValueError("max_ignore_s must be >= ignore_s")
        return self


class GossipConfig(StrictModel):
    max_envelope_bytes: int = Field(64 * ONE_MIB, ge=64 * 1024)
    """Largest envelope accepted after reassembly (rollout batches, delta packets)."""
    max_reassembly_bytes: int = Field(256 * ONE_MIB, ge=ONE_MIB)
    """Memory bound on all partially received chunked messages together."""
    reassembly_timeout_s: float = Field(30.0, gt=0)
    """A chunked message not complete after this long is dropped."""
    seen_cache_size: int = Field(65536, ge=128)
    """How many (sender, seq) pairs and content hashes are remembered against replays."""
    rate_limit_per_s: float = Field(50.0, gt=0)
    """Sustained messages per second accepted from one peer (token bucket)."""
    rate_burst: int = Field(500, ge=1)
    """Burst size of the per-peer token bucket (chunks of one large message count too)."""
    identity_work_bits: int = Field(0, ge=0, le=32)
    """Swarm-wide, 0 = off: use a peer's groups and deltas only once its hello carried
    this many bits of proof of work on its key (`swarm.identity_work`), so that keys cost
    compute. Every node of a swarm sets the same value. This node mints its own once per
    key (~2**bits hashes: 20 bits take seconds, 24 about a minute, 28 about 15 minutes
    of one core here) and keeps it in `<data_dir>/identity-work.json`."""
    scoring: ScoringConfig = ScoringConfig()
    """Peer scores: who gets ignored for how long, and when they are forgiven."""
