"""Signed envelopes: the only thing that travels between nodes.

Wire form (msgpack array, language-neutral):
    [version, kind, swarm_id, sender, seq, policy_version, payload, signature]
`signature` is Ed25519 by `sender` (a libp2p peer id, which embeds the public key) over
the *signing input*, a fixed byte layout built from the decoded field values (so any
valid msgpack encoding of the same fields verifies, whatever the encoder chose):
    b"swarm/envelope/v3\\0" || u16be(version)
    || u8(len(kind)) || kind || u16be(len(swarm_id)) || swarm_id || u8(len(sender)) || sender
    || u64be(seq) || u64be(policy_version) || sha256(payload)
(strings as UTF-8 bytes; the payload is hashed exactly as received). Signing a digest
keeps Ed25519's cost independent of the payload's size.
`policy_version` is the sender's policy version (optimizer steps) when it sealed the
envelope: a claim about itself only, which receivers use to judge the lag of that
sender's own items (`swarm.staleness`). There is no swarm-wide round.

Invariants:
- `decode_envelope` checks, in this order, size, structure, version, kind, swarm id and
  signature, and raises `WireError` with one reason per check; a returned envelope is
  authentic (the sender really signed it) but not yet fresh (replay and staleness checks
  belong to gossip and `swarm.staleness`). `decode_vouched_envelope` makes the same
  checks but the signature's (the bytes' signer vouched for them by other signatures:
  a chunk set's) and takes its `signing_digest` from that signer's word.
- The payload stays bytes here; it is decoded by kind with its own limits. An envelope
  of at least `_VIEW_AT_BYTES` in the framing every sender here writes (`_frame`: the
  array header, six scalars, the payload as one msgpack bin, the 64-byte signature,
  nothing after) is read without copying its payload: `payload` is then a read-only
  memoryview of the received bytes. Only the six small fields go through msgpack; any
  other layout takes the general decoder, so what is accepted and every refusal's
  reason are the same either way (`tests/swarm/test_envelope.py` checks both).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm import PROTOCOL_VERSION
from swarm.codec import Limits, bin_header, pack, scalars_then_bin, unpack
from swarm.errors import WireError
from swarm.identity import Identity, verify
from swarm.messages import PAYLOAD_TYPES

_DOMAIN = b"swarm/envelope/v3\x00"
MAX_SWARM_ID_CHARS = 128
MAX_KIND_BYTES = 32
MAX_SENDER_BYTES = 128
_FRAME_AT_BYTES = 1 << 16
"""Payloads from this size on are framed by hand (`_frame`), smaller ones by msgpack."""
_VIEW_AT_BYTES = 1 << 14
"""Envelopes from this size on are read without copying their payload (when framed as
`_frame` writes them); below it a copy costs less than looking for the framing."""
MAX_WIRE_INT = 2**53 - 1
"""`seq` and `policy_version` stay below 2**53, so every JSON/JavaScript peer reads them
exactly (senders start `seq` at wall-clock microseconds: ~1.8e15 today)."""


@dataclass(frozen=True)
class Envelope:
    version: int
    kind: str
    swarm_id: str
    sender: str
    seq: int
    policy_version: int
    payload: bytes | memoryview
    """bytes, or a read-only view of the received bytes (large envelopes, module docstring)."""
    signature: bytes = b""
    signing_digest: bytes = field(default=b"", repr=False, compare=False)
    """sha256 of the signing input, set by `seal` and `decode_envelope` (b"" on envelopes
    built otherwise): identifies what the sender signed, whatever encoding carried it,
    and costs no second pass over the payload (the signing input holds the payload's
    hash). A chunk set names its inner envelope by it."""

    def signed_bytes(self) -> bytes:
        """The signing input (module docstring); fields must be within the wire's ranges."""
        return _signing_input(
            self.version, self.kind, self.swarm_id, self.sender, self.seq,
            self.policy_version, hashlib.sha256(self.payload).digest(),
        )  # fmt: skip

    def encode(self) -> bytes:
        fields = (self.version, self.kind, self.swarm_id, self.sender, self.seq,
                  self.policy_version)  # fmt: skip
        if len(self.payload) < _FRAME_AT_BYTES:
            return pack([*fields, self.payload, self.signature])
        # The same bytes, the payload copied once (msgpack's packer grows its buffer).
        return _frame(fields, (self.payload,), len(self.payload), self.signature)


def _signing_input(
    version: int, kind: str, swarm_id: str, sender: str, seq: int, policy_version: int,
    payload_digest: bytes,
) -> bytes:  # fmt: skip
    kind_b, swarm, sender_b = (x.encode() for x in (kind, swarm_id, sender))
    return b"".join(
        (
            _DOMAIN,
            struct.pack(">HB", version, len(kind_b)),
            kind_b,
            struct.pack(">H", len(swarm)),
            swarm,
            struct.pack(">B", len(sender_b)),
            sender_b,
            struct.pack(">QQ", seq, policy_version),
            payload_digest,
        )
    )


def seal_parts(
    identity: Identity,
    *,
    kind: str,
    swarm_id: str,
    seq: int,
    policy_version: int,
    payload_parts: Sequence[bytes | memoryview],
) -> tuple[bytes, bytes]:
    """(wire bytes, signing digest) of the envelope `seal` would make for the payload
    `b"".join(payload_parts)`, byte for byte, without building that payload: its parts
    are hashed in place and copied once, into the wire bytes (large chunks)."""
    digest = hashlib.sha256()
    size = 0
    for part in payload_parts:
        digest.update(part)
        size += len(part)
    signed = _signing_input(
        PROTOCOL_VERSION, kind, swarm_id, identity.peer_id, seq, policy_version, digest.digest()
    )
    fields = (PROTOCOL_VERSION, kind, swarm_id, identity.peer_id, seq, policy_version)
    wire = _frame(fields, payload_parts, size, identity.sign(signed))
    return wire, hashlib.sha256(signed).digest()


def _frame(
    fields: tuple[int, str, str, str, int, int],
    payload_parts: Sequence[bytes | memoryview],
    payload_size: int,
    signature: bytes,
) -> bytes:
    """`pack([*fields, b"".join(payload_parts), signature])`, byte for byte (a msgpack
    array of 8 is its header byte and its items' encodings in order), in one copy."""
    head = b"\x98" + b"".join(pack(x) for x in fields)
    return b"".join((head, bin_header(payload_size), *payload_parts, pack(signature)))


def seal(
    identity: Identity,
    *,
    kind: str,
    swarm_id: str,
    seq: int,
    policy_version: int,
    payload: bytes,
) -> Envelope:
    """Build and sign an envelope from this node."""
    unsigned = Envelope(
        PROTOCOL_VERSION, kind, swarm_id, identity.peer_id, seq, policy_version, payload
    )
    signed = unsigned.signed_bytes()
    return Envelope(
        PROTOCOL_VERSION,
        kind,
        swarm_id,
        identity.peer_id,
        seq,
        policy_version,
        payload,
        identity.sign(signed),
        hashlib.sha256(signed).digest(),
    )


def decode_envelope(
    data: bytes,
    limits: Limits,
    swarm_id: str,
    refuse_sender: Callable[[str], bool] | None = None,
    *,
    signature_checked: bool = False,
) -> Envelope:
    """Decode and authenticate one envelope for `swarm_id`, or raise WireError.

    `refuse_sender(claimed_sender)` returning True refuses the envelope as `ignored_peer`
    before its signature is checked (saving the verification for peers already ignored;
    a forged claim of an ignored id is dropped either way, and nobody is blamed for it).
    `signature_checked`: this function already verified these exact bytes in this
    process (a transport's forward gate); every other check still runs.
    """
    fields, signature = _checked_fields(data, limits)
    sender = fields[3]
    if refuse_sender is not None and refuse_sender(sender):
        raise WireError("ignored_peer", sender[:64])
    signed = _signing_input(*fields[:6], hashlib.sha256(fields[6]).digest())
    if not signature_checked:
        verify(sender, signed, signature)
    return _for_swarm(Envelope(*fields, signature, hashlib.sha256(signed).digest()), swarm_id)


def decode_vouched_envelope(
    data: bytes | memoryview, limits: Limits, swarm_id: str, signer: str, vouched_digest: bytes
) -> Envelope:
    """Decode an envelope whose bytes `signer` already vouched for under `vouched_digest`
    (a chunk set's `inner_digest`, every chunk's signature checked), or raise WireError.
    Its own signature is not verified and its payload not hashed again: it must be
    `signer`'s own (`sender_mismatch`, checked before anything is blamed on its sender),
    and its `signing_digest` is `vouched_digest`, the signer's word (key anything by it
    per sender only: another signer could name the same digest)."""
    fields, signature = _checked_fields(data, limits)
    if fields[3] != signer:
        raise WireError("sender_mismatch", "chunks and inner envelope have other signers")
    return _for_swarm(Envelope(*fields, signature, vouched_digest), swarm_id)


def _checked_fields(
    data: bytes | memoryview, limits: Limits
) -> tuple[tuple[int, str, str, str, int, int, bytes | memoryview], bytes]:
    """The envelope's fields but the signature, each within the wire's types and ranges,
    and its 64-byte signature (unverified), or WireError."""
    framed = _read_framed(data, limits) if len(data) >= _VIEW_AT_BYTES else None
    if framed is not None:
        version, kind, env_swarm, sender, seq, policy_version, payload, signature = framed
    else:
        obj = unpack(data, limits)
        if not isinstance(obj, list) or len(obj) != 8:
            raise WireError("malformed", "an envelope is an array of 8 fields")
        version, kind, env_swarm, sender, seq, policy_version, payload, signature = obj
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 2**16:
        raise WireError("malformed", "version must be an int in [0, 65535]")
    if version != PROTOCOL_VERSION:
        raise WireError("bad_version", f"version {version}, this node speaks {PROTOCOL_VERSION}")
    if not isinstance(kind, str) or len(kind.encode()) > MAX_KIND_BYTES:
        raise WireError("malformed", "kind must be a short string")
    if kind not in PAYLOAD_TYPES:
        raise WireError("unknown_kind", repr(kind)[:64])
    if not isinstance(env_swarm, str) or len(env_swarm) > MAX_SWARM_ID_CHARS:
        raise WireError("malformed", "swarm id must be a short string")
    if not isinstance(sender, str) or len(sender.encode()) > MAX_SENDER_BYTES:
        raise WireError("malformed", "sender must be a short string")
    for name, value in (("seq", seq), ("policy_version", policy_version)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WIRE_INT:
            raise WireError("malformed", f"{name} must be an int in [0, 2**53 - 1]")
    if not isinstance(payload, (bytes, memoryview)) or not isinstance(signature, bytes):
        raise WireError("malformed", "payload and signature must be bytes")
    if len(signature) != 64:
        raise WireError("bad_signature", "an Ed25519 signature is 64 bytes")
    return (version, kind, env_swarm, sender, seq, policy_version, payload), signature


def _for_swarm(envelope: Envelope, swarm_id: str) -> Envelope:
    if envelope.swarm_id != swarm_id:
        # Checked after the signature so that the refusal can be blamed on its signer.
        raise WireError(
            "wrong_swarm", f"{envelope.swarm_id[:64]!r} is not {swarm_id!r}", signer=envelope.sender
        )
    return envelope


def _read_framed(data: bytes | bytearray | memoryview, limits: Limits) -> list[Any] | None:
    """The 8 fields of an envelope framed as `_frame` writes it, the payload a view of
    `data` (no copy); None when `data` is laid out otherwise or breaks a limit, for the
    general decoder to judge (and refuse with its reason)."""
    if len(data) > limits.max_message_bytes or data[0] != 0x98:
        return None
    head = scalars_then_bin(data, 6, max_str_len=limits.max_str_len, max_bin_len=0)
    if head is None:
        return None
    fields, begin, size = head
    end = begin + size
    if size > limits.max_bin_len or end + 66 != len(data) or data[end : end + 2] != b"\xc4\x40":
        return None
    view = memoryview(data).toreadonly()
    return [*fields, view[begin:end], bytes(view[end + 2 :])]
