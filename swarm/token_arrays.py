"""Per-token arrays a rollout group may carry for each completion, as the wire packs them:
sampler logprobs (protocol 4: little-endian float32) and sampled token ids (protocol 5:
little-endian uint32).

Invariants: every `check_*`/`unpack_*` either returns a tuple that packs back to the same
bytes or raises `WireError("bad_payload")`; at most `MAX_LOGPROB_TOKENS` values per
completion; logprobs finite and <= 0 (rounded to float32 on checking, so what a sender
holds is what receivers get); token ids in [0, 2**32). What the values mean is the
receiver's to check (`policy.train_rows`).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from swarm.errors import WireError

MAX_LOGPROB_TOKENS = 16 * 1024
"""Most logprobs or token ids one completion may carry (a sender with longer completions
leaves the group's arrays out)."""


def _fail(msg: str) -> WireError:
    return WireError("bad_payload", msg)


def _bytes(value: Any, name: str, max_len: int) -> bytes:
    if not isinstance(value, bytes) or len(value) > max_len:
        raise _fail(f"{name} must be bytes of at most {max_len}")
    return value


def check_logprobs(values: Any) -> tuple[float, ...]:
    """One completion's sampler logprobs, checked and rounded to float32 (as on the wire)."""
    if len(values) > MAX_LOGPROB_TOKENS:
        raise _fail(f"at most {MAX_LOGPROB_TOKENS} logprobs per completion")
    try:
        packed = struct.pack(f"<{len(values)}f", *values)
    except (struct.error, TypeError, OverflowError):
        raise _fail("logprobs must be float32 numbers") from None
    rounded = struct.unpack(f"<{len(values)}f", packed)
    if not all(math.isfinite(v) and v <= 0 for v in rounded):
        raise _fail("logprobs must be finite and <= 0")
    return rounded


def pack_logprobs(values: tuple[float, ...]) -> bytes:
    """Little-endian float32, 4 bytes per token (the wire's `logprobs` entry)."""
    return struct.pack(f"<{len(values)}f", *values)


def unpack_logprobs(data: Any) -> tuple[float, ...]:
    """One `logprobs` entry from the wire, refused unless valid (see `check_logprobs`)."""
    data = _bytes(data, "logprobs entry", 4 * MAX_LOGPROB_TOKENS)
    if len(data) % 4:
        raise _fail("a logprobs entry must be 4 bytes per token")
    return check_logprobs(struct.unpack(f"<{len(data) // 4}f", data))


def check_token_ids(values: Any) -> tuple[int, ...]:
    """One completion's sampled token ids, checked: at most `MAX_LOGPROB_TOKENS`, each a
    uint32."""
    if len(values) > MAX_LOGPROB_TOKENS:
        raise _fail(f"at most {MAX_LOGPROB_TOKENS} token ids per completion")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in values):
        raise _fail("token ids must be ints in [0, 2**32)")
    return tuple(values)


def pack_token_ids(values: tuple[int, ...]) -> bytes:
    """Little-endian uint32, 4 bytes per token (the wire's `token_ids` entry)."""
    return struct.pack(f"<{len(values)}I", *values)


def unpack_token_ids(data: Any) -> tuple[int, ...]:
    """One `token_ids` entry from the wire, refused unless valid (see `check_token_ids`)."""
    data = _bytes(data, "token_ids entry", 4 * MAX_LOGPROB_TOKENS)
    if len(data) % 4:
        raise _fail("a token_ids entry must be 4 bytes per token")
    return struct.unpack(f"<{len(data) // 4}I", data)
