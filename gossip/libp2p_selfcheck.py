"""Every py-libp2p internal that `gossip` reaches into, checked when a libp2p transport
starts (`check_libp2p_internals`, before the host listens).

Invariant: each private attribute read or replaced, each library hook overridden, each
module global swapped and each instance attribute relied on by `gossip.libp2p*` and
`gossip.nat` is listed here (with the module that uses it). On a libp2p whose internals
moved, the transport does not start: `swarm.internals.LibraryInternalsChanged` names the
installed version, the pin (`LIBP2P_PIN`, as in pyproject.toml) and every missing piece.
An overridden hook is checked three ways: the library's class still defines it, with the
parameters our override takes, and the library method that called it still does (by name,
in its code): an override of a renamed hook would otherwise never run.

Instance attributes set by constructors are checked on throwaway instances here
(`RpcQueue`, `MessageCache`, `DCUtRProtocol`) or, for the objects the transport builds
itself, where they are built (`check_instance`: the pubsub, the router, the relay).
What stays unchecked, and why: the library's log texts that `gossip.libp2p_dialer`
filters (a changed text only lets an ERROR line through).
"""

from __future__ import annotations

import dis
import hashlib
import inspect
from collections.abc import Sequence
from typing import Any

from libp2p.abc import IHost
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.network.auto_connector import AutoConnector
from libp2p.network.swarm import Swarm
from libp2p.peer.peerstore import PeerStore
from libp2p.pubsub import floodsub, gossipsub, pubsub, rpc_queue, utils
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.mcache import MessageCache
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.score import PeerScorer
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayResourceManager

from swarm.internals import Reaches

LIBRARY = "py-libp2p"
DISTRIBUTIONS = ("libp2p",)
PINNED_VERSION = "0.8.1"
LIBP2P_PIN = f"libp2p=={PINNED_VERSION}"
"""As in pyproject.toml: every reach below was written against this version."""

PINNED_SOURCES = {
    "_handle_inbound_connection": "0800fdf9770ed8e6",
    "_do_handle_inbound_connection": "c22fdfd5289f671c",
}
"""sha256 prefixes of the `Swarm` methods `gossip.libp2p_inbound` re-implements (in
0.8.1): any change to them, not only a missing name, needs a reading."""

_PATCHES = "gossip/libp2p_patches.py"
_QUEUES = "gossip/libp2p_queues.py"
_MESH = "gossip/libp2p_mesh.py"
_GATE = "gossip/libp2p_forward_gate.py"
_RECORDS = "gossip/libp2p_records.py"
_INBOUND = "gossip/libp2p_inbound.py"
_DIALER = "gossip/libp2p_dialer.py"
_NAT = "gossip/nat.py"
_RELAY = "gossip/relay.py"


def reaches() -> Reaches:
    return Reaches(LIBRARY, DISTRIBUTIONS, LIBP2P_PIN)


def _stores_item(function: Any, attribute: str) -> bool:
    """Whether `function` assigns an item of `self.<attribute>` (`x.attribute[k] = v`):
    a `dict` subclass there sees the store (`gossip.libp2p_queues.PeerQueues`)."""
    previous: list[dis.Instruction] = []
    for ins in dis.get_instructions(function):
        if ins.opname == "STORE_SUBSCR" and any(
            p.opname == "LOAD_ATTR" and p.argval == attribute for p in previous[-3:]
        ):
            return True
        previous.append(ins)
    return False


def check_pubsub(r: Reaches) -> None:
    """`SwarmPubsub`, `PeerQueues`, `BoundedPriorityQueue`, the forward gate."""
    r.attr(Pubsub, "push_msg", _PATCHES, params=("msg_forwarder", "msg"))
    r.attr(Pubsub, "_is_msg_seen", _PATCHES, params=("msg",))
    r.attr(Pubsub, "_mark_msg_seen", _GATE, params=("msg",))
    r.attr(Pubsub, "notify_subscriptions", _PATCHES, params=("publish_message",))
    r.calls(Pubsub, "push_msg", ("_is_msg_seen", "_mark_msg_seen", "notify_subscriptions"),
            _PATCHES)  # fmt: skip
    r.attr(Pubsub, "continuously_read_stream", _PATCHES, params=("stream",))
    r.attr(Pubsub, "write_msg", _PATCHES, params=("stream", "rpc_msg"))
    r.calls(Pubsub, "stream_handler", ("continuously_read_stream",), _PATCHES)
    r.calls(Pubsub, "_handle_new_peer", ("RpcQueue", "peer_queues"), _QUEUES)
    handle_new_peer = getattr(Pubsub, "_handle_new_peer", None)
    if handle_new_peer is not None and not _stores_item(handle_new_peer, "peer_queues"):
        r.problem("Pubsub._handle_new_peer no longer stores peer_queues[peer]", _QUEUES)
    r.calls(Pubsub, "_next_seqno", ("counter",), _PATCHES)
    # Each peer's outbound queue: its PriorityQueue `_queue` is swapped for a bounded one.
    queue = rpc_queue.RpcQueue()
    inner = r.attr(queue, "_queue", _QUEUES, kind=rpc_queue.PriorityQueue)
    r.attr(queue, "max_message_size", _QUEUES, kind=int)
    for method in ("push", "pop", "__len__"):
        r.calls(rpc_queue.RpcQueue, method, ("_queue",), _QUEUES)
    if inner is not None:
        r.attr(inner, "max_size", _QUEUES, kind=int)
    r.attr(rpc_queue.PriorityQueue, "push", _QUEUES, params=("rpc", "priority"))
    r.attr(rpc_queue.PriorityQueue, "pop", _QUEUES)


def check_router(r: Reaches) -> None:
    """`SwarmGossipSub`, `BoundedMessageCache` and `DeliveryRankedPruning`."""
    r.attr(GossipSub, "_check_spam_protection", _PATCHES, params=("peer_id", "msg"))
    r.attr(GossipSub, "_check_equivocation", _PATCHES, params=("msg",))
    r.calls(GossipSub, "publish", ("_check_spam_protection", "_check_equivocation", "mcache"),
            _PATCHES)  # fmt: skip
    r.attr(PeerScorer, "penalize_equivocation", _PATCHES, params=("peer", "amount"))
    r.attr(GossipSub, "_periodic_security_cleanup", _PATCHES)
    r.calls(GossipSub, "heartbeat", ("_periodic_security_cleanup",), _PATCHES)
    r.attr(GossipSub, "_select_peers_for_pruning", _MESH, params=("topic", "num_to_prune"))
    r.calls(GossipSub, "mesh_heartbeat", ("_select_peers_for_pruning",), _MESH)
    r.attr(GossipSub, "_notify_mesh_peer_added", _MESH, params=("peer_id", "topic"))
    r.calls(GossipSub, "join", ("_notify_mesh_peer_added",), _MESH)
    r.attr(GossipSub, "remove_peer", _MESH, params=("peer_id",))
    r.attr(GossipSub, "publish", _MESH, params=("msg_forwarder", "pubsub_msg"))
    cache = MessageCache(3, 5)
    r.attr(cache, "msgs", _PATCHES, kind=dict)
    r.attr(cache, "history", _PATCHES, kind=list)
    r.attr(cache, "window_size", _PATCHES, kind=int)
    r.attr(cache, "history_size", _PATCHES, kind=int)
    r.calls(MessageCache, "put", ("msgs", "history"), _PATCHES)
    r.calls(MessageCache, "shift", ("history",), _PATCHES)
    message = rpc_pb2.Message(from_id=b"\x00", seqno=b"\x00" * 8, data=b"", topicIDs=["t"])
    try:
        cache.put(message)
        entry = cache.history[0][0]
    except Exception as exc:  # noqa: BLE001 - any failure is the change reported
        r.problem(f"MessageCache.put/history changed ({exc!r})", _PATCHES)
    else:
        r.attr(entry, "mid", _PATCHES, kind=bytes)


def check_records(r: Reaches) -> None:
    """The module globals `gossip.libp2p_records` replaces."""
    for module in (pubsub, gossipsub):
        r.module_uses(module, "env_to_send_in_RPC", _RECORDS)
    for module in (pubsub, gossipsub, floodsub):
        r.module_uses(module, "maybe_consume_signed_record", _RECORDS)
    r.attr(utils, "maybe_consume_signed_record", _RECORDS)
    r.attr(PeerStore, "consume_peer_record", _RECORDS, params=("envelope", "ttl"))
    r.attr(PeerStore, "get_peer_record", _RECORDS, params=("peer_id",))


def check_swarm(r: Reaches, host: IHost | None) -> None:
    """The inbound path `gossip.libp2p_inbound` re-implements and the re-dialing
    `gossip.libp2p_dialer` turns off."""
    installed = r.version
    if installed != PINNED_VERSION:
        r.problem(f"the inbound connection path re-implemented is {PINNED_VERSION}'s", _INBOUND)
    for name, digest in PINNED_SOURCES.items():
        method = r.attr(Swarm, name, _INBOUND)
        if method is None:
            continue
        source = inspect.getsource(method)
        if hashlib.sha256(source.encode()).hexdigest()[:16] != digest:
            r.problem(f"Swarm.{name} changed (its source differs from {PINNED_VERSION}'s)",
                      _INBOUND)  # fmt: skip
    r.calls(Swarm, "listen", ("_handle_inbound_connection",), _INBOUND)
    r.attr(Swarm, "_build_remote_multiaddr", _INBOUND, params=("read_write_closer",))
    r.attr(Swarm, "upgrade_inbound_raw_conn", _INBOUND)
    r.attr(Swarm, "unblock_peer", _DIALER, params=("peer_id",))
    r.attr(AutoConnector, "run_background_task", _DIALER, params=("nursery",))
    r.attr(AutoConnector, "maybe_connect", _DIALER)
    r.calls(Swarm, "run", ("auto_connector",), _DIALER)
    if host is not None:
        network = host.get_network()
        connector = r.attr(network, "auto_connector", _DIALER, kind=AutoConnector)
        if connector is not None:
            r.attr(connector, "auto_connect_interval", _DIALER, kind=(int, float))
        r.attr(network, "retry_config", _DIALER)
        r.attr(network, "metric_send_channel", _INBOUND)


def check_nat(r: Reaches, host: IHost | None) -> None:
    """What `gossip.nat` overrides in AutoNAT, circuit relay v2 and DCUtR."""
    r.attr(AutoNATService, "_handle_request", _NAT,
           params=("request", "observed_ip", "is_relayed"))  # fmt: skip
    r.attr(AutoNATService, "_filter_by_observed_ip", _NAT, params=("addrs", "observed_ip"))
    r.attr(AutoNATService, "_try_dial", _NAT, params=("peer_id", "addrs"))
    r.calls(AutoNATService, "_handle_dial", ("_filter_by_observed_ip", "_try_dial"), _NAT)
    r.calls(AutoNATService, "__init__", ("handle_stream",), _NAT)
    r.attr(DCUtRProtocol, "_auto_drive_loop", _NAT)
    r.calls(DCUtRProtocol, "run", ("_auto_drive_loop",), _NAT)
    r.attr(DCUtRProtocol, "initiate_hole_punch", _NAT, params=("peer_id",))
    if host is not None:
        dcutr = DCUtRProtocol(host)
        r.attr(dcutr, "_in_progress", _NAT, kind=set)
        r.attr(dcutr, "_direct_connections", _NAT, kind=set)
    r.attr(CircuitV2Protocol, "_handle_connect", _RELAY, params=("stream", "msg"))
    r.attr(CircuitV2Protocol, "_read_stream_with_retry", _RELAY, params=("stream", "max_retries"))
    r.calls(CircuitV2Protocol, "_relay_data", ("_read_stream_with_retry",), _RELAY)
    r.calls(CircuitV2Protocol, "_handle_hop_stream", ("_handle_connect",), _RELAY)
    r.attr(CircuitV2Protocol, "_send_status", _RELAY, params=("stream", "code", "message"))
    r.calls(CircuitV2Protocol, "_handle_reserve", ("resource_manager", "can_accept_reservation"),
            _RELAY)  # fmt: skip
    r.attr(RelayResourceManager, "can_accept_reservation", _RELAY, params=("peer_id",))
    r.attr(RelayResourceManager, "_is_peer_connected", _RELAY, params=("peer_id",))
    r.calls(RelayResourceManager, "__init__", ("_reservations",), _RELAY)


def check_libp2p_internals(host: IHost | None = None, *, nat: bool = True) -> None:
    """Raise `LibraryInternalsChanged` unless every reach listed here is as the pinned
    version has it. `host`: the transport's new host (not yet running), for the checks
    on instances; `nat`: check `gossip.nat`'s reaches too (NAT traversal is on)."""
    r = reaches()
    check_pubsub(r)
    check_router(r)
    check_records(r)
    check_swarm(r, host)
    if nat:
        check_nat(r, host)
    r.raise_if_missing()


def check_instance(
    obj: Any, names: Sequence[tuple[str, type | tuple[type, ...] | None]], used_by: str
) -> None:
    """Raise unless `obj` (built by the library's constructor) has each attribute of
    `names` (of its kind, where given): for the objects the transport builds itself."""
    r = reaches()
    for name, kind in names:
        r.attr(obj, name, used_by, kind=kind)
    r.raise_if_missing()
