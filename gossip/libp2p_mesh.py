"""GossipSub mesh pruning that keeps the peers that deliver (py-libp2p 0.8.1 prunes at
random above `degree_high`, each pruned peer backing off 60 s, so identities joining a
topic could push an honest peer out of the mesh for a minute or two: issue 31, 59-118 s).

Invariants:
- Above `degree_high`, the mesh peers pruned are those that handed us the fewest new,
  valid messages lately (`DecayingCounts`, half-life `DELIVERY_HALF_LIFE_S`; a new
  message counts for the peer that delivered it first), ties broken by keeping the
  peers in the mesh longest.
- Bounded: at most `_COUNTED_PEERS` peers counted and `_MESH_TENURE_KEYS` mesh tenures
  kept; a peer that leaves is forgotten.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from swarm.bounded import BoundedDict

DELIVERY_HALF_LIFE_S = 120.0
_MESH_TENURE_KEYS = 4096
_COUNTED_PEERS = 4096


class DecayingCounts:
    """Counts per key that halve every `half_life_s`, for at most `max_keys` keys (the
    least recently counted key leaves first). Pure bookkeeping; time is passed in."""

    def __init__(self, half_life_s: float, max_keys: int) -> None:
        self.half_life_s, self.max_keys = half_life_s, max_keys
        self._counts: BoundedDict[str, tuple[float, float]] = BoundedDict(max_keys)

    def value(self, key: str, now: float) -> float:
        count, at = self._counts.get(key, (0.0, now))
        return count * 0.5 ** (max(0.0, now - at) / self.half_life_s)

    def note(self, key: str, now: float, amount: float = 1.0) -> None:
        self._counts[key] = (self.value(key, now) + amount, now)

    def forget(self, key: str) -> None:
        self._counts.pop(key, None)


class DeliveryRankedPruning:
    """A mixin for `GossipSub` (list it first): see the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._deliveries = DecayingCounts(DELIVERY_HALF_LIFE_S, _COUNTED_PEERS)
        """Per forwarder: new, valid messages it handed us first (decaying)."""
        self._mesh_since: BoundedDict[tuple[ID, str], int] = BoundedDict(
            _MESH_TENURE_KEYS, fifo=True
        )
        """When each (peer, topic) first joined our mesh, as a count of mesh joins."""
        self._mesh_order = itertools.count()

    async def publish(self, msg_forwarder: ID, pubsub_msg: rpc_pb2.Message) -> None:
        """The library's publish (forward), after noting a first delivery by a peer."""
        if self.pubsub is not None and msg_forwarder != self.pubsub.my_id:
            self._deliveries.note(msg_forwarder.to_base58(), time.monotonic())
        await super().publish(msg_forwarder, pubsub_msg)

    def _select_peers_for_pruning(self, topic: str, num_to_prune: int) -> list[ID]:
        """Prune the mesh peers that delivered the fewest new, valid messages lately
        (ties: the newest in the mesh), never at random: the library's random choice let
        identities joining a topic push an honest peer out of the mesh, for a prune
        backoff of 60 s (issue 31)."""
        mesh = list(self.mesh.get(topic, ()))
        if num_to_prune <= 0 or not mesh:
            return []
        now, newest = time.monotonic(), next(self._mesh_order)

        def keep_first(peer: ID) -> tuple[float, int]:
            since = self._mesh_since.get((peer, topic), newest)
            return (-self._deliveries.value(peer.to_base58(), now), since)

        return sorted(mesh, key=keep_first)[len(mesh) - num_to_prune :]

    def _notify_mesh_peer_added(self, peer_id: ID, topic: str) -> None:
        self._mesh_since.setdefault((peer_id, topic), next(self._mesh_order))
        super()._notify_mesh_peer_added(peer_id, topic)

    def remove_peer(self, peer_id: ID) -> None:
        for key in [k for k in self._mesh_since if k[0] == peer_id]:
            del self._mesh_since[key]
        self._deliveries.forget(peer_id.to_base58())
        super().remove_peer(peer_id)
