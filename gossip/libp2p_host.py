"""Construction of the libp2p host and its GossipSub routers for `gossip.libp2p`.

One job: build, in the trio thread, what `Libp2pTransport` runs; starting, stopping and
bridging stay in `gossip.libp2p`.

Invariants:
- Security is Noise only (no plaintext, secio or TLS offered), and the host key is the
  node's `Identity` (same Ed25519 seed): `new_swarm_host` raises `RuntimeError` if the
  host's peer id differs from `identity.peer_id`.
- Every py-libp2p internal patched by `gossip.libp2p*` is checked
  (`gossip.libp2p_selfcheck`) before any is patched; the swarm's auto-connector is
  turned off and the inbound slots installed (`gossip.libp2p_inbound`) before
  `host.run` could start or listen (re-dials are `gossip.libp2p_dialer`'s).
- GossipSub offers meshsub 1.2, 1.1, 1.0 (newest first) with exactly the config's degree
  (low `max(1, degree - 2)`, high `2 * degree`) and heartbeat: adaptive gossip is off.
- Nothing is dropped by library defaults: the per-forwarder spam limit is ours
  (`gossip.libp2p_patches.FORWARDER_RATE_PER_S`, counted), the message cache is
  bounded by `config.max_queued_bytes`, inbound RPCs may reach
  `config.max_message_bytes + _INBOUND_SLACK_BYTES`, and outbound RPC size and per-peer
  queued bytes are the caller's bounds.
- Nothing here starts a service or listens: the caller starts pubsub and gossipsub
  before `host.run` (the other order crashes on the first dial).
"""

from __future__ import annotations

from collections.abc import Callable

import multiaddr
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from gossip.libp2p_dialer import disable_auto_connector, quiet_dial_failures
from gossip.libp2p_inbound import InboundHandler, InboundSlots, install_inbound_slots
from gossip.libp2p_patches import SwarmGossipSub, SwarmPubsub
from gossip.libp2p_records import cache_sender_records, keep_rpcs_with_older_records
from gossip.libp2p_refusals import Refusals
from gossip.libp2p_selfcheck import check_libp2p_internals
from gossip.peer_exchange import connection_limits
from swarm.config.network import Libp2pTransportConfig
from swarm.identity import Identity

__all__ = ["new_routers", "new_swarm_host"]

_INBOUND_SLACK_BYTES = 64 * 1024
"""Accepted on top of `config.max_message_bytes` from peers whose framing differs."""
_SPAM_LIMIT_PER_S = 100_000.0
"""The library's per-forwarder-per-topic limit (its default 10/s silently drops bulk
traffic). `SwarmGossipSub._check_spam_protection` replaces the check that reads it with a
counted token bucket; the value stays out of the way should the library read it
elsewhere."""


def new_swarm_host(
    config: Libp2pTransportConfig, identity: Identity, listen: multiaddr.Multiaddr
) -> tuple[IHost, InboundHandler]:
    """A Noise-only host keyed by `identity`, not yet running: its internals checked,
    then its auto-connector off, inbound slots installed (their handler returned) and
    the dialer and sender-record patches applied."""
    key_pair = create_new_key_pair(identity.seed)
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    host = new_host(
        key_pair=key_pair,
        sec_opt={TProtocol(NOISE_PROTOCOL_ID): noise},
        listen_addrs=[listen],
        enable_mDNS=config.mdns,
        connection_config=connection_limits(config),
    )
    if host.get_id().to_base58() != identity.peer_id:
        raise RuntimeError("libp2p host id differs from the node identity")
    # Every library internal patched by gossip.libp2p*, checked before any is (fails
    # loudly, naming the installed libp2p and its pin: gossip.libp2p_selfcheck).
    check_libp2p_internals(host, nat=config.nat_traversal)
    disable_auto_connector(host.get_network())  # before host.run starts it
    inbound = install_inbound_slots(  # before host.run listens
        host.get_network(),
        InboundSlots(
            config.max_peers,
            per_ip=config.max_inbound_per_ip,
            per_subnet=config.max_inbound_per_subnet,
        ),
    )
    quiet_dial_failures()
    cache_sender_records()
    keep_rpcs_with_older_records()
    return host, inbound


def new_routers(
    host: IHost,
    config: Libp2pTransportConfig,
    *,
    refusals: Refusals,
    sink: Callable[[str, bytes, bytes], None],
    max_rpc_bytes: int,
    max_outbound_bytes: int,
) -> tuple[SwarmPubsub, SwarmGossipSub]:
    """Pubsub and GossipSub for `host` (services not started); accepted messages go
    to `sink(topic, data, from_id)` in the trio thread."""
    degree = config.degree
    gossipsub = SwarmGossipSub(
        protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=degree,
        degree_low=max(1, degree - 2),
        degree_high=2 * degree,
        heartbeat_interval=config.heartbeat_interval_s,  # type: ignore[arg-type]
        adaptive_gossip_enabled=False,
        max_messages_per_topic_per_second=_SPAM_LIMIT_PER_S,
        mcache_max_bytes=config.max_queued_bytes,
        refusals=refusals,
    )
    pubsub = SwarmPubsub(
        host,
        gossipsub,
        sink=sink,
        max_inbound_rpc_size=config.max_message_bytes + _INBOUND_SLACK_BYTES,
        max_rpc_bytes=max_rpc_bytes,
        max_queued_bytes=max_outbound_bytes,
        refusals=refusals,
    )
    return pubsub, gossipsub
