"""The seen-message cache: refuses duplicates and replays of authenticated envelopes.

An envelope is identified twice: by `(sender, seq)` and by `(sender, digest)`, the digest
of its content (the sha256 of its signing input, `Envelope.signing_digest`, so the same
signed content is one message however it was encoded; for a chunked message, the
content hash every chunk names). Either identity already seen makes it a duplicate.
Digests are kept per sender because a chunked message's digest is its signer's word,
not recomputed (`gossip.layer`): a signer naming another's digest marks only its own.

Invariants:
- Memory is bounded: at most `capacity` (sender, seq) pairs, `capacity` content hashes
  and `max_senders` per-sender floors; the oldest entries are forgotten first (FIFO).
- Forgetting a pair never reopens it: evicting `(sender, seq)` raises that sender's
  *floor* to at least `seq`, and any seq at or below a sender's floor counts as seen.
  So a replay older than everything remembered is still refused, as long as the
  sender's floor is kept (a flood of new identities can evict floors; the swarm-round
  staleness rule of the node is the second line against such old replays).
- `contains` never mutates; only `add` does, so a refused message leaves no trace.
- The floor is for envelopes anyone can replay. The envelope inside a chunk set is
  checked with `use_floor=False`: its seq precedes its own chunks' seqs, which a long
  set may already have pushed out of the cache (raising the floor past it), and only
  its signer can wrap it in fresh chunks (replayed chunks hit the floor themselves).
"""

from __future__ import annotations

from swarm.bounded import BoundedDict


class SeenCache:
    """Bounded memory of accepted envelopes by (sender, seq) and (sender, content hash)."""

    def __init__(self, capacity: int, max_senders: int = 4096) -> None:
        if capacity < 1 or max_senders < 1:
            raise ValueError("capacity and max_senders must be >= 1")
        self.capacity = capacity
        self.max_senders = max_senders
        self._pairs: BoundedDict[tuple[str, int], None] = BoundedDict(capacity, fifo=True)
        self._hashes: BoundedDict[tuple[str, bytes], None] = BoundedDict(capacity, fifo=True)
        self._floors: BoundedDict[str, int] = BoundedDict(max_senders)
        """Per sender; the least recently raised floor leaves first."""

    def __len__(self) -> int:
        return len(self._pairs)

    def floor(self, sender: str) -> int:
        """Highest forgotten seq of `sender` (-1 if none forgotten or floor evicted)."""
        return self._floors.get(sender, -1)

    def has_pair(self, sender: str, seq: int, *, use_floor: bool = True) -> bool:
        """Seen (sender, seq)? With `use_floor=False`, only pairs still remembered count."""
        return (sender, seq) in self._pairs or (use_floor and seq <= self.floor(sender))

    def has_hash(self, sender: str, content_hash: bytes) -> bool:
        return (sender, content_hash) in self._hashes

    def contains(self, sender: str, seq: int, content_hash: bytes) -> bool:
        return self.has_pair(sender, seq) or self.has_hash(sender, content_hash)

    def add(self, sender: str, seq: int, content_hash: bytes) -> None:
        evicted = self._pairs.set((sender, seq), None)
        if evicted is not None:
            (old_sender, old_seq), _ = evicted
            self.raise_floor(old_sender, old_seq)
        self._hashes[(sender, content_hash)] = None

    def raise_floor(self, sender: str, seq: int) -> None:
        """Count every seq of `sender` at or below `seq` as seen (on eviction, and after a
        restart from the highest seq each sender had reached)."""
        self._floors[sender] = max(seq, self._floors.get(sender, -1))
