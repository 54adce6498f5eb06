"""Counters of what the gossip layer accepted, refused and sent, for metrics and scoring.

Invariants:
- Every message the layer refuses is counted exactly once in `dropped`, under the
  `WireError.reason` (or gossip's own reason token) that refused it.
- `per_peer_drops` attributes a refusal only to a peer the refusal can honestly be
  blamed on: an authenticated envelope sender, or the peer id the transport itself
  authenticated (`via`). A claimed but unverified sender is never blamed, so nobody can
  frame an honest peer by forging its id on garbage.
- Reasons in `NOT_PENALIZED` (duplicates, our own echoes, our own memory limits, network
  loss, messages of peers already ignored) are counted globally but never per peer:
  honest peers cause them too, and an ignored peer is not blamed again for being ignored.
- `per_peer_drops` holds at most `max_peers` peers; the least recently blamed goes first.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from swarm.bounded import BoundedDict

NOT_PENALIZED = frozenset(
    {
        "own",
        "duplicate",
        "reassembly_full",
        "reassembly_expired",
        "reassembly_evicted",
        "ignored_peer",
    }
)
DEFAULT_MAX_PEERS = 1024
SNAPSHOT_TOP_PEERS = 10


class GossipCounters:
    """Accept/refuse/send counters of one gossip layer."""

    def __init__(self, max_peers: int = DEFAULT_MAX_PEERS) -> None:
        if max_peers < 1:
            raise ValueError("max_peers must be >= 1")
        self.max_peers = max_peers
        self.dropped: Counter[str] = Counter()
        """Refused wire messages (or reassembled envelopes / partial chunk sets) by reason."""
        self.received: Counter[str] = Counter()
        """Accepted messages by kind (`chunk` counts accepted chunk pieces)."""
        self.published: Counter[str] = Counter()
        """Messages this node published, by kind (one per `publish` call)."""
        self.publish_failed: Counter[str] = Counter()
        """Publishes the transport failed (network down, broker gone), by exception type."""
        self.bytes_in = 0
        """Wire bytes received, refused ones included."""
        self.bytes_out = 0
        """Wire bytes published, chunk envelopes included."""
        self.messages_in = 0
        """Wire messages received, refused ones included."""
        self.messages_out = 0
        """Wire messages published (each chunk counts)."""
        self.per_peer_drops: BoundedDict[str, Counter[str]] = BoundedDict(max_peers)
        """Refusals blamed on each peer (bounded, least recently blamed evicted first)."""

    def drop(self, reason: str, peer: str | None = None) -> None:
        """Count one refusal; blame `peer` unless the reason is one honest peers cause."""
        self.dropped[reason] += 1
        if peer is not None and reason not in NOT_PENALIZED:
            self.blame(peer, reason)

    def blame(self, peer: str, reason: str) -> None:
        """Record a refusal against `peer` (also the hook behind `Gossip.penalize`)."""
        counts = self.per_peer_drops.get(peer)
        if counts is None:
            counts = Counter()
        self.per_peer_drops[peer] = counts  # the newest; may push out the oldest
        counts[reason] += 1

    def peer_total(self, peer: str) -> int:
        counts = self.per_peer_drops.get(peer)
        return sum(counts.values()) if counts is not None else 0

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy for the metrics line (only the most blamed peers listed)."""
        top = sorted(
            self.per_peer_drops.items(), key=lambda item: (-sum(item[1].values()), item[0])
        )[:SNAPSHOT_TOP_PEERS]
        return {
            "dropped": dict(sorted(self.dropped.items())),
            "received": dict(sorted(self.received.items())),
            "published": dict(sorted(self.published.items())),
            "publish_failed": dict(sorted(self.publish_failed.items())),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
            "peers_blamed": len(self.per_peer_drops),
            "top_blamed": {peer: dict(sorted(c.items())) for peer, c in top},
        }
