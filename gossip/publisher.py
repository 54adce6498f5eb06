"""The publish side of the gossip layer: sequence numbers, sealing, chunking, sending.

`Publisher` turns one `swarm.messages` payload into this node's signed envelope (or the
chunk envelopes that carry it) and hands the wire bytes to the transport; `gossip.layer`'s
`Gossip.publish` checks that it is started and delegates here.

Invariants:
- Sequence numbers of this node strictly increase across all its envelopes (chunks and
  the envelopes inside them included), from `first_seq` in [0, 2**63); `continue_after`
  only ever moves them forward; past `MAX_SEQ` sealing raises (`RuntimeError`).
- Every wire message sent is at most `transport.max_message_bytes`: anything larger is
  sent as chunks of `chunk_data_bytes` data each, sized with the exact overhead of a
  chunk envelope of this node and swarm (plus `CHUNK_SLACK`). A transport that leaves
  less than `MIN_CHUNK_DATA` per chunk is refused at construction (`ValueError`).
- An envelope over `max_envelope_bytes` is refused before anything is sent
  (`ValueError`), as are chunks offered for publishing and a `policy_version` that is
  not an int in [0, 2**63).
- `publish` never raises because of the network: a transport failure (`ConnectionError`,
  `OSError`, `TimeoutError`) is counted under `counters.publish_failed` by exception
  type, logged at most once per `PUBLISH_LOG_EVERY_S` per cause (time from the injected
  `Clock` only), and the rest of the message is dropped (0 is returned).
- Counters (`bytes_out`, `messages_out`, `published`) count only what the transport took.
"""

from __future__ import annotations

import logging

from gossip.chunking import MAX_CHUNKS, split
from gossip.counters import GossipCounters
from swarm.clock import Clock
from swarm.envelope import Envelope, seal_parts
from swarm.identity import Identity
from swarm.messages import Chunk, Payload, encode_payload, payload_parts
from swarm.transport import Transport

logger = logging.getLogger(__name__)

CHUNK_SLACK = 32
"""Bytes added to the measured chunk-envelope overhead (msgpack headers grow with data)."""
MIN_CHUNK_DATA = 64
"""A transport whose messages cannot carry this much chunk data is refused."""
MAX_SEQ = 2**63 - 1
PUBLISH_LOG_EVERY_S = 60.0
"""A repeated publish failure of the same cause is logged at most this often."""


class Publisher:
    """Seals and sends this node's payloads over `transport` (module docstring)."""

    def __init__(
        self,
        transport: Transport,
        identity: Identity,
        swarm_id: str,
        max_envelope_bytes: int,
        counters: GossipCounters,
        clock: Clock,
        first_seq: int,
    ) -> None:
        if not 0 <= first_seq <= MAX_SEQ:
            raise ValueError("initial_seq must be in [0, 2**63)")
        self.transport = transport
        self.identity = identity
        self.swarm_id = swarm_id
        self.max_envelope_bytes = max_envelope_bytes
        self.counters = counters
        self.clock = clock
        self._next_seq = first_seq
        self._logged: dict[str, float] = {}
        self.chunk_data_bytes = transport.max_message_bytes - self._chunk_overhead()
        """Data bytes per chunk, so that each chunk envelope fits the transport."""
        if self.chunk_data_bytes < MIN_CHUNK_DATA:
            raise ValueError(
                f"transport max_message_bytes {transport.max_message_bytes} leaves no room "
                "for chunk data"
            )

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def continue_after(self, seq: int) -> None:
        """Send only seqs above `seq` from now on; a no-op when already past it."""
        if not 0 <= seq < MAX_SEQ:
            raise ValueError(f"seq {seq} out of range")
        self._next_seq = max(self._next_seq, seq + 1)

    async def publish(self, topic: str, message: Payload, policy_version: int) -> int:
        """Sign and send `message` (chunked if too large); return the wire bytes sent
        (0 if the transport failed: counted and logged, never raised)."""
        if isinstance(message, Chunk):
            raise ValueError("chunks are made by the gossip layer, not published directly")
        version = policy_version
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_SEQ:
            raise ValueError("policy_version must be an int in [0, 2**63)")
        data, digest = self._seal_parts(message.KIND, version, payload_parts(message))
        if len(data) > self.max_envelope_bytes:
            raise ValueError(
                f"{message.KIND} envelope of {len(data)} bytes > max_envelope_bytes "
                f"{self.max_envelope_bytes}; peers would refuse it"
            )
        if len(data) <= self.transport.max_message_bytes:
            wires = [data]
        else:
            wires = [
                self._seal_parts(Chunk.KIND, version, chunk.payload_parts())[0]
                for chunk in split(data, self.chunk_data_bytes, digest, views=True)
            ]
        sent = 0
        for wire in wires:
            try:
                await self.transport.publish(topic, wire)
            except (ConnectionError, OSError, TimeoutError) as exc:
                self._publish_failed(message.KIND, exc)
                return 0
            sent += len(wire)
            self.counters.bytes_out += len(wire)
            self.counters.messages_out += 1
        self.counters.published[message.KIND] += 1
        return sent

    def _publish_failed(self, kind: str, exc: BaseException) -> None:
        cause = type(exc).__name__
        self.counters.publish_failed[cause] += 1
        now = self.clock.now()
        last = self._logged.get(cause)
        if last is None or now - last >= PUBLISH_LOG_EVERY_S:
            self._logged[cause] = now
            logger.warning(
                "gossip: publishing a %s failed (%s: %s); dropped, %d %s failure(s) so far; "
                "the node goes on and publishes again next round",
                kind, cause, exc, self.counters.publish_failed[cause], cause,
            )  # fmt: skip

    def _take_seq(self) -> int:
        seq = self._next_seq
        if seq > MAX_SEQ:
            raise RuntimeError("sequence numbers exhausted")
        self._next_seq += 1
        return seq

    def _seal_parts(
        self, kind: str, policy_version: int, parts: tuple[bytes | memoryview, ...]
    ) -> tuple[bytes, bytes]:
        """(wire bytes, signing digest) of our next envelope of `kind` whose payload is
        `b"".join(parts)`, the parts copied once (large tensors, chunks' data: views)."""
        return seal_parts(
            self.identity,
            kind=kind,
            swarm_id=self.swarm_id,
            seq=self._take_seq(),
            policy_version=policy_version,
            payload_parts=parts,
        )

    def _chunk_overhead(self) -> int:
        """Exact size of a chunk envelope of this node with empty data, plus slack."""
        probe = Chunk(b"\0" * 32, MAX_CHUNKS - 1, MAX_CHUNKS, 1 << 34, b"")
        envelope = Envelope(
            0, Chunk.KIND, self.swarm_id, self.identity.peer_id, MAX_SEQ, MAX_SEQ,
            encode_payload(probe), b"\0" * 64,
        )  # fmt: skip
        return len(envelope.encode()) + CHUNK_SLACK
