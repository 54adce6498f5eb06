"""A `CompressedDelta` to and from safetensors bytes (the `tensors` of a `DeltaPacket`).

Invariants:
- The bytes are a plain safetensors file (readable by `safetensors.torch.load`): the
  wire arrays as 1-D tensors, the integers as `__metadata__` strings. Never pickle.
  Encoding is deterministic (sorted JSON keys, tensors in name order), so equal deltas
  give equal bytes on every machine (safetensors' own writer orders metadata by hash).
- `decode_packet` parses the safetensors container itself (a bounded JSON header, exact
  offsets) instead of trusting a parser with a peer's bytes, and validates everything
  against the *local* parameter shapes before returning: total size bounded, header
  bounded, exactly the expected keys, dtypes and 1-D lengths, contiguous offsets, the
  layout hash and element count of the local model, finite non-negative scales and
  finite dense values, every index inside its chunk with canonical padding.
- Whatever the input bytes, `decode_packet` raises only `DeltaCodecError`, whose
  `reason` is `bad_delta` (malformed, oversized, unknown encoding, inconsistent arrays),
  `wrong_shape` (made for other parameter shapes) or `non_finite` (NaN/Inf values).
  A returned `CompressedDelta` decompresses without error.
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any

import torch

from policy.compression import (
    DENSE_FP16,
    ENCODINGS,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    TOPK,
    VALUE_BITS,
    CompressedDelta,
    Shapes,
    canonical_shapes,
    layout_of,
    packed_len,
    rice_parameter,
    validate,
)
from swarm.errors import WireError

FORMAT = "swarm-delta/1"
MAX_HEADER_BYTES = 16 * 1024
HEADER_ALLOWANCE = 64 * 1024
_META_KEYS = frozenset({"format", "encoding", "layout", "numel", "chunk_size", "k", "bits"})
_ARRAYS: dict[str, dict[str, str]] = {
    TOPK: {"unary": "U8", "low": "U8", "codes": "U8", "scales": "BF16"},
    DENSE_FP16: {"values": "F16"},
}
_TORCH_DTYPES = {"U8": torch.uint8, "BF16": torch.bfloat16, "F16": torch.float16}
_DTYPE_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}
_ITEMSIZE = {"U8": 1, "BF16": 2, "F16": 2}
_INT = re.compile(r"^(0|[1-9][0-9]{0,14})$")
_HEX = re.compile(r"^[0-9a-f]{32}$")


class DeltaCodecError(WireError):
    """A peer's delta bytes were refused; `reason` is bad_delta/wrong_shape/non_finite."""


def _bad(detail: str) -> DeltaCodecError:
    return DeltaCodecError("bad_delta", detail)


def max_packet_bytes(expected_shapes: Shapes) -> int:
    """The default size bound: a dense float16 delta of these shapes plus a header."""
    numel = sum(math.prod(s) for _, s in canonical_shapes(expected_shapes))
    return 2 * numel + HEADER_ALLOWANCE


def encode_packet(compressed: CompressedDelta) -> bytes:
    """Safetensors bytes for `compressed` (arrays as tensors, integers as metadata)."""
    meta = {
        "format": FORMAT,
        "encoding": compressed.encoding,
        "layout": compressed.layout_hash,
        "numel": str(compressed.numel),
        "chunk_size": str(compressed.chunk_size),
        "k": str(compressed.k),
        "bits": str(compressed.bits),
    }
    header: dict[str, Any] = {"__metadata__": meta}
    blobs = []
    offset = 0
    for name in sorted(compressed.arrays):
        t = compressed.arrays[name].detach().cpu().contiguous().reshape(-1)
        dtype = _DTYPE_NAMES.get(t.dtype)
        if dtype is None:
            raise ValueError(f"cannot encode {name} of dtype {t.dtype}")
        blob = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": dtype,
            "shape": [t.numel()],
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * ((-len(raw)) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return b"".join([struct.pack("<Q", len(raw)), raw, *blobs])


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _bad(f"duplicate header key {key[:64]!r}")
        out[key] = value
    return out


def _parse_container(data: bytes) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of safetensors bytes, checked for structure only."""
    if len(data) < 8:
        raise _bad("shorter than a safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(data):
        raise _bad("header length out of bounds")
    try:
        header = json.loads(
            data[8 : 8 + header_len].decode("utf-8"), object_pairs_hook=_no_duplicates
        )
    except DeltaCodecError:
        raise  # a duplicate key, from _no_duplicates
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad UTF-8 and bad JSON, and also an integer literal longer
        # than Python's int conversion limit (4300 digits), which json reports as such.
        raise _bad(f"header is not JSON: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise _bad("header is not a map")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise _bad("metadata must be a map of strings")
    body = memoryview(data)[8 + header_len :]
    entries = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise _bad(f"bad tensor entry {name[:64]!r}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _TORCH_DTYPES:  # a list is unhashable
            raise _bad(f"unexpected dtype for {name[:64]!r}")
        if (
            not isinstance(shape, list)
            or len(shape) != 1
            or not isinstance(shape[0], int)
            or isinstance(shape[0], bool)
            or shape[0] < 0
        ):
            raise _bad(f"{name[:64]!r} must be 1-D")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise _bad(f"bad offsets for {name[:64]!r}")
        begin, end = offsets
        if not 0 <= begin <= end <= len(body) or end - begin != shape[0] * _ITEMSIZE[dtype]:
            raise _bad(f"offsets of {name[:64]!r} out of bounds")
        entries.append((begin, end, name, dtype, shape[0]))
    entries.sort()
    cursor = 0
    tensors = {}
    for begin, end, name, dtype, count in entries:
        if begin != cursor:
            raise _bad("tensor data is not contiguous")
        cursor = end
        if count:
            tensors[name] = torch.frombuffer(bytearray(body[begin:end]), dtype=_TORCH_DTYPES[dtype])
        else:
            tensors[name] = torch.zeros(0, dtype=_TORCH_DTYPES[dtype])
    if cursor != len(body):
        raise _bad("trailing bytes after the tensor data")
    return meta, tensors


def _meta_int(meta: dict[str, str], key: str) -> int:
    value = meta[key]
    if not _INT.match(value):
        raise _bad(f"metadata {key} is not a small non-negative integer")
    return int(value)


def _from_container(meta: dict[str, str], tensors: dict[str, torch.Tensor]) -> CompressedDelta:
    if set(meta) != _META_KEYS:
        raise _bad("unexpected metadata keys")
    if meta["format"] != FORMAT:
        raise _bad("unknown format")
    encoding = meta["encoding"]
    if encoding not in ENCODINGS:
        raise _bad("unknown encoding")
    if not _HEX.match(meta["layout"]):
        raise _bad("bad layout hash")
    numel, chunk_size, k, bits = (
        _meta_int(meta, key) for key in ("numel", "chunk_size", "k", "bits")
    )
    expected = _ARRAYS[encoding]
    if set(tensors) != set(expected):
        raise _bad("unexpected tensor names")
    for name, t in tensors.items():
        if t.dtype != _TORCH_DTYPES[expected[name]]:
            raise _bad(f"{name} has the wrong dtype")
    if encoding == DENSE_FP16:
        if (chunk_size, k, bits) != (0, 0, 16):
            raise _bad("dense deltas carry chunk_size 0, k 0, bits 16")
    elif not (
        MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE
        and 1 <= k <= chunk_size
        and bits in VALUE_BITS
    ):
        raise _bad("chunk_size, k or bits out of range")
    return CompressedDelta(encoding, meta["layout"], numel, chunk_size, k, bits, tensors)


def decode_packet(
    data: bytes, expected_shapes: Shapes, *, max_bytes: int | None = None
) -> CompressedDelta:
    """Parse and fully validate a peer's delta bytes against the local shapes."""
    limit = max_packet_bytes(expected_shapes) if max_bytes is None else max_bytes
    if not isinstance(data, (bytes, bytearray)):
        raise _bad("not bytes")
    if len(data) > limit:
        raise _bad(f"{len(data)} bytes is over the bound of {limit}")
    compressed = _from_container(*_parse_container(bytes(data)))
    try:
        layout = layout_of(compressed, expected_shapes)
    except ValueError as exc:
        raise DeltaCodecError("wrong_shape", str(exc)) from None
    a = compressed.arrays
    if compressed.encoding == DENSE_FP16:
        if a["values"].numel() != layout.numel:
            raise _bad("dense values have the wrong length")
        if not bool(torch.isfinite(a["values"]).all()):
            raise DeltaCodecError("non_finite", "dense values")
        return compressed
    n = layout.n_selected
    r = rice_parameter(layout.chunk_size, layout.k)
    if a["scales"].numel() != layout.n_chunks:
        raise _bad("one scale per chunk expected")
    if a["codes"].numel() != packed_len(n, compressed.bits) or a["low"].numel() != packed_len(n, r):
        raise _bad("value or index arrays have the wrong length")
    if not bool(torch.isfinite(a["scales"]).all()):
        raise DeltaCodecError("non_finite", "scales")
    try:
        validate(compressed, layout)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    return compressed
