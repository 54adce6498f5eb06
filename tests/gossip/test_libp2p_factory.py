"""`gossip.factory.make_transport`: one transport class per config `type`, built unstarted."""

from __future__ import annotations

from pydantic import TypeAdapter

from gossip.factory import make_transport
from gossip.libp2p import Libp2pTransport
from gossip.memory import MemoryTransport
from gossip.mqtt import MqttTransport
from swarm.config.network import TransportConfig
from swarm.identity import Identity

ADAPTER: TypeAdapter = TypeAdapter(TransportConfig)


def test_dispatches_on_type_and_keeps_limits() -> None:
    identity = Identity.generate()
    cases = [
        ({"type": "libp2p", "listen": "/ip4/127.0.0.1/tcp/0"}, Libp2pTransport),
        ({"type": "mqtt", "port": 1884}, MqttTransport),
        ({"type": "memory", "network": "factory-test"}, MemoryTransport),
    ]
    for raw, cls in cases:
        config = ADAPTER.validate_python({**raw, "max_message_bytes": 512 * 1024})
        transport = make_transport(config, identity)
        assert isinstance(transport, cls)
        # libp2p keeps room for its RPC framing inside the configured wire limit.
        assert 500 * 1024 <= transport.max_message_bytes <= 512 * 1024
        assert transport.connected_peers() == []
