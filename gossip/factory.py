"""Build the configured `Transport` from its config section.

Invariants:
- Dispatch is on `config.type` only (the discriminated union of
  `swarm.config.network.TransportConfig`); an unknown type raises `ConfigError`.
- Each backend is imported lazily, so a node using MQTT or memory never imports
  libp2p (trio, ~0.5 s and ~85 MB), and a node using libp2p never imports aiomqtt.
"""

from __future__ import annotations

from pathlib import Path

from swarm.config.network import (
    Libp2pTransportConfig,
    MemoryTransportConfig,
    MqttTransportConfig,
    TransportConfig,
)
from swarm.errors import ConfigError
from swarm.identity import Identity
from swarm.transport import Transport

__all__ = ["make_transport"]


def make_transport(
    config: TransportConfig, identity: Identity, *, data_dir: Path | None = None
) -> Transport:
    """Return an unstarted transport for `config` with `identity` as its key; libp2p keeps
    its peer book in `<data_dir>/peer_book.json` (none without a `data_dir`)."""
    if isinstance(config, Libp2pTransportConfig):
        from gossip.libp2p import Libp2pTransport

        book = data_dir / "peer_book.json" if data_dir is not None else None
        return Libp2pTransport(config, identity, peer_book_path=book)
    if isinstance(config, MqttTransportConfig):
        from gossip.mqtt import MqttTransport

        return MqttTransport(config, identity)
    if isinstance(config, MemoryTransportConfig):
        from gossip.memory import MemoryTransport

        return MemoryTransport(config, identity)
    raise ConfigError(f"unknown transport type {getattr(config, 'type', config)!r}")
