"""msgpack with hard limits, set on the unpacker before anything is allocated.

Invariants:
- `unpack` refuses input longer than `Limits.max_message_bytes` before parsing, and the
  unpacker's own string/bin/array/map limits refuse any single oversized container.
- Nesting deeper than `Limits.max_depth` is refused.
- At most `Limits.max_containers` arrays and maps are built per message: they are counted
  as the unpacker builds them, so a message of a million tiny arrays is refused after the
  limit (`oversize`) instead of after allocating them all (about 70 bytes each, and
  seconds of CPU per MiB in the garbage collector).
- Only plain msgpack types come out (no ext types, no timestamps); maps have str keys.
- Every failure is a `WireError`; no other exception escapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from swarm.errors import WireError


@dataclass(frozen=True)
class Limits:
    """Hard bounds on one decoded message (whole envelope or one payload)."""

    max_message_bytes: int = 1 << 20
    max_str_len: int = 1 << 20
    max_bin_len: int = 1 << 20
    max_array_len: int = 4096
    max_map_len: int = 256
    max_depth: int = 8
    max_containers: int = 65_536
    """Arrays and maps in one message, all levels together."""


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


_BIN_LENGTH_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}
"""msgpack bin8/bin16/bin32 header byte -> bytes of its length field."""
_SCALAR_HEAD_BYTES = 1024
"""How far `scalars_then_bin` looks for its scalars: enough for an envelope's six fields
before its payload at their largest (kind 32 bytes, swarm id 128 characters of up to 4
UTF-8 bytes, sender 128 bytes, three ints), and for a chunk's four before its data."""


def scalars_then_bin(
    data: bytes | bytearray | memoryview, count: int, *, max_str_len: int, max_bin_len: int
) -> tuple[list[Any], int, int] | None:
    """Read `count` msgpack scalars from `data[1:]` (after a one-byte container header the
    caller checked) and the bin header right after them: (the scalars, where the bin's
    content begins, its length), without touching that content. None if the head is not
    `count` scalars within the limits (strings up to `max_str_len`, bins up to
    `max_bin_len`, no containers or exts) followed by a bin header: for a caller's
    general decoder to judge. The bin's length is not checked against `data`."""
    unpacker = msgpack.Unpacker(
        raw=False,
        max_str_len=max_str_len,
        max_bin_len=max_bin_len,
        max_array_len=0,
        max_map_len=0,
        max_ext_len=0,
    )
    unpacker.feed(bytes(data[1:_SCALAR_HEAD_BYTES]))
    try:
        scalars = [unpacker.unpack() for _ in range(count)]
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.OutOfData):
        return None
    start = 1 + unpacker.tell()
    width = _BIN_LENGTH_BYTES.get(data[start]) if start < len(data) else None
    if width is None:
        return None
    begin = start + 1 + width
    return scalars, begin, int.from_bytes(data[start + 1 : begin], "big")


def bin_header(length: int) -> bytes:
    """The msgpack header of a bin of `length` bytes, in the smallest form, as `pack`
    writes it: `bin_header(len(b)) + b == pack(b)` (lets a caller frame large bytes it
    holds in pieces without first joining them)."""
    if length < 0 or length >= 1 << 32:
        raise ValueError(f"a msgpack bin holds 0 to 2**32 - 1 bytes, not {length}")
    if length < 1 << 8:
        return b"\xc4" + length.to_bytes(1, "big")
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def _depth_ok(obj: Any, max_depth: int) -> bool:
    """No value nested deeper than `max_depth` (the top object is at depth 0), that is no
    non-empty list or dict at depth `max_depth`. Walks one level at a time, visiting only
    containers below the top (scalars are filtered out in bulk, never recursed into)."""
    if max_depth < 0:
        return False
    level = [obj] if isinstance(obj, (list, dict)) else []
    for _ in range(max_depth):
        if not level:
            return True
        deeper: list[Any] = []
        for container in level:
            items = container.values() if isinstance(container, dict) else container
            deeper += [x for x in items if isinstance(x, (list, dict))]
        level = deeper
    return not any(level)  # containers at depth max_depth must be empty


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError("malformed", f"msgpack ext type {code} not allowed")


class _ContainerBudget:
    """The unpacker's list/map hook: counts containers, refuses past the limit."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def __call__(self, container: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise WireError("oversize", "too many arrays and maps in one message")
        return container


def unpack(data: bytes, limits: Limits) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("malformed", "expected bytes")
    if len(data) > limits.max_message_bytes:
        raise WireError("oversize", f"{len(data)} bytes > limit {limits.max_message_bytes}")
    budget = _ContainerBudget(limits.max_containers)
    try:
        # unpackb reads the caller's buffer in place (an Unpacker would copy it whole
        # into its own buffer first) and refuses any byte after the first object.
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
            ext_hook=_refuse_ext,
            list_hook=budget,
            object_hook=budget,
        )
    except WireError:
        raise
    except msgpack.ExtraData:
        # Including an incomplete second object after a complete first one.
        raise WireError("malformed", "trailing bytes after message") from None
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        # msgpack signals exceeded limits, bad utf-8, bad bytes and truncation with these.
        text = str(exc)
        if "incomplete input" in text:
            raise WireError("malformed", "truncated msgpack") from None
        reason = "oversize" if "exceeds max" in text and "max_ext_len" not in text else "malformed"
        raise WireError(reason, f"{type(exc).__name__}: {exc}") from None
    if not _depth_ok(obj, limits.max_depth):
        raise WireError("malformed", f"nesting deeper than {limits.max_depth}")
    return obj
