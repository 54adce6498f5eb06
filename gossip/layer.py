"""The gossip layer: signed, deduplicated, rate-limited, chunked messages over a Transport.

`Gossip` turns `swarm.messages` payloads into signed envelopes on publish, and on
receive turns transport bytes back into payloads that are authentic, fresh to this node
and within every bound, or counts why not.

Receive pipeline for each transport message (first failure wins, counted once under
its reason in `counters.dropped`):
0. `ignored_peer` if the transport authenticated a peer (`via`) that is being ignored
   (see `gossip.scoring`): dropped before any decoding.
1. `decode_envelope` with wire limits (transport `max_message_bytes` + `WIRE_MARGIN`):
   size, structure, version, kind, signature, then swarm id (`oversize`, `malformed`,
   `bad_version`, `unknown_kind`, `bad_sender`, `bad_signature`, `wrong_swarm`: the
   last is blamed on the verified signer). The signature is not verified a second time
   for a message whose transport's forward gate verified it (`signature_checked`).
2. `sender_mismatch` if the transport authenticated a peer (`via`) other than the signer;
   `ignored_peer` if the (claimed) signer is being ignored, checked before the
   signature so that an ignored peer's flood costs no verification.
3. `own` for our own messages echoed back (counted, not an error); then a whole
   (unchunked) envelope must fit `config.max_envelope_bytes` (`oversize`).
4. `duplicate` if its (sender, seq) or the digest of what it signed was accepted before.
5. `rate_limited` by the sender's token bucket (chunks count one each).
6. Chunks (kind `chunk`): payload decoded with wire limits, `duplicate` if the envelope
   its `inner_digest` names was already accepted, then the `Reassembler`'s checks
   (`oversize`, `bad_chunk`, `reassembly_full`; a sender's older partial sets making
   room for its newer one count as `reassembly_evicted`). Once complete, the inner
   envelope is decoded with `config.max_envelope_bytes` limits, must come from the
   chunks' signer (`sender_mismatch`), must not itself be a chunk (`nested_chunk`), and
   goes through the duplicate check of step 4 again. Its own signature is not verified:
   the chunks' signatures already cover every byte of it, from the same signer, so its
   digest is the `inner_digest` the chunks name (that signer's word, and duplicates are
   keyed per sender, so naming another signer's digest marks nothing of theirs). A large
   message's bytes are hashed once on arrival (its chunks' signatures) and twice when
   sent (its own signature, its chunks').
7. The payload is decoded by kind (`bad_payload`, `malformed`, `oversize`), and on a
   topic of this swarm (`swarm.transport` names) its kind must be the topic's kind, a
   delta's family the topic's family (`wrong_topic`).

Before forwarding. A transport that relays peers' messages (GossipSub) asks
`forward_gate()` first, in its own thread, for each message new to it: step 1, step 2's
`sender_mismatch` against the transport's authenticated origin, step 3's size bound and
the topic's kind (chunks pass on any topic) are checked there, so a message failing
them is neither forwarded to other peers nor delivered. Each such refusal is counted
here under its reason and blamed on the connected peer that handed it over (the
forwarder, which a flood signed with a fresh key per message cannot change); while that
peer is ignored the transport refuses what it forwards unread (`ignored_peer`). What
the transport itself refuses from a connected peer (unsigned or badly signed GossipSub
messages, oversize RPCs) is blamed on that peer here too (`ForwardGate.blame`).

Invariants:
- `receive` returns only messages that passed every step, and yields to the event loop
  before each message it judges (one message's work is the longest it blocks the
  loop, never a whole backlog's); it never raises because of anything a peer sent (an
  unexpected error in a decoder is logged and counted as `internal_error` rather than
  letting one peer crash every node).
- Nothing here judges staleness: the node reads `Received.envelope.policy_version`
  (the sender's claim about itself) and applies `swarm.staleness` itself.
- Publishing lives in `gossip.publisher` (its invariants, restated here in short).
- `publish` never raises because of the network: a transport failure (`ConnectionError`,
  `OSError`, `TimeoutError`) is counted under `publish_failed` by exception type, logged
  once per cause (again only after `PUBLISH_LOG_EVERY_S` of the same cause), and the
  message is dropped (GossipSub and MQTT are best-effort; the next round publishes
  anew). Errors that are our own bugs (`ValueError`, `RuntimeError`) still raise.
- Time comes only from the injected `Clock` (rate limits, reassembly expiry).
- Every wire message this layer publishes is at most `transport.max_message_bytes`:
  anything larger is sent as chunks whose envelopes are sized with the exact overhead
  of a chunk envelope of this node and swarm. Envelopes over `max_envelope_bytes` are
  refused at publish (`ValueError`), since peers would refuse them.
- Sequence numbers of this node strictly increase across all its envelopes (chunks and
  the envelopes inside them included). They start at `initial_seq`, by default the
  wall-clock time in microseconds, so a restarted node does not reuse seqs that peers
  still remember (the only use of wall time here; simnet passes `initial_seq`), and
  `continue_after` moves them past a checkpoint's reservation (a clock that stepped back).
- All state that peers can grow is bounded: seen cache, rate-limit buckets, partial
  chunk sets, per-peer drop counts, peer scores.
- Peer scores (`scores`) are moved by every refusal blamed on an authenticated peer
  (weights in `gossip.scoring.WEIGHTS`) and by the node's `penalize`/`credit`; an ignored
  peer's partial chunk sets are discarded when its ignore period starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from gossip.chunking import Reassembler, sha256
from gossip.counters import GossipCounters
from gossip.forward_checks import EnvelopeChecks
from gossip.loop_mailbox import LoopMailbox
from gossip.publisher import CHUNK_SLACK as CHUNK_SLACK  # re-exported, as are the next two
from gossip.publisher import MAX_SEQ, Publisher
from gossip.publisher import MIN_CHUNK_DATA as MIN_CHUNK_DATA
from gossip.publisher import PUBLISH_LOG_EVERY_S as PUBLISH_LOG_EVERY_S
from gossip.ratelimit import STALL_GRACE_S, RateLimiter
from gossip.scoring import PeerScores
from gossip.seen import SeenCache
from swarm.clock import Clock
from swarm.codec import Limits
from swarm.config.network import GossipConfig
from swarm.envelope import Envelope, decode_envelope, decode_vouched_envelope
from swarm.errors import WireError
from swarm.identity import Identity
from swarm.messages import (
    MAX_TEXT_CHARS,
    Chunk,
    DeltaPacket,
    Hello,
    Payload,
    RolloutBatch,
    decode_payload,
)
from swarm.transport import (
    ForwardGate,
    Transport,
    TransportMessage,
    deltas_topic,
    peers_topic,
    rollouts_topic,
)

logger = logging.getLogger(__name__)

WIRE_MARGIN = 1024
"""Slack over the transport's `max_message_bytes` tolerated on receive."""
_MAX_IGNORED_FORWARDERS = 4096
"""Ignored peers the transport's thread is told of (the newest ignore periods kept)."""
MAX_PAYLOAD_STR_BYTES = 4 * MAX_TEXT_CHARS
"""Longest msgpack str in a payload: a text field of MAX_TEXT_CHARS in worst-case UTF-8."""


def envelope_limits(max_bytes: int) -> Limits:
    """Limits for one encoded envelope of at most `max_bytes` (8 scalar fields)."""
    return Limits(
        max_message_bytes=max_bytes,
        max_str_len=1024,
        max_bin_len=max_bytes,
        max_array_len=16,
        max_map_len=16,
        max_depth=2,
    )


def payload_limits(max_bytes: int) -> Limits:
    """Limits for a payload inside an envelope of at most `max_bytes`."""
    return Limits(
        max_message_bytes=max_bytes,
        max_str_len=min(max_bytes, MAX_PAYLOAD_STR_BYTES),
        max_bin_len=max_bytes,
        max_array_len=4096,
        max_map_len=256,
        max_depth=8,
    )


@dataclass(frozen=True)
class Received:
    """One accepted message: authentic, not seen before, within every bound."""

    topic: str
    envelope: Envelope
    message: Payload
    size_bytes: int
    """Bytes of the accepted envelope (the reassembled one for a chunked message)."""


class _Blame:
    """Who a refusal may be blamed on, learned as the pipeline authenticates."""

    __slots__ = ("peer",)

    def __init__(self, peer: str | None) -> None:
        self.peer = peer


class Gossip:
    """Signed publish/receive of swarm payloads over any `Transport`.

    Owns the transport's lifecycle: `start` starts it, `stop` stops it.
    """

    def __init__(
        self,
        transport: Transport,
        identity: Identity,
        swarm_id: str,
        config: GossipConfig,
        clock: Clock,
        *,
        initial_seq: int | None = None,
    ) -> None:
        self.transport = transport
        self.identity = identity
        self.peer_id = identity.peer_id
        self.swarm_id = swarm_id
        self.config = config
        self.clock = clock
        self.counters = GossipCounters()
        seq = time.time_ns() // 1000 if initial_seq is None else initial_seq
        if not 0 <= seq <= MAX_SEQ:
            raise ValueError("initial_seq must be in [0, 2**63)")
        self._seen = SeenCache(config.seen_cache_size)
        self.scores = PeerScores(config.scoring, clock)
        self._limiter = RateLimiter(config.rate_limit_per_s, config.rate_burst, clock)
        self._stalled_s_logged = 0.0
        self._reassembly = Reassembler(
            max_pending_bytes=config.max_reassembly_bytes,
            max_message_bytes=config.max_envelope_bytes,
            timeout_s=config.reassembly_timeout_s,
        )
        wire_max = transport.max_message_bytes + WIRE_MARGIN
        self._wire_limits = envelope_limits(wire_max)
        self._wire_payload_limits = payload_limits(wire_max)
        self._inner_limits = envelope_limits(config.max_envelope_bytes)
        self._inner_payload_limits = payload_limits(config.max_envelope_bytes)
        self._publisher = Publisher(
            transport, identity, swarm_id, config.max_envelope_bytes, self.counters, clock, seq
        )
        self.chunk_data_bytes = self._publisher.chunk_data_bytes
        """Data bytes per chunk, so that each chunk envelope fits the transport."""
        self._topics: set[str] = set()
        self._ignored_until: dict[str, float] = {}
        """Ignored peers and when their period ends, for the transport's thread."""
        self._started = False

    # lifecycle -----------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._started

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    async def start(self) -> None:
        install = getattr(self.transport, "set_forward_gate", None)
        if install is not None:
            install(self.forward_gate(asyncio.get_running_loop()))
        await self.transport.start()
        self._started = True

    # validation before forwarding (runs in the transport's thread) ----------------------

    def forward_gate(self, loop: asyncio.AbstractEventLoop) -> ForwardGate:
        """The checks a relaying transport runs before forwarding (module docstring);
        refusals come back to `loop`'s thread to be counted and scored."""

        mailbox = LoopMailbox(loop)  # one loop wake-up per batch, not per refusal

        def refused(forwarder: str, reason: str) -> None:
            mailbox.post(self._forward_refused, forwarder, reason)

        def blame(peer: str, reason: str) -> None:
            mailbox.post(self._transport_refused, peer, reason)

        checks = EnvelopeChecks(self.swarm_id, self._wire_limits, self.config.max_envelope_bytes)
        return ForwardGate(checks.refusal, refused, self._forwarder_ignored, blame)

    def _forward_refused(self, forwarder: str, reason: str) -> None:
        self.counters.drop(reason)
        if reason != "ignored_peer":
            self.counters.blame(forwarder, reason)
            self._score_refusal(forwarder, reason)
        else:
            self.scores.note_ignored_message(forwarder)

    def _transport_refused(self, peer: str, reason: str) -> None:
        """Score what the transport refused from `peer` (counted in its stats, not here)."""
        self.counters.blame(peer, reason)
        self._score_refusal(peer, reason)

    def _forwarder_ignored(self, peer: str) -> bool:
        until = self._ignored_until.get(peer)
        return until is not None and self.clock.now() < until

    async def stop(self) -> None:
        self._started = False
        self._reassembly.clear()
        await self.transport.stop()

    def note_alive(self) -> None:
        """Call every `ALIVE_TICK_S` while running: a stall of this process is then not
        charged to the peers whose messages piled up meanwhile (`gossip.ratelimit`)."""
        self._limiter.note_alive()
        stalled = self._limiter.stalled_s - self._stalled_s_logged
        if stalled > 0:
            self._stalled_s_logged = self._limiter.stalled_s
            logger.warning(
                "this process did not run for %.1f s (stopped, suspended, starved of CPU, or "
                "busy in one long step): what peers sent meanwhile is taken at their "
                "sustained rate for the next %.0f s",
                stalled, STALL_GRACE_S,
            )  # fmt: skip

    async def subscribe(self, topic: str) -> None:
        await self.transport.subscribe(topic)
        self._topics.add(topic)

    # publishing ----------------------------------------------------------------------

    async def publish(self, topic: str, message: Payload, policy_version: int) -> int:
        """Sign and send `message` (chunked if too large); return the wire bytes sent
        (0 if the transport failed: counted and logged, never raised). `gossip.publisher`."""
        if not self._started:
            raise RuntimeError("gossip is not started")
        return await self._publisher.publish(topic, message, policy_version)

    # receiving -----------------------------------------------------------------------

    async def receive(self) -> Received:
        """Wait for the next accepted message; refused ones are counted and skipped."""
        while True:
            # A transport's inbox hands over queued messages without suspending, so a
            # backlog (a burst of chunks) would be judged back to back with the event
            # loop blocked throughout: give the other tasks a turn between messages.
            await asyncio.sleep(0)
            message = await self.transport.receive()
            self.expire_partials()
            received = self.accept(message)
            if received is not None:
                return received

    def accept(self, message: TransportMessage) -> Received | None:
        """Judge one transport message; None (and a counted reason) if refused."""
        data = message.data
        self.counters.messages_in += 1
        if isinstance(data, (bytes, bytearray, memoryview)):
            self.counters.bytes_in += len(data)
        blame = _Blame(message.via)
        try:
            return self._accept(message, blame)
        except WireError as exc:
            peer = blame.peer or exc.signer
            self.counters.drop(exc.reason, peer)
            if peer is not None:
                self._score_refusal(peer, exc.reason)
        except Exception:
            # A decoder bug must not let one peer's message crash every node: log it
            # loudly with its traceback and count it, never silently.
            logger.exception("gossip: internal error on a message (peer %s)", blame.peer)
            self.counters.drop("internal_error")
        return None

    def expire_partials(self) -> int:
        """Drop partial chunk sets older than the timeout; return how many."""
        expired = self._reassembly.expire(self.clock.now())
        if expired:
            self.counters.dropped["reassembly_expired"] += expired
        return expired

    def _accept(self, message: TransportMessage, blame: _Blame) -> Received | None:
        data = message.data
        if message.via is not None and self.scores.is_ignored(message.via):
            self.scores.note_ignored_message(message.via)
            raise WireError("ignored_peer", message.via)
        envelope = decode_envelope(
            data,
            self._wire_limits,
            self.swarm_id,
            self._refuse_unverified,
            signature_checked=message.signature_checked,  # by the forward gate, once
        )
        if message.via is not None and message.via != envelope.sender:
            raise WireError(
                "sender_mismatch", f"signed by {envelope.sender}, sent by {message.via}"
            )
        blame.peer = envelope.sender
        if envelope.sender == self.peer_id:
            raise WireError("own", "our own message echoed back")
        if envelope.kind != Chunk.KIND and len(data) > self.config.max_envelope_bytes:
            raise WireError("oversize", f"envelope of {len(data)} bytes")
        digest = envelope.signing_digest or sha256(bytes(data))  # b"": not from decode
        if self._seen.contains(envelope.sender, envelope.seq, digest):
            raise WireError("duplicate", f"seq {envelope.seq}")
        if not self._limiter.allow(envelope.sender):
            raise WireError("rate_limited", envelope.sender)
        self._seen.add(envelope.sender, envelope.seq, digest)
        if envelope.kind == Chunk.KIND:
            return self._accept_chunk(message.topic, envelope)
        return self._finish(message.topic, envelope, len(data), self._wire_payload_limits)

    def _refuse_unverified(self, claimed_sender: str) -> bool:
        """Drop a message claiming an ignored sender before paying for its signature."""
        if self.scores.is_ignored(claimed_sender):
            self.scores.note_ignored_message(claimed_sender)
            return True
        return False

    def _accept_chunk(self, topic: str, envelope: Envelope) -> Received | None:
        chunk = decode_payload(Chunk.KIND, envelope.payload, self._wire_payload_limits)
        if not isinstance(chunk, Chunk):
            raise WireError("malformed", "chunk payload did not decode to a chunk")
        if self._seen.has_hash(envelope.sender, chunk.inner_digest):
            raise WireError("duplicate", "the envelope these chunks carry was accepted")
        evicted = self._reassembly.evicted
        try:
            whole = self._reassembly.add(envelope.sender, topic, chunk, self.clock.now())
        finally:
            if self._reassembly.evicted > evicted:
                self.counters.dropped["reassembly_evicted"] += self._reassembly.evicted - evicted
        self.counters.received[Chunk.KIND] += 1
        if whole is None:
            return None
        # Every byte of `whole` is covered by its signer's chunk signatures: its own
        # signature would authenticate the same signer's bytes a second time (a pass of
        # SHA-256 over the payload), so its digest is taken from the chunks' word.
        inner = decode_vouched_envelope(
            whole, self._inner_limits, self.swarm_id, envelope.sender, chunk.inner_digest
        )
        if inner.kind == Chunk.KIND:
            raise WireError("nested_chunk", "a chunk set may not carry another chunk")
        # No floor here: see gossip.seen (this seq precedes its chunks' own seqs).
        if self._seen.has_pair(inner.sender, inner.seq, use_floor=False):
            raise WireError("duplicate", f"inner seq {inner.seq}")
        self._seen.add(inner.sender, inner.seq, inner.signing_digest)
        return self._finish(topic, inner, len(whole), self._inner_payload_limits)

    def _finish(self, topic: str, envelope: Envelope, size: int, limits: Limits) -> Received:
        message = decode_payload(envelope.kind, envelope.payload, limits)
        self._check_topic(topic, message)
        self.counters.received[envelope.kind] += 1
        return Received(topic, envelope, message, size)

    def _check_topic(self, topic: str, message: Payload) -> None:
        """On this swarm's named topics, the payload must be that topic's kind."""
        delta_prefix = deltas_topic(self.swarm_id, "")
        if topic == peers_topic(self.swarm_id):
            ok = isinstance(message, Hello)
        elif topic == rollouts_topic(self.swarm_id):
            ok = isinstance(message, RolloutBatch)
        elif topic.startswith(delta_prefix):
            family = topic[len(delta_prefix) :]
            ok = isinstance(message, DeltaPacket) and message.model_family == family
        else:
            return
        if not ok:
            raise WireError("wrong_topic", f"{type(message).__name__} on {topic[:128]}")

    # scoring and metrics -------------------------------------------------------------

    def penalize(self, peer_id: str, reason: str) -> None:
        """Record a refusal against a peer found misbehaving above this layer (the node's
        re-scoring: prompt mismatches, forged rewards, bad deltas) and score it."""
        self.counters.blame(peer_id, reason)
        self._score_refusal(peer_id, reason)

    def peer_network(self, peer_id: str) -> str | None:
        """The network the transport is directly connected to `peer_id` at, or None
        (`Transport.peer_network`; a transport without the method says None)."""
        locate = getattr(self.transport, "peer_network", None)
        return None if locate is None else locate(peer_id)

    def credit(self, peer_id: str, amount: float = 1.0) -> None:
        """Score a useful contribution (a re-scored group that entered the pool)."""
        self.scores.credit(peer_id, amount)

    def _score_refusal(self, peer_id: str, reason: str) -> None:
        if self.scores.penalize(peer_id, reason):
            until = self.scores.ignored_until(peer_id)
            if until is not None:
                live = {p: t for p, t in self._ignored_until.items() if t > self.clock.now()}
                live[peer_id] = until
                # Replaced, never mutated: the transport's thread reads it meanwhile.
                self._ignored_until = dict(list(live.items())[-_MAX_IGNORED_FORWARDERS:])
            dropped = self._reassembly.discard_sender(peer_id)
            logger.warning(
                "gossip: ignoring peer %s for a while (last reason %s; %d partial chunk "
                "sets dropped)", peer_id, reason, dropped,
            )

    def continue_after(self, seq: int) -> None:
        """Send only seqs above `seq` from now on (our own seqs reserved by a checkpoint:
        `node.resume`). A no-op when the next seq is already above it."""
        self._publisher.continue_after(seq)

    def remember_seqs(self, highest: dict[str, int]) -> None:
        """Refuse as duplicates every seq at or below each sender's `highest` (restored
        from a checkpoint, so that a restart does not reopen a window for replays)."""
        for sender, seq in highest.items():
            self._seen.raise_floor(sender, seq)

    @property
    def pending_reassembly_bytes(self) -> int:
        return self._reassembly.pending_bytes

    @property
    def next_seq(self) -> int:
        return self._publisher.next_seq

    def snapshot(self) -> dict[str, Any]:
        """Counters plus bounded-state sizes, JSON-ready for the metrics line."""
        snap = self.counters.snapshot()
        snap["pending_reassembly_bytes"] = self._reassembly.pending_bytes
        snap["partial_sets"] = len(self._reassembly)
        snap["seen_entries"] = len(self._seen)
        snap["scores"] = self.scores.snapshot()
        return snap
