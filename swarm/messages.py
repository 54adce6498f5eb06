"""Wire types: one frozen dataclass per message kind, and strict conversion to and from
plain msgpack-able values.

Invariants:
- `from_wire` accepts exactly the documented fields with exactly the documented types
  (bool is not an int, NaN rewards are refused) and raises `WireError("bad_payload")`
  for anything else; it never trusts a peer's value beyond its type and bounds.
- Rewards and answers in a `RolloutGroup` are advisory: receivers recompute them from
  the task reference. A group carries the task *reference*, never a trusted answer.
- A group's sampler logprobs (optional, protocol 4) are finite and <= 0, at most
  `MAX_LOGPROB_TOKENS` per completion, one entry per completion, and come with the
  sender's `model_family`; a group breaking any of that is refused (`bad_payload`).
  They are a claim, never trusted: a receiver caps what they can do (see
  `policy.trainer`).
- A group's sampled token ids (optional, protocol 5) follow the same shape: one entry
  per completion, at most `MAX_LOGPROB_TOKENS` ids each (uint32), only with the sender's
  `model_family`, and as many as that completion's logprobs where both are carried. A
  receiver of that family checks they decode to the completion's text before using them
  (`policy.train_rows`); ids are a claim about how the text was written, never about
  what it says.
- Field order in `to_wire` is fixed; the encoding is language-neutral (see README).
- `decode_payload` reads a large chunk laid out as our senders write it without copying
  its data; any other layout takes the general decoder, and both accept and refuse the
  same inputs with the same reasons (`tests/swarm/test_messages.py` checks both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from swarm.codec import Limits, bin_header, pack, scalars_then_bin, unpack
from swarm.errors import WireError
from swarm.token_arrays import (
    check_logprobs,
    check_token_ids,
    pack_logprobs,
    pack_token_ids,
    unpack_logprobs,
    unpack_token_ids,
)

MAX_NAME_CHARS = 256
MAX_TEXT_CHARS = 64 * 1024
MAX_GROUP_SIZE = 256
LARGE_BYTES = 1 << 16
"""From this size on, `payload_parts` leaves a delta's tensors unjoined."""


def _fail(msg: str) -> WireError:
    return WireError("bad_payload", msg)


def _map(obj: Any, keys: tuple[str, ...], required: tuple[str, ...] | None = None) -> dict:
    if not isinstance(obj, dict):
        raise _fail("expected a map")
    unknown = set(obj) - set(keys)
    if unknown:
        raise _fail(f"unknown fields {sorted(unknown)[:5]}")
    missing = set(required if required is not None else keys) - set(obj)
    if missing:
        raise _fail(f"missing fields {sorted(missing)}")
    return obj


def _map_around_bytes(
    fields: dict[str, Any], key: str, data: bytes | memoryview
) -> tuple[bytes, bytes | memoryview, bytes]:
    """`pack(fields)` (with `fields[key]` being `data`) as (what precedes `data`, `data`,
    what follows), byte for byte: a msgpack map is its header, then each key's and
    value's encoding in the dict's order, so only `data` needs no packing."""
    if len(fields) > 15:
        raise ValueError("only small (fixmap) payloads are framed in parts")
    items = list(fields.items())
    at = list(fields).index(key)
    head = bytes([0x80 | len(items)]) + b"".join(pack(k) + pack(v) for k, v in items[:at])
    tail = b"".join(pack(k) + pack(v) for k, v in items[at + 1 :])
    return head + pack(key) + bin_header(len(data)), data, tail


def _int(value: Any, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise _fail(f"{name} must be an int in [{lo}, {hi}]")
    return value


def _str(value: Any, name: str, max_chars: int = MAX_NAME_CHARS) -> str:
    if not isinstance(value, str) or len(value) > max_chars:
        raise _fail(f"{name} must be a string of at most {max_chars} chars")
    return value


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(f"{name} must be a number")
    if not math.isfinite(value):
        raise _fail(f"{name} must be finite")
    return float(value)


def _bytes(value: Any, name: str, max_len: int) -> bytes:
    if not isinstance(value, bytes) or len(value) > max_len:
        raise _fail(f"{name} must be bytes of at most {max_len}")
    return value


def _list(value: Any, name: str, max_len: int) -> list:
    if not isinstance(value, list) or len(value) > max_len:
        raise _fail(f"{name} must be a list of at most {max_len} items")
    return value


@dataclass(frozen=True)
class TaskRef:
    """A verifiable task by reference: the receiver regenerates question and answer."""

    source: str
    seed: int
    index: int

    def to_wire(self) -> dict:
        return {"source": self.source, "seed": self.seed, "index": self.index}

    @classmethod
    def from_wire(cls, obj: Any) -> TaskRef:
        m = _map(obj, ("source", "seed", "index"))
        return cls(_str(m["source"], "source"), _int(m["seed"], "seed"), _int(m["index"], "index"))


PROGRESS_KEYS = ("rounds", "reward", "eval")


@dataclass(frozen=True)
class Hello:
    """`peers` topic: who a node is, what it runs, how far it is."""

    KIND: ClassVar[str] = "hello"
    model_id: str
    model_family: str
    policy_version: int
    capabilities: tuple[str, ...] = ()
    progress: tuple[tuple[str, float], ...] = ()
    """Optional self-reported figures (`rounds`, `reward`: mean own reward of the last
    rounds, `eval`: latest held-out accuracy): claims for display, never trusted."""
    work: int | None = None
    """Optional: the sender's proof of work on its key for this swarm
    (`swarm.identity_work`), a nonce in [0, 2**64). Absent unless the swarm asks."""

    def to_wire(self) -> dict:
        wire: dict[str, Any] = {
            "model_id": self.model_id,
            "model_family": self.model_family,
            "policy_version": self.policy_version,
            "capabilities": list(self.capabilities),
        }
        if self.progress:
            wire["progress"] = dict(self.progress)
        if self.work is not None:
            wire["work"] = self.work
        return wire

    @classmethod
    def from_wire(cls, obj: Any) -> Hello:
        required = ("model_id", "model_family", "policy_version", "capabilities")
        m = _map(obj, (*required, "progress", "work"), required)
        caps = _list(m["capabilities"], "capabilities", 32)
        progress = m.get("progress", {})
        if not isinstance(progress, dict) or not set(progress) <= set(PROGRESS_KEYS):
            raise _fail(f"progress must be a map with keys among {list(PROGRESS_KEYS)}")
        return cls(
            _str(m["model_id"], "model_id"),
            _str(m["model_family"], "model_family"),
            _int(m["policy_version"], "policy_version"),
            tuple(_str(c, "capability", 64) for c in caps),
            tuple((k, _float(progress[k], k)) for k in PROGRESS_KEYS if k in progress),
            _int(m["work"], "work", 0, 2**64 - 1) if "work" in m else None,
        )


@dataclass(frozen=True)
class RolloutGroup:
    """`rollouts` topic: one prompt and the G completions one node sampled for it."""

    KIND: ClassVar[str] = "rollouts"
    task: TaskRef
    prompt: str
    completions: tuple[str, ...]
    rewards: tuple[float, ...]  # advisory only
    model_id: str
    policy_version: int
    finished: tuple[bool, ...] = ()
    """Per completion: did it end with the sampler's stop token (EOS)? Text alone cannot
    say, and a receiver appends its own EOS only where this is set. Left empty by a
    caller that does not know, it becomes all False (unfinished)."""
    model_family: str = ""
    """The sender's model family (hash of its base's architecture and initial weights):
    `logprobs` are comparable with a receiver's own only where this equals its family
    (same tokenizer and base). Required with `logprobs`, else optional."""
    logprobs: tuple[tuple[float, ...], ...] = ()
    """Per completion, the sampler's logprob of each token it sampled (the stop token
    included where `finished`), float32 on the wire. Empty: not carried."""
    token_ids: tuple[tuple[int, ...], ...] = ()
    """Per completion, the token ids the sampler drew (the stop token included where
    `finished`), uint32 on the wire: how the text was written, which re-tokenizing the text
    cannot recover (a model often writes a string with another split than its tokenizer's
    own). Meaningful only to receivers of `model_family`. Empty: not carried."""

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.rewards):
            raise _fail("completions and rewards differ in length")
        if not self.finished:
            object.__setattr__(self, "finished", (False,) * len(self.completions))
        if len(self.finished) != len(self.completions):
            raise _fail("completions and finished differ in length")
        if self.logprobs:
            if len(self.logprobs) != len(self.completions):
                raise _fail("logprobs must be one entry per completion")
            if not self.model_family:
                raise _fail("logprobs need the sender's model_family")
            object.__setattr__(self, "logprobs", tuple(check_logprobs(lp) for lp in self.logprobs))
        if self.token_ids:
            if len(self.token_ids) != len(self.completions):
                raise _fail("token_ids must be one entry per completion")
            if not self.model_family:
                raise _fail("token_ids need the sender's model_family")
            ids = tuple(check_token_ids(t) for t in self.token_ids)
            if self.logprobs and any(
                len(t) != len(lp) for t, lp in zip(ids, self.logprobs, strict=True)
            ):
                raise _fail("token_ids and logprobs differ in length")
            object.__setattr__(self, "token_ids", ids)

    def to_wire(self) -> dict:
        wire: dict[str, Any] = {
            "task": self.task.to_wire(),
            "prompt": self.prompt,
            "completions": list(self.completions),
            "rewards": list(self.rewards),
            "model_id": self.model_id,
            "policy_version": self.policy_version,
            "finished": list(self.finished),
        }
        if self.model_family:
            wire["model_family"] = self.model_family
        if self.logprobs:
            wire["logprobs"] = [pack_logprobs(lp) for lp in self.logprobs]
        if self.token_ids:
            wire["token_ids"] = [pack_token_ids(t) for t in self.token_ids]
        return wire

    @classmethod
    def from_wire(cls, obj: Any) -> RolloutGroup:
        required = (
            "task", "prompt", "completions", "rewards", "model_id", "policy_version", "finished"
        )  # fmt: skip
        m = _map(obj, (*required, "model_family", "logprobs", "token_ids"), required)
        completions = _list(m["completions"], "completions", MAX_GROUP_SIZE)
        rewards = _list(m["rewards"], "rewards", MAX_GROUP_SIZE)
        finished = _list(m["finished"], "finished", MAX_GROUP_SIZE)
        if not completions:
            raise _fail("a group needs at least one completion")
        if len(finished) != len(completions) or not all(isinstance(f, bool) for f in finished):
            raise _fail("finished must be one bool per completion")
        return cls(
            task=TaskRef.from_wire(m["task"]),
            prompt=_str(m["prompt"], "prompt", MAX_TEXT_CHARS),
            completions=tuple(_str(c, "completion", MAX_TEXT_CHARS) for c in completions),
            rewards=tuple(_float(r, "reward") for r in rewards),
            model_id=_str(m["model_id"], "model_id"),
            policy_version=_int(m["policy_version"], "policy_version"),
            finished=tuple(finished),
            model_family=_str(m.get("model_family", ""), "model_family"),
            logprobs=tuple(
                unpack_logprobs(lp)
                for lp in _list(m.get("logprobs", []), "logprobs", len(completions))
            ),
            token_ids=tuple(
                unpack_token_ids(t)
                for t in _list(m.get("token_ids", []), "token_ids", len(completions))
            ),
        )


@dataclass(frozen=True)
class RolloutBatch:
    """`rollouts` topic payload: the groups one node publishes for one round."""

    KIND: ClassVar[str] = "rollouts"
    groups: tuple[RolloutGroup, ...]

    def to_wire(self) -> dict:
        return {"groups": [g.to_wire() for g in self.groups]}

    @classmethod
    def from_wire(cls, obj: Any) -> RolloutBatch:
        m = _map(obj, ("groups",))
        groups = _list(m["groups"], "groups", 1024)
        return cls(tuple(RolloutGroup.from_wire(g) for g in groups))


@dataclass(frozen=True)
class DeltaPacket:
    """`deltas/<family>` topic: a compressed weight delta (tensors as safetensors bytes)."""

    KIND: ClassVar[str] = "delta"
    model_family: str
    base_version: int
    encoding: str
    tensors: bytes
    meta: dict[str, str] = field(default_factory=dict)

    def to_wire(self) -> dict:
        return {
            "model_family": self.model_family,
            "base_version": self.base_version,
            "encoding": self.encoding,
            "tensors": self.tensors,
            "meta": dict(self.meta),
        }

    def payload_parts(self) -> tuple[bytes, bytes, bytes]:
        """`encode_payload(self)` as (what precedes the tensors, the tensors, what
        follows), so that the tensors are copied once, into the envelope's wire bytes
        (packing them whole costs two copies and a buffer grown by doubling)."""
        return _map_around_bytes(self.to_wire(), "tensors", self.tensors)

    @classmethod
    def from_wire(cls, obj: Any) -> DeltaPacket:
        m = _map(obj, ("model_family", "base_version", "encoding", "tensors", "meta"))
        meta = m["meta"]
        if not isinstance(meta, dict) or len(meta) > 64:
            raise _fail("meta must be a small map")
        return cls(
            model_family=_str(m["model_family"], "model_family"),
            base_version=_int(m["base_version"], "base_version"),
            encoding=_str(m["encoding"], "encoding", 64),
            tensors=_bytes(m["tensors"], "tensors", 1 << 30),
            meta={_str(k, "meta key"): _str(v, "meta value", 4096) for k, v in meta.items()},
        )


@dataclass(frozen=True)
class Chunk:
    """One piece of an encoded envelope too large to send whole.

    `inner_digest` names the set: sha256 of the inner envelope's signing input, i.e.
    `Envelope.signing_digest` of what the chunks reassemble into (computed by the sender
    from the signing input it already built, no pass over the data). Each chunk is
    authenticated by its own envelope's signature (which covers `data`), so the
    reassembled bytes are their signer's; they must decode to an envelope of that signer,
    whose digest is then taken to be `inner_digest` (`gossip.layer`; protocol 3 carried
    a sha256 of the whole content and one of each chunk's data, two more passes per
    side). A payload of at least `LARGE_BYTES` laid out as `payload_parts` writes it is
    decoded with `data` a read-only view of the payload (`decode_payload`).
    """

    KIND: ClassVar[str] = "chunk"
    inner_digest: bytes
    index: int
    count: int
    total_size: int
    data: bytes | memoryview
    """A view when decoded from a large payload (class docstring) or held by a sender
    cutting up its envelope; bytes otherwise."""

    def to_wire(self) -> dict:
        return {
            "inner_digest": self.inner_digest,
            "index": self.index,
            "count": self.count,
            "total_size": self.total_size,
            "data": self.data,
        }

    def payload_parts(self) -> tuple[bytes, bytes | memoryview]:
        """`encode_payload(self)` as (everything before the data, the data itself), so
        that the data can be framed without a copy (`swarm.envelope.seal_parts`)."""
        head, data, _ = _map_around_bytes(self.to_wire(), "data", self.data)  # data is last
        return head, data

    @classmethod
    def from_wire(cls, obj: Any) -> Chunk:
        m = _map(obj, _CHUNK_KEYS)
        return cls._checked(m, _bytes(m["data"], "data", MAX_CHUNK_DATA))

    @classmethod
    def _checked(cls, m: dict[str, Any], data: bytes | memoryview) -> Chunk:
        count = _int(m["count"], "count", 1, 1 << 16)
        chunk = cls(
            inner_digest=_bytes(m["inner_digest"], "inner_digest", 32),
            index=_int(m["index"], "index", 0, count - 1),
            count=count,
            total_size=_int(m["total_size"], "total_size", 1, 1 << 34),
            data=data,
        )
        if len(chunk.inner_digest) != 32:
            raise _fail("inner_digest must be 32 bytes")
        return chunk


_CHUNK_KEYS = ("inner_digest", "index", "count", "total_size", "data")
MAX_CHUNK_DATA = 1 << 24


def _read_framed_chunk(data: bytes | memoryview, limits: Limits) -> Chunk | None:
    """A chunk payload laid out as `Chunk.payload_parts` writes it (a map of its five keys
    in `to_wire`'s order, the data last), its data a read-only view of `data` (no copy);
    None for any other layout or a broken limit, for the general decoder to judge."""
    if (
        len(data) > limits.max_message_bytes
        or data[0] != 0x80 | len(_CHUNK_KEYS)
        or limits.max_map_len < len(_CHUNK_KEYS)
        or limits.max_containers < 1
        or limits.max_depth < 1
    ):
        return None
    head = scalars_then_bin(
        data,
        2 * len(_CHUNK_KEYS) - 1,
        max_str_len=limits.max_str_len,
        max_bin_len=min(32, limits.max_bin_len),
    )
    if head is None:
        return None
    items, begin, size = head
    if tuple(items[0::2]) != _CHUNK_KEYS or begin + size != len(data):
        return None
    if size > min(limits.max_bin_len, MAX_CHUNK_DATA):
        return None
    fields = dict(zip(_CHUNK_KEYS, items[1::2], strict=False))
    return Chunk._checked(fields, memoryview(data).toreadonly()[begin:])


PAYLOAD_TYPES: dict[str, Any] = {
    Hello.KIND: Hello,
    RolloutBatch.KIND: RolloutBatch,
    DeltaPacket.KIND: DeltaPacket,
    Chunk.KIND: Chunk,
}

Payload = Hello | RolloutBatch | DeltaPacket | Chunk


def encode_payload(message: Payload) -> bytes:
    return pack(message.to_wire())


def payload_parts(message: Payload) -> tuple[bytes | memoryview, ...]:
    """`encode_payload(message)` in pieces whose concatenation is exactly it: a large
    delta's tensors stay where they are (`swarm.envelope.seal_parts` copies them once,
    into the wire bytes)."""
    if isinstance(message, DeltaPacket) and len(message.tensors) >= LARGE_BYTES:
        return message.payload_parts()
    return (encode_payload(message),)


def decode_payload(kind: str, data: bytes | memoryview, limits: Limits) -> Payload:
    cls = PAYLOAD_TYPES.get(kind)
    if cls is None:
        raise WireError("unknown_kind", repr(kind)[:64])
    if cls is Chunk and len(data) >= LARGE_BYTES:
        chunk = _read_framed_chunk(data, limits)
        if chunk is not None:
            return chunk
    return cls.from_wire(unpack(data, limits))
