"""CHOCO gossip averaging of one node's weights with its same-family peers
(`[deltas] scheme = "choco"`); the math is `policy.choco`, this wires it to packets.

State: this node's public estimate `xhat` (float32, what its peers hold of it), its
stream (a random id and a sequence number), and up to `max_estimates` peer copies
`xhat_j`, each with its stream position and the round its last packet arrived.

A share (every `every_k_steps` optimizer steps, `maybe_make_packet`):
- sequence number `seq += 1`; a *keyframe* when the stream is new (`seq == 1`), every
  `keyframe_every` shares, or when a peer stream was seen at its start (its keyframe
  `seq == 1`: a joiner or a restarted peer, holding no copy of us) since the last share;
  otherwise a *diff*. A joiner whose first keyframe is lost gets our periodic one.
- keyframe: `xhat := fp16(x)` sent whole as `dense_fp16`; diff: `q = Q(x - xhat)` with
  the configured codec, `xhat += q` exactly as receivers decode it.
- the packet: `base_version = seq - 1` (the estimate it builds on), `meta` = `scheme`
  "choco", `stream`, `seq`, `frame` ("key" | "diff"), `version` (policy version).

A merge (`merge_into`, right after the share): each peer's packets received since the
last merge are folded into its copy in `seq` order (`policy.choco.classify`: resync on a
keyframe, apply the next diff, mark the copy out of sync on a gap until the next
keyframe, ignore old ones); then the consensus step `x += consensus_step * direction`
over the copies in sync whose last packet arrived within `max_staleness` of our rounds
(`policy.choco.consensus_direction`: uniform weights, each term clipped to
`clip_multiple` x the median). `xhat` is not changed by the step; the next share
carries it. With `consensus_reference = "previous"` the step compares the peers' copies
with our estimate *before* this share (peers' latest packets are about one share period
old, so the current estimate would also pull us back along the swarm's common progress).
Reordering within one merge window is harmless; across windows it is a gap.

Memory: `4 * n_params * (held copies + 1)` bytes plus pending packets (at most
`_MAX_QUEUED` per sender, from at most `max_pending_peers` senders; a keyframe drops the
sender's queue before it). A copy that is out of sync frees its tensors.

Refusals (`node.rescore.Refused`) at `receive`: `wrong_family`, `wrong_scheme` (a
`merge` peer, or a packet without valid CHOCO metadata: not its fault), `pending_full`,
`bad_delta` (a keyframe not dense, inconsistent `base_version`), and the codec's
`bad_delta` / `wrong_shape` / `non_finite` (NaN/Inf refused before anything is held).
A copy that becomes non-finite (finite but huge increments) is dropped at the merge.

Restart: the checkpoint holds only the policy version of the last share. A node that
resumes starts a new stream (its first share is a keyframe) and holds no peer copies;
its new stream makes every peer send a keyframe at their next share, so it is back in
sync one share period later. Peer copies are not checkpointed: they are 4 bytes per
parameter each, and after a restart they would be behind by whatever was missed.

Threads: as `node.deltas` (`receive` may run while `merge_into` runs; the pending map
is swapped out in one rebinding and read once into a local by `receive`).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from node.rescore import Refused
from policy.choco import (
    ConsensusStats,
    Frame,
    StreamPosition,
    add_into,
    classify,
    consensus_direction,
    difference,
    step_into,
)
from policy.compression import DENSE_FP16, ENCODINGS, CompressedDelta, compress, decompress
from policy.delta_codec import DeltaCodecError, decode_packet, encode_packet
from swarm.config.deltas import DeltasConfig
from swarm.messages import DeltaPacket
from swarm.staleness import is_fresh

SCHEME = "choco"
_LAST_STEP = "meta/choco_last_step"
_MAX_QUEUED = 8
"""Packets held per sender between merges (a sender shares once per K of its steps)."""
_STREAM = re.compile(r"^[0-9a-f]{8,32}$")


@dataclass(frozen=True)
class _Queued:
    seq: int
    frame: Frame
    stream: str
    arrival_round: int
    compressed: CompressedDelta


@dataclass
class PeerCopy:
    """What this node holds of one peer."""

    position: StreamPosition
    last_arrival: int
    """Our `rounds_done` when its last folded packet arrived."""
    estimate: dict[str, Tensor] | None = field(default=None, repr=False)
    """`xhat_j` (float32), None while out of sync."""


@dataclass(frozen=True)
class ChocoStats:
    """What one merge did (a metrics record)."""

    pending: int
    """Packets folded in (all senders)."""
    resyncs: int
    applied: int
    gaps: int
    waiting: int
    """Diffs that found no usable copy (waiting for a keyframe)."""
    dropped: int
    """Copies dropped: non-finite, or evicted for a newer peer."""
    in_sync: int
    """Copies in sync (used or not)."""
    consensus: ConsensusStats
    applied_norm: float
    """L2 norm of the change made to the parameters."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "scheme": SCHEME,
            "pending": self.pending,
            "resyncs": self.resyncs,
            "applied": self.applied,
            "gaps": self.gaps,
            "waiting": self.waiting,
            "dropped": self.dropped,
            "in_sync": self.in_sync,
            "consensus": self.consensus.as_dict(),
            "applied_norm": self.applied_norm,
        }


class ChocoExchange:
    """One node's side of CHOCO gossip (module docstring). The same interface as
    `node.deltas.DeltaExchange`; synchronous and CPU-bound, called off the event loop."""

    def __init__(
        self,
        config: DeltasConfig,
        model_family: str,
        params: Mapping[str, Tensor],
        step: int = 0,
        *,
        max_packet_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.model_family = model_family
        self.shapes = {name: tuple(t.shape) for name, t in sorted(params.items())}
        self.max_packet_bytes = max_packet_bytes
        self._estimate = {n: t.detach().to(torch.float32).clone() for n, t in params.items()}
        self._reference: dict[str, Tensor] | None = None
        """`consensus_reference = "previous"`: our estimate before the latest share."""
        self.peers: dict[str, PeerCopy] = {}
        self.pending: dict[str, list[_Queued]] = {}
        self.last_packet_bytes = 0
        self.keyframes_sent = 0
        self.sent_bytes: dict[str, int] = {"key": 0, "diff": 0}
        """Payload bytes published, by frame (keyframes cost 2 bytes per parameter)."""
        self.sent_count: dict[str, int] = {"key": 0, "diff": 0}
        self._restart_stream(step)

    def _restart_stream(self, step: int) -> None:
        self._stream = secrets.token_hex(8)
        self._seq = 0
        self._last_key_seq = 0
        self._last_step = step
        self._new_peer = False
        self._reference = None
        self.peers = {}
        self.pending = {}

    # ---- sharing ---------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether `step` (the policy version) is a share step."""
        return step - self._last_step >= self.config.every_k_steps

    def maybe_make_packet(self, step: int, params: Mapping[str, Tensor]) -> DeltaPacket | None:
        """Every K steps: a keyframe or a diff of this node's estimate (module docstring).
        Raises ValueError if the parameters hold NaN/Inf."""
        if not self.due(step):
            return None
        self._check_names(params)
        c = self.config
        self._seq += 1
        key = self._seq == 1 or self._new_peer or self._seq - self._last_key_seq >= c.keyframe_every
        if c.consensus_reference == "previous":
            self._reference = {n: t.clone() for n, t in self._estimate.items()}
        if key:
            compressed, _ = compress(params, None, encoding=DENSE_FP16)
            for name, value in decompress(compressed, self.shapes).items():
                self._estimate[name].copy_(value)
            self._last_key_seq = self._seq
            self._new_peer = False
            self.keyframes_sent += 1
        else:
            compressed, _ = compress(
                difference(params, self._estimate),
                None,
                encoding=c.encoding,
                density=c.density,
                bits=c.bits,
                chunk_size=c.chunk_size,
            )
            add_into(self._estimate, decompress(compressed, self.shapes))
        self._last_step = step
        tensors = encode_packet(compressed)
        self.last_packet_bytes = len(tensors)
        frame = "key" if key else "diff"
        self.sent_bytes[frame] += len(tensors)
        self.sent_count[frame] += 1
        return DeltaPacket(
            model_family=self.model_family,
            base_version=self._seq - 1,
            encoding=compressed.encoding,
            tensors=tensors,
            meta={
                "version": str(step),
                "scheme": SCHEME,
                "stream": self._stream,
                "seq": str(self._seq),
                "frame": frame,
            },
        )

    # ---- receiving -------------------------------------------------------------------

    def receive(
        self, sender: str, sender_version: int, packet: DeltaPacket, arrival_round: int
    ) -> None:
        """Validate a peer's packet and queue it for the next merge, or raise `Refused`."""
        del sender_version  # streams are ordered by `seq`, not by policy version
        if packet.model_family != self.model_family:
            raise Refused("wrong_family")
        meta = packet.meta
        if meta.get("scheme") != SCHEME:
            raise Refused("wrong_scheme")
        stream, seq_text, frame = meta.get("stream", ""), meta.get("seq", ""), meta.get("frame")
        if not _STREAM.match(stream) or not seq_text.isdigit() or len(seq_text) > 15:
            raise Refused("bad_delta")
        seq = int(seq_text)
        if seq < 1 or packet.base_version != seq - 1 or frame not in ("key", "diff"):
            raise Refused("bad_delta")
        if packet.encoding not in ENCODINGS or (frame == "key" and packet.encoding != DENSE_FP16):
            raise Refused("bad_delta")
        pending = self.pending  # one read: `merge_into` may rebind it from another thread
        queue = pending.get(sender)
        if queue is None and len(pending) >= self.config.max_pending_peers:
            raise Refused("pending_full")
        if queue is not None and len(queue) >= _MAX_QUEUED and frame == "diff":
            raise Refused("pending_full")  # the missing diff will show as a gap
        try:
            compressed = decode_packet(packet.tensors, self.shapes, max_bytes=self.max_packet_bytes)
        except DeltaCodecError as exc:
            raise Refused(exc.reason) from None
        if compressed.encoding != packet.encoding:
            raise Refused("bad_delta")
        item = _Queued(seq, cast(Frame, frame), stream, arrival_round, compressed)
        if frame == "key":  # everything before a keyframe of the same stream is moot
            kept = [q for q in queue or [] if q.stream == stream and q.seq > seq]
            pending[sender] = [*kept, item]
        else:
            pending.setdefault(sender, []).append(item)

    # ---- merging ---------------------------------------------------------------------

    def _fold(self, sender: str, queue: list[_Queued], counts: dict[str, int]) -> None:
        """Fold one sender's queued packets into its copy, in `seq` order."""
        for item in sorted(queue, key=lambda q: q.seq):
            copy = self.peers.get(sender)
            verdict = classify(copy.position if copy else None, item.stream, item.seq, item.frame)
            if verdict == "resync":
                new_stream = copy is None or copy.position.stream != item.stream
                if new_stream and item.seq == 1:
                    # a stream at its start: a joiner or a restarted peer, holding no copy
                    # of us (a stream first seen later means *we* are the newcomer, and
                    # our own first keyframe reached it)
                    self._new_peer = True
                if (copy is None or copy.estimate is None) and not self._make_room(
                    item.arrival_round
                ):
                    counts["dropped"] += 1
                    continue
                estimate = decompress(item.compressed, self.shapes)
                self.peers[sender] = PeerCopy(
                    StreamPosition(item.stream, item.seq, True), item.arrival_round, estimate
                )
                counts["resyncs"] += 1
            elif verdict == "apply":
                assert copy is not None and copy.estimate is not None
                if add_into(copy.estimate, decompress(item.compressed, self.shapes)):
                    copy.position = StreamPosition(item.stream, item.seq, True)
                    copy.last_arrival = item.arrival_round
                    counts["applied"] += 1
                else:
                    self.peers.pop(sender)
                    counts["dropped"] += 1
            elif verdict == "gap":
                assert copy is not None
                copy.position = StreamPosition(item.stream, item.seq, False)
                copy.estimate = None
                counts["gaps"] += 1
            elif verdict == "wait":
                counts["waiting"] += 1

    def _make_room(self, arrival_round: int) -> bool:
        """Evict the copy heard from least recently if the table is full and it is older
        than `arrival_round`; whether there is room now."""
        held = [(p.last_arrival, s) for s, p in self.peers.items() if p.estimate is not None]
        if len(held) < self.config.max_estimates:
            return True
        oldest_round, oldest = min(held)
        if oldest_round >= arrival_round:
            return False
        self.peers.pop(oldest)
        return True

    def merge_into(self, params: Mapping[str, Tensor], own_round: int | None = None) -> ChocoStats:
        """Fold the queued packets into the peer copies, then take the consensus step on
        `params` in place toward the copies in sync and fresh at `own_round`."""
        self._check_names(params)
        pending, self.pending = self.pending, {}  # one rebinding: safe against `receive`
        counts = {k: 0 for k in ("resyncs", "applied", "gaps", "waiting", "dropped")}
        for sender, queue in pending.items():
            self._fold(sender, queue, counts)
        # out-of-sync entries keep only their stream position (no tensors); bound them too
        if len(self.peers) > 4 * self.config.max_estimates:
            for sender in sorted(self.peers, key=lambda s: self.peers[s].last_arrival)[
                : len(self.peers) - 4 * self.config.max_estimates
            ]:
                self.peers.pop(sender)
        in_sync = [p for p in self.peers.values() if p.estimate is not None]
        used = [
            p.estimate
            for p in in_sync
            if p.estimate is not None
            and (
                own_round is None or is_fresh(own_round, p.last_arrival, self.config.max_staleness)
            )
        ]
        own = self._estimate if self._reference is None else self._reference
        direction, consensus = consensus_direction(own, used, self.config.clip_multiple)
        moved = step_into(params, direction, self.config.consensus_step) if used else 0.0
        return ChocoStats(
            pending=sum(len(q) for q in pending.values()),
            in_sync=len(in_sync),
            consensus=consensus,
            applied_norm=moved,
            **counts,
        )

    # ---- checkpoint state ------------------------------------------------------------

    def state_tensors(self) -> dict[str, Tensor]:
        """The policy version of the last share (see "Restart" in the module docstring)."""
        return {_LAST_STEP: torch.tensor([self._last_step], dtype=torch.int64)}

    def load_state_tensors(self, state: Mapping[str, Tensor]) -> None:
        """Resume after a restart: a new stream (keyframe first), no peer copies, and the
        estimate is re-taken at the first share. A checkpoint written under the `merge`
        scheme holds other keys: then the share clock restarts at 0 steps ago (no error,
        so that switching schemes does not make a node skip its newest checkpoint)."""
        step = int(state[_LAST_STEP][0]) if _LAST_STEP in state else self._last_step
        self._restart_stream(step)

    def rebase(self, params: Mapping[str, Tensor], step: int) -> None:
        """Start afresh from `params` at `step` (a new stream, nothing held)."""
        self._check_names(params)
        for name, est in self._estimate.items():
            est.copy_(params[name].detach())
        self._restart_stream(step)

    # ---- helpers ---------------------------------------------------------------------

    @property
    def last_step(self) -> int:
        return self._last_step

    @property
    def stream(self) -> str:
        """This node's current stream id."""
        return self._stream

    def estimate_of(self, sender: str) -> dict[str, Tensor] | None:
        """The copy held of `sender` (None: none, or out of sync). Read-only use."""
        copy = self.peers.get(sender)
        return None if copy is None else copy.estimate

    @property
    def own_estimate(self) -> dict[str, Tensor]:
        """This node's public estimate `xhat` (read-only use)."""
        return self._estimate

    def _check_names(self, params: Mapping[str, Tensor]) -> None:
        shapes = {name: tuple(t.shape) for name, t in params.items()}
        if shapes != self.shapes:
            raise ValueError("parameters differ from those the exchange was built with")
