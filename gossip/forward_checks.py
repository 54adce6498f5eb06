"""The checks a message must pass before a node forwards it to other peers: those that
need no state (what a node has seen, its rate limits and re-scoring come after, on the
node's own loop).

Invariants:
- Pure and thread-safe: `EnvelopeChecks.refusal` reads only what it was built with, so a
  transport may call it from its own thread (`swarm.transport.ForwardGate`).
- The same checks and reasons as `gossip.layer`'s receive steps 1-3 and 7 (size,
  structure, version, kind, signature, swarm; signer = the transport's authenticated
  origin; a whole envelope within `max_envelope_bytes`; the topic's kind, chunks on any
  topic).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.codec import Limits
from swarm.envelope import decode_envelope
from swarm.errors import WireError
from swarm.messages import Chunk, DeltaPacket, Hello, RolloutBatch
from swarm.transport import deltas_topic, peers_topic, rollouts_topic


@dataclass(frozen=True)
class EnvelopeChecks:
    swarm_id: str
    wire_limits: Limits
    max_envelope_bytes: int

    def refusal(self, topic: str, data: bytes, origin: str) -> str | None:
        """None if a peer's message may be forwarded, else the reason to refuse it."""
        try:
            envelope = decode_envelope(data, self.wire_limits, self.swarm_id)
        except WireError as refused:
            return refused.reason
        if envelope.sender != origin:
            return "sender_mismatch"
        if envelope.kind != Chunk.KIND and len(data) > self.max_envelope_bytes:
            return "oversize"
        kind = self.kind_of_topic(topic)
        if kind is not None and envelope.kind not in (kind, Chunk.KIND):
            return "wrong_topic"
        return None

    def kind_of_topic(self, topic: str) -> str | None:
        """The envelope kind a topic of this swarm carries (None: not one of ours)."""
        if topic == peers_topic(self.swarm_id):
            return Hello.KIND
        if topic == rollouts_topic(self.swarm_id):
            return RolloutBatch.KIND
        if topic.startswith(deltas_topic(self.swarm_id, "")):
            return DeltaPacket.KIND
        return None
