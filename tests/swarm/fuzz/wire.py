"""The wire decoder targets: envelopes and each payload kind.

Part of the fuzz harness; `tests/swarm/fuzz_wire.py` says what it checks and how it runs.
"""

from __future__ import annotations

from swarm.envelope import decode_envelope
from swarm.errors import WireError
from swarm.messages import (
    PAYLOAD_TYPES,
    decode_payload,
    encode_payload,
)
from tests.swarm.fuzz.corpus import envelope_input, payload_input
from tests.swarm.fuzz.harness import (
    ACCEPTED,
    BY_PEER,
    ENVELOPE_LIMITS,
    PAYLOAD_LIMITS,
    SWARM_ID,
    InvariantViolation,
    Outcome,
    Target,
)

# ---- wire decoder targets ---------------------------------------------------------------


def check_payload(kind: str, data: bytes) -> Outcome:
    message = decode_payload(kind, data, PAYLOAD_LIMITS)
    if not isinstance(message, PAYLOAD_TYPES[kind]):
        raise InvariantViolation("wrong_type", f"{kind} decoded to {type(message).__name__}")
    again = decode_payload(kind, encode_payload(message), PAYLOAD_LIMITS)
    if again != message:
        raise InvariantViolation("not_canonical", f"{kind} changed on re-encoding")
    return ACCEPTED


def check_envelope(data: bytes) -> Outcome:
    envelope = decode_envelope(data, ENVELOPE_LIMITS, SWARM_ID)
    if envelope.sender not in BY_PEER:
        raise InvariantViolation("forgery", f"accepted an envelope from {envelope.sender}")
    return check_payload(envelope.kind, envelope.payload)


def envelope_target() -> Target:
    return Target(
        name="envelope",
        doc="decode_envelope (wire limits), then the payload decoder of its kind",
        generate=envelope_input,
        check=check_envelope,
        refusal=WireError,
    )


def payload_target(kind: str) -> Target:
    return Target(
        name=kind,
        doc=f"decode_payload({kind!r}) with payload_limits",
        generate=lambda rng: payload_input(rng, kind),
        check=lambda data: check_payload(kind, data),
        refusal=WireError,
    )
