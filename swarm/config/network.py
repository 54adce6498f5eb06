"""Config sections owned by `gossip/`: the transport (a discriminated union) and gossip."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from swarm.config.base import StrictModel

ONE_MIB = 1 << 20


def _check_multiaddr(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not a multiaddr (expected e.g. /ip4/127.0.0.1/tcp/4001)")
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

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        return _check_multiaddr(v)

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, v: list[str]) -> list[str]:
        for addr in v:
            _check_multiaddr(addr)
            if "/p2p/" not in addr:
                raise ValueError(f"{addr!r} lacks /p2p/<peer id>; copy it from the peer's log")
        return v


class MqttTransportConfig(StrictModel):
    type: Literal["mqtt"] = "mqtt"
    host: str = "127.0.0.1"
    """MQTT broker host (the broker only relays; every message is signed end to end)."""
    port: int = Field(1883, ge=1, le=65535)
    """MQTT broker port."""
    max_message_bytes: int = Field(ONE_MIB, ge=16 * 1024, le=256 * ONE_MIB)
    """Largest MQTT publish sent; gossip chunks anything larger."""
    max_queued_messages: int = Field(1024, ge=1)
    """Bound on messages queued inside the client before the node reads them."""
    max_queued_bytes: int = Field(64 * ONE_MIB, ge=ONE_MIB)
    """Memory bound on received messages waiting for the node to read them; the newest
    are dropped and counted beyond it."""


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
    scoring: ScoringConfig = ScoringConfig()
    """Peer scores: who gets ignored for how long, and when they are forgiven."""
