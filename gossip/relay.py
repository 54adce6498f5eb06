"""What this node serves as a circuit relay (`relay = true`): to whom, and how much.

Invariants:
- Slots and circuits go to members of this node's swarm only (`member`: subscribed to one
  of its GossipSub topics); strangers are refused (`relay_refused_stranger`; issue 31:
  anyone could reserve and push 64 MiB through).
- What each peer pushes through this relay, over all its circuits, is bounded by a byte
  budget (`RELAY_PEER_BURST_BYTES`, then `RELAY_PEER_BYTES_PER_S`); a circuit whose
  source is over it is reset (`relay_budget_exceeded`).
- A slot is freed when its peer is no longer connected (`relay_reservations_released`;
  the library keeps it until it expires, an hour).
- Each hook into the library (`_handle_connect`, `_send_status`, `_read_stream_with_retry`,
  `can_accept_reservation`, `_is_peer_connected`, `_reservations`) is checked when the
  transport starts (`gossip.libp2p_selfcheck.check_nat`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits, RelayResourceManager

from gossip.libp2p_selfcheck import check_instance
from swarm.bounded import BoundedDict

log = logging.getLogger("gossip.libp2p")

RELAY_LIMITS = RelayLimits(duration=3600, data=1 << 30, max_circuit_conns=8, max_reservations=64)
"""What a relay grants: 64 slots (one per peer); per slot, 8 circuits at once, each of at
most 1 GiB and 1 h."""
RELAY_PEER_BYTES_PER_S = 128 << 10
RELAY_PEER_BURST_BYTES = 64 << 20
"""What one peer may push through this relay over all its circuits: 64 MiB at once, then
128 KiB/s (~450 MiB an hour). A real-model node whose every message goes through a relay
sends about 120 MiB an hour (LoRA deltas every 2 steps, rollouts every round); a circuit
whose source is over budget is reset and counted (`relay_budget_exceeded`)."""


class ByteBudgets:
    """A token bucket of bytes per peer: `burst` to start, refilled at `per_s`; at most
    `max_peers` remembered (the least recently charged forgotten: it comes back full,
    which only the relay's own slot and membership checks bound)."""

    def __init__(self, per_s: float, burst: float, max_peers: int = 1024) -> None:
        self.per_s, self.burst = per_s, burst
        self._buckets: BoundedDict[str, tuple[float, float]] = BoundedDict(max_peers)

    def take(self, peer: str, nbytes: int, now: float) -> bool:
        """Charge `nbytes` to `peer` at time `now`; False (nothing charged) if over budget."""
        tokens, last = self._buckets.get(peer, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - last) * self.per_s)
        if nbytes > tokens:
            self._buckets[peer] = (tokens, now)
            return False
        self._buckets[peer] = (tokens - nbytes, now)
        return True


Member = Callable[[ID], bool]
"""Whether a connected peer belongs to this node's swarm (see the module docstring)."""


class SwarmRelayResources(RelayResourceManager):
    """The library's reservation book, granting new slots only to members."""

    def __init__(self, limits: RelayLimits, host: IHost, member: Member, counts: dict) -> None:
        super().__init__(limits, host)
        self._member, self._counts = member, counts

    def can_accept_reservation(self, peer_id: ID) -> bool:
        if not self._member(peer_id):
            self._counts["relay_refused_stranger"] += 1
            log.debug("relay: reservation refused to %s (not a peer of this swarm)", peer_id)
            return False
        self.release_departed()
        return super().can_accept_reservation(peer_id)

    def release_departed(self) -> None:
        """Free the slots of peers no longer connected (the library keeps a slot until it
        expires, an hour: 64 identities connecting once each filled the relay). With the
        inbound bounds per IP and /24 (`gossip.libp2p_inbound`), one host holds at most
        as many slots as it may hold connections."""
        for peer in [p for p in self._reservations if not self._is_peer_connected(p)]:
            del self._reservations[peer]
            self._counts["relay_reservations_released"] += 1


class SwarmCircuitRelay(CircuitV2Protocol):
    """Circuit relay v2 whose circuits only members may open (the destination holds a
    slot, so it is a member already)."""

    def __init__(self, host: IHost, *, allow_hop: bool, member: Member, counts: dict) -> None:
        super().__init__(host, limits=RELAY_LIMITS, allow_hop=allow_hop)
        check_instance(self, [("resource_manager", RelayResourceManager)], "gossip/relay.py")
        self.resource_manager = SwarmRelayResources(RELAY_LIMITS, host, member, counts)
        self._member, self._counts = member, counts
        self.budgets = ByteBudgets(RELAY_PEER_BYTES_PER_S, RELAY_PEER_BURST_BYTES)

    async def _read_stream_with_retry(self, stream: INetStream, *args: Any) -> bytes | None:
        """The library's read of a circuit's data (its only caller), charged to the peer
        that sent the bytes; over that peer's budget the circuit is reset instead."""
        data = await super()._read_stream_with_retry(stream, *args)
        if data:
            peer = stream.muxed_conn.peer_id
            if not self.budgets.take(peer.to_base58(), len(data), time.monotonic()):
                self._counts["relay_budget_exceeded"] += 1
                log.info("relay: circuit from %s reset (over its byte budget)", peer)
                await stream.reset()
                return None  # the library ends the circuit as when its source closes
        return data

    async def _handle_connect(self, stream: INetStream, msg: Any) -> None:
        source = stream.muxed_conn.peer_id
        if not self._member(source):
            self._counts["relay_refused_stranger"] += 1
            await self._send_status(stream, StatusCode.PERMISSION_DENIED, "not a swarm peer")
            await stream.reset()
            return
        await super()._handle_connect(stream, msg)
