"""GossipSub's validation before forwarding: the gossip layer's checks, asked by our
pubsub before the library forwards a message (py-libp2p 0.8.1 forwards every message that
is new and validly signed).

Invariants:
- A message forwarded by, or originating from, a peer the gate says is ignored is
  refused before any check (`ignored_forwarder`, reported as `ignored_peer` against the
  ignored one).
- Otherwise a message whose GossipSub signature holds is shown to `ForwardGate.check`;
  one it refuses is marked seen (other copies are refused without a second check; safe:
  its origin signed this origin and seqno itself), neither forwarded nor delivered,
  counted (`not_forwarded`) and reported to the gate with the forwarder.
- The envelope's signature the gate verified is not verified again by the gossip layer
  (the transport marks what it delivers `signature_checked`).
- Its GossipSub signature is verified here, and a second time by the library when the
  gate passes it (the price of not reaching further into the library's `push_msg`).
- Marking seen calls the library's private `Pubsub._mark_msg_seen`, checked when the
  transport starts (`gossip.libp2p_selfcheck`).
"""

from __future__ import annotations

from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import signature_validator

from swarm.transport import ForwardGate


def refused_by_gate(
    pubsub: Any, gate: ForwardGate, msg_forwarder: ID, msg: rpc_pb2.Message
) -> bool:
    """True if `gate` refused `msg`, new to `pubsub` (a `SwarmPubsub`): counted in its
    refusals, reported to the gate, marked seen. Unsigned and badly signed messages are
    left to the library (which refuses them, and `SwarmPubsub.push_msg` counts them)."""
    forwarder = msg_forwarder.to_base58()
    try:
        origin = ID(msg.from_id).to_base58()
    except Exception:  # noqa: BLE001 - a hostile id: the library refuses it
        return False
    ignored = next((p for p in (forwarder, origin) if gate.ignored(p)), None)
    if ignored is not None:
        what = "forwarded while ignored" if ignored == forwarder else f"from ignored {origin}"
        pubsub.refusals.add("ignored_forwarder", forwarder, what)
        gate.refused(ignored, "ignored_peer")
        return True
    if not msg.signature:
        return False
    try:
        signed = signature_validator(msg)
    except Exception:  # noqa: BLE001 - a hostile key or id the validator chokes on
        signed = False
    if not signed:
        return False
    topic = msg.topicIDs[0] if len(msg.topicIDs) == 1 else ""
    reason = gate.check(topic, msg.data, origin) if topic else "wrong_topic"
    if reason is None:
        return False
    pubsub._mark_msg_seen(msg)
    pubsub.refusals.add(
        "not_forwarded", forwarder, f"message from {origin} refused before forwarding: {reason}"
    )
    gate.refused(forwarder, reason)
    return True
