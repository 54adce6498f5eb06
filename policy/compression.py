"""Weight-delta compression: chunked top-k with error feedback, quantized values, packed
indices; and a dense fp16 baseline. Pure functions on torch tensors (no I/O).

Layout (shared by sender and receiver, derived only from the parameter shapes and two
integers, so nothing about it has to be trusted from a peer):
- Parameters are taken in sorted-name order and flattened; each tensor is cut into
  chunks of `chunk_size` elements (its last chunk may be shorter). A chunk of length L
  keeps `k_L = max(1, min(L, ceil(k * L / chunk_size)))` entries, so a full chunk keeps
  exactly `k` (`k = max(1, round(density * chunk_size))`).
- `layout_hash` names the sorted (name, shape) list; a receiver with different shapes
  refuses the packet.

The `topk` encoding, per chunk: the `k_L` entries of largest magnitude (ties broken by
`torch.topk`), in increasing index order. Four wire arrays:
- `scales` (bfloat16, one per chunk): the chunk's largest kept magnitude rounded *up*
  to bfloat16, so every kept value lies in `[-scale, scale]`.
- `codes` (uint8, `bits` per value, bit-packed LSB first): value `v` becomes the bin
  `floor((v / scale + 1) / 2 * 2**bits)` (clamped) of `2**bits` equal bins over
  `[-scale, scale]` and is decoded to that bin's centre. Invariant: the error of every
  kept value is at most `scale / 2**bits`.
- `low` and `unary` (uint8): the index gaps `g = i_j - i_{j-1} - 1` (with `i_{-1} = -1`)
  Rice-coded with parameter `r = floor(log2(chunk_size / k))`: the `r` low bits of each
  gap bit-packed in `low`, the quotient `g >> r` in unary in `unary` (that many 0 bits
  then a 1 bit; zero padding to a byte). About 8 bits per index at 1/64 density, versus
  12 for fixed-width offsets in a 4096 chunk.

The `dense_fp16` encoding: one `values` array (float16) holding every element, clamped
to the float16 range.

Error feedback: `compress(delta, residual)` compresses `acc = delta + residual` and
returns `new_residual = acc - decompress(compressed)` exactly (computed through the same
decoding path a receiver uses), so the sum of everything transmitted plus the current
residual always equals the sum of every delta given.

`validate` and `decompress` are the strict inverse used on peer data: they raise
`ValueError` on any inconsistency (wrong array sizes, non-canonical padding, indices out
of a chunk, non-finite or negative scales), never another exception type for well-typed
arrays. Everything is computed on the CPU (bit-exact on every machine).

The dense float16 baseline rounds to half a unit in the last place: 2**-11 relative,
but 2**-25 absolute below 2**-14 (subnormals), where small deltas lose precision; the
residual carries what was lost, as for `topk`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

TOPK = "topk"
DENSE_FP16 = "dense_fp16"
ENCODINGS = (TOPK, DENSE_FP16)
VALUE_BITS = (2, 3, 4, 8)
MIN_CHUNK_SIZE = 64
MAX_CHUNK_SIZE = 1 << 20
FP16_MAX = 65504.0

Shapes = Mapping[str, Sequence[int]]


# ---- layout -----------------------------------------------------------------------------


def canonical_shapes(shapes: Shapes) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) pairs in sorted-name order, shapes as int tuples."""
    return tuple((name, tuple(int(d) for d in shapes[name])) for name in sorted(shapes))


def layout_hash(shapes: Shapes) -> str:
    """A short stable name for a parameter layout (sorted names and shapes)."""
    text = json.dumps([[n, list(s)] for n, s in canonical_shapes(shapes)], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def k_for(density: float, chunk_size: int) -> int:
    """Entries kept per full chunk for a density."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    return max(1, min(chunk_size, round(density * chunk_size)))


def rice_parameter(chunk_size: int, k: int) -> int:
    """`floor(log2(chunk_size / k))`: near-optimal for gaps averaging `chunk_size / k`."""
    return max(0, (chunk_size // k).bit_length() - 1)


@dataclass(frozen=True)
class Layout:
    """Where every chunk lives in the flat (sorted-name) parameter vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    numels: tuple[int, ...]
    numel: int
    chunk_size: int
    k: int
    chunk_start: Tensor  # int64 [n_chunks], flat offset of each chunk (none when dense)
    chunk_len: Tensor  # int64 [n_chunks]
    chunk_k: Tensor  # int64 [n_chunks], entries kept per chunk
    n_selected: int  # sum(chunk_k)

    @property
    def n_chunks(self) -> int:
        return int(self.chunk_len.numel())


@lru_cache(maxsize=4)  # few settings in a swarm; bounds what peers can make us hold
def _layout_cached(
    pairs: tuple[tuple[str, tuple[int, ...]], ...], chunk_size: int, k: int
) -> Layout:
    starts: list[Tensor] = []
    lens: list[Tensor] = []
    offset = 0
    numels = []
    for _, shape in pairs:
        n = math.prod(shape)
        numels.append(n)
        if n and chunk_size:
            begin = torch.arange(0, n, chunk_size, dtype=torch.int64)
            starts.append(begin + offset)
            lens.append(torch.clamp(n - begin, max=chunk_size))
        offset += n
    chunk_start = torch.cat(starts) if starts else torch.zeros(0, dtype=torch.int64)
    chunk_len = torch.cat(lens) if lens else torch.zeros(0, dtype=torch.int64)
    if chunk_size:
        chunk_k = torch.clamp((k * chunk_len + chunk_size - 1) // chunk_size, min=1)
        chunk_k = torch.minimum(chunk_k, chunk_len)
    else:
        chunk_k = chunk_len
    return Layout(
        names=tuple(n for n, _ in pairs),
        shapes=tuple(s for _, s in pairs),
        numels=tuple(numels),
        numel=offset,
        chunk_size=chunk_size,
        k=k,
        chunk_start=chunk_start,
        chunk_len=chunk_len,
        chunk_k=chunk_k,
        n_selected=int(chunk_k.sum()),
    )


def make_layout(shapes: Shapes, chunk_size: int, k: int) -> Layout:
    """The chunk layout of `shapes` for `chunk_size` and `k` (see module docstring);
    `chunk_size == k == 0` is the dense layout (no chunks)."""
    if chunk_size == k == 0:
        return _layout_cached(canonical_shapes(shapes), 0, 0)
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(
            f"chunk_size must be in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}], got {chunk_size}"
        )
    if not 1 <= k <= chunk_size:
        raise ValueError(f"k must be in [1, chunk_size], got {k}")
    return _layout_cached(canonical_shapes(shapes), chunk_size, k)


# ---- bit packing ------------------------------------------------------------------------


def pack_bits(values: Tensor, width: int) -> Tensor:
    """Pack non-negative ints `< 2**width` into uint8, LSB first, zero padded to a byte."""
    if width == 0 or values.numel() == 0:
        return torch.zeros(0, dtype=torch.uint8)
    if width == 8:
        return values.to(torch.uint8).reshape(-1)
    shifts = torch.arange(width, dtype=torch.int64)
    bits = ((values.reshape(-1, 1).to(torch.int64) >> shifts) & 1).to(torch.uint8).reshape(-1)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, torch.zeros(pad, dtype=torch.uint8)])
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.int64)
    return (bits.view(-1, 8).to(torch.int64) * weights).sum(1).to(torch.uint8)


def packed_len(count: int, width: int) -> int:
    """Bytes `pack_bits` produces for `count` values of `width` bits."""
    return (count * width + 7) // 8


def _bits_of(data: Tensor) -> Tensor:
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((data.reshape(-1, 1) >> shifts) & 1).reshape(-1)


def unpack_bits(data: Tensor, width: int, count: int) -> Tensor:
    """Inverse of `pack_bits` (int64). Raises ValueError unless `data` is canonical."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError("packed data must be a 1-D uint8 tensor")
    if data.numel() != packed_len(count, width):
        expected = packed_len(count, width)
        raise ValueError(f"packed data holds {data.numel()} bytes, expected {expected}")
    if width == 0 or count == 0:
        return torch.zeros(count, dtype=torch.int64)
    if width == 8:
        return data.to(torch.int64)
    bits = _bits_of(data)
    if bool(bits[count * width :].any()):
        raise ValueError("non-zero padding bits")
    weights = torch.tensor([1 << i for i in range(width)], dtype=torch.int64)
    return (bits[: count * width].view(count, width).to(torch.int64) * weights).sum(1)


def rice_encode(gaps: Tensor, r: int) -> tuple[Tensor, Tensor]:
    """Rice-code non-negative `gaps`: (unary quotients, packed low bits)."""
    gaps = gaps.to(torch.int64)
    low = pack_bits(gaps & ((1 << r) - 1), r)
    q = gaps >> r
    total = int(q.sum()) + q.numel()
    bits = torch.zeros(total + ((-total) % 8), dtype=torch.uint8)
    if q.numel():
        bits[torch.cumsum(q + 1, 0) - 1] = 1
    unary = pack_bits(bits, 1) if bits.numel() else torch.zeros(0, dtype=torch.uint8)
    return unary, low


def rice_decode(unary: Tensor, low: Tensor, r: int, count: int) -> Tensor:
    """Inverse of `rice_encode` for exactly `count` gaps; ValueError unless canonical."""
    if unary.dtype != torch.uint8 or unary.dim() != 1:
        raise ValueError("unary data must be a 1-D uint8 tensor")
    lows = unpack_bits(low, r, count)
    if count == 0:
        if unary.numel():
            raise ValueError("unary data for zero gaps")
        return lows
    bits = _bits_of(unary)
    ends = torch.nonzero(bits).reshape(-1)
    if ends.numel() != count:
        raise ValueError(f"unary data holds {ends.numel()} codes, expected {count}")
    if bits.numel() - int(ends[-1]) - 1 >= 8:
        raise ValueError("unary data has trailing bytes")
    q = torch.diff(ends, prepend=torch.tensor([-1], dtype=torch.int64)) - 1
    return (q << r) | lows


# ---- quantization -----------------------------------------------------------------------


def round_scale_up(scale: Tensor) -> Tensor:
    """float32 magnitudes -> bfloat16 scales no smaller than them (finite inputs)."""
    return (scale.float() * (1.0 + 2.0**-7)).to(torch.bfloat16)


def quantize(values: Tensor, scales: Tensor, bits: int) -> Tensor:
    """Bin of each value among `2**bits` equal bins over `[-scale, scale]` (int64)."""
    levels = 1 << bits
    s = scales.float()
    unit = torch.where(s > 0, values.float() / torch.where(s > 0, s, 1.0), 0.0)
    return torch.clamp(torch.floor((unit + 1.0) * 0.5 * levels), 0, levels - 1).to(torch.int64)


def dequantize(codes: Tensor, scales: Tensor, bits: int) -> Tensor:
    """Centre of each code's bin, times its scale (float32)."""
    levels = 1 << bits
    return scales.float() * (-1.0 + (2.0 * codes.float() + 1.0) / levels)


# ---- compressed deltas ------------------------------------------------------------------


@dataclass(frozen=True)
class CompressedDelta:
    """What one share puts on the wire: the arrays plus the integers that give the layout.

    `arrays` for `topk`: `unary`, `low`, `codes` (uint8) and `scales` (bfloat16);
    for `dense_fp16`: `values` (float16). `chunk_size` and `k` are 0 for `dense_fp16`,
    `bits` is 16.
    """

    encoding: str
    layout_hash: str
    numel: int
    chunk_size: int
    k: int
    bits: int
    arrays: dict[str, Tensor]


def bytes_of(compressed: CompressedDelta) -> int:
    """Payload bytes of the wire arrays (without the container's header)."""
    return sum(int(a.numel()) * a.element_size() for a in compressed.arrays.values())


def dense_fp32_bytes(shapes: Shapes) -> int:
    """Bytes of the same parameters as dense float32 (the reference for ratios)."""
    return 4 * sum(math.prod(s) for _, s in canonical_shapes(shapes))


def _flat(delta: Mapping[str, Tensor], layout: Layout) -> Tensor:
    parts = []
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        t = delta[name]
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} != {shape}")
        parts.append(t.detach().reshape(-1).to(device="cpu", dtype=torch.float32))
    return torch.cat(parts) if parts else torch.zeros(0)


def _unflat(flat: Tensor, layout: Layout, device: torch.device | str) -> dict[str, Tensor]:
    out = {}
    for name, shape, part in zip(
        layout.names, layout.shapes, torch.split(flat, list(layout.numels)), strict=True
    ):
        out[name] = part.reshape(shape).to(device)
    return out


def _select_topk(flat: Tensor, layout: Layout) -> tuple[Tensor, Tensor, Tensor]:
    """(gaps, values, scales) of the per-chunk top-k of `flat`, chunk by chunk."""
    c, k = layout.chunk_size, layout.k
    gaps, values, maxes = [], [], []
    offset = 0
    for n in layout.numels:
        tensor = flat[offset : offset + n]
        offset += n
        full = n // c
        blocks = []
        if full:
            blocks.append((tensor[: full * c].view(full, c), k))
        rem = n - full * c
        if rem:
            rem_k = max(1, min(rem, (k * rem + c - 1) // c))
            blocks.append((tensor[full * c :].view(1, rem), rem_k))
        for block, kk in blocks:
            idx = torch.topk(block.abs(), kk, dim=1, sorted=False).indices.sort(dim=1).values
            vals = block.gather(1, idx)
            prev = torch.cat([torch.full((idx.shape[0], 1), -1, dtype=idx.dtype), idx[:, :-1]], 1)
            gaps.append((idx - prev - 1).reshape(-1))
            values.append(vals.reshape(-1))
            maxes.append(vals.abs().amax(dim=1))
    empty = torch.zeros(0)
    return (
        torch.cat(gaps) if gaps else empty.long(),
        torch.cat(values) if values else empty,
        torch.cat(maxes) if maxes else empty,
    )


def _positions(layout: Layout, gaps: Tensor) -> Tensor:
    """Flat positions from per-chunk gaps; ValueError if an index leaves its chunk."""
    if layout.n_selected == 0:
        return torch.zeros(0, dtype=torch.int64)
    steps = torch.cumsum(gaps + 1, 0)
    first = torch.cumsum(layout.chunk_k, 0) - layout.chunk_k
    base = torch.where(first > 0, steps[(first - 1).clamp(min=0)], 0)
    within = steps - torch.repeat_interleave(base, layout.chunk_k) - 1
    last = within[first + layout.chunk_k - 1]
    if bool((last >= layout.chunk_len).any()):
        raise ValueError("an index lies outside its chunk")
    return torch.repeat_interleave(layout.chunk_start, layout.chunk_k) + within


def compress_flat_topk(flat: Tensor, layout: Layout, bits: int) -> dict[str, Tensor]:
    """The `topk` wire arrays for a flat float32 vector."""
    if bits not in VALUE_BITS:
        raise ValueError(f"bits must be one of {VALUE_BITS}, got {bits}")
    gaps, values, maxes = _select_topk(flat, layout)
    scales = round_scale_up(maxes)
    per_value = torch.repeat_interleave(scales.float(), layout.chunk_k)
    codes = quantize(values, per_value, bits)
    unary, low = rice_encode(gaps, rice_parameter(layout.chunk_size, layout.k))
    return {"unary": unary, "low": low, "codes": pack_bits(codes, bits), "scales": scales}


def compress(
    delta: Mapping[str, Tensor],
    residual: Mapping[str, Tensor] | None,
    *,
    encoding: str = TOPK,
    density: float = 1 / 64,
    bits: int = 2,
    chunk_size: int = 4096,
) -> tuple[CompressedDelta, dict[str, Tensor]]:
    """Compress `delta + residual`; return it and the new residual (error feedback).

    `delta` and `residual` map parameter names to tensors of matching shapes (any float
    dtype and device); the new residual is float32 on each delta tensor's device.
    Raises ValueError for a non-finite accumulated delta or a bad setting.
    """
    shapes = {name: tuple(t.shape) for name, t in delta.items()}
    if encoding == DENSE_FP16:
        layout = make_layout(shapes, 0, 0)
    elif encoding == TOPK:
        layout = make_layout(shapes, chunk_size, k_for(density, chunk_size))
    else:
        raise ValueError(f"unknown encoding {encoding!r}")
    flat = _flat(delta, layout)
    if residual is not None and set(residual) != set(delta):
        raise ValueError("residual and delta name different parameters")
    if residual is not None:
        flat = flat + _flat(residual, layout)
    if not bool(torch.isfinite(flat).all()):
        raise ValueError("the delta to compress holds NaN or Inf")
    lhash = layout_hash(shapes)
    if encoding == DENSE_FP16:
        values = flat.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
        compressed = CompressedDelta(DENSE_FP16, lhash, layout.numel, 0, 0, 16, {"values": values})
    else:
        arrays = compress_flat_topk(flat, layout, bits)
        compressed = CompressedDelta(
            TOPK, lhash, layout.numel, layout.chunk_size, layout.k, bits, arrays
        )
    transmitted = _decompress_flat(compressed, layout)
    new_flat = flat - transmitted
    devices = {name: t.device for name, t in delta.items()}
    new_residual = {
        name: t.to(devices[name]) for name, t in _unflat(new_flat, layout, "cpu").items()
    }
    return compressed, new_residual


def _decode_topk(compressed: CompressedDelta, layout: Layout) -> tuple[Tensor, Tensor]:
    """(flat positions, float32 values) of a `topk` delta; ValueError if inconsistent."""
    a = compressed.arrays
    if compressed.bits not in VALUE_BITS:
        raise ValueError(f"bits must be one of {VALUE_BITS}")
    scales = a["scales"]
    if scales.dtype != torch.bfloat16 or tuple(scales.shape) != (layout.n_chunks,):
        raise ValueError("scales must be bfloat16, one per chunk")
    scales_f = scales.float()
    if not bool(torch.isfinite(scales_f).all()):
        raise ValueError("scales hold NaN or Inf")
    if bool((scales_f < 0).any()):
        raise ValueError("negative scale")
    r = rice_parameter(layout.chunk_size, layout.k)
    gaps = rice_decode(a["unary"], a["low"], r, layout.n_selected)
    positions = _positions(layout, gaps)
    codes = unpack_bits(a["codes"], compressed.bits, layout.n_selected)
    values = dequantize(codes, torch.repeat_interleave(scales_f, layout.chunk_k), compressed.bits)
    return positions, values


def _check_dense(compressed: CompressedDelta, layout: Layout) -> Tensor:
    values = compressed.arrays["values"]
    if values.dtype != torch.float16 or tuple(values.shape) != (layout.numel,):
        raise ValueError("dense values must be float16 of the layout's size")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("dense values hold NaN or Inf")
    return values


def validate(compressed: CompressedDelta, layout: Layout) -> None:
    """Raise ValueError unless `compressed` decodes cleanly under `layout` (no dense
    allocation: the checks `decompress` would fail on, done ahead of time)."""
    if set(compressed.arrays) != (
        {"values"} if compressed.encoding == DENSE_FP16 else {"unary", "low", "codes", "scales"}
    ):
        raise ValueError("unexpected arrays for the encoding")
    if compressed.encoding == DENSE_FP16:
        _check_dense(compressed, layout)
    elif compressed.encoding == TOPK:
        _decode_topk(compressed, layout)
    else:
        raise ValueError(f"unknown encoding {compressed.encoding!r}")


def _decompress_flat(compressed: CompressedDelta, layout: Layout) -> Tensor:
    if compressed.encoding == DENSE_FP16:
        return _check_dense(compressed, layout).float()
    if compressed.encoding != TOPK:
        raise ValueError(f"unknown encoding {compressed.encoding!r}")
    positions, values = _decode_topk(compressed, layout)
    flat = torch.zeros(layout.numel, dtype=torch.float32)
    flat[positions] = values
    return flat


def layout_of(compressed: CompressedDelta, shapes: Shapes) -> Layout:
    """The layout `compressed` claims, checked against local `shapes` (ValueError)."""
    if compressed.layout_hash != layout_hash(shapes):
        raise ValueError("layout hash differs from the local parameter shapes")
    if compressed.encoding == DENSE_FP16:
        layout = make_layout(shapes, 0, 0)
    else:
        layout = make_layout(shapes, compressed.chunk_size, compressed.k)
    if compressed.numel != layout.numel:
        raise ValueError("element count differs from the local parameter shapes")
    return layout


def decompress(
    compressed: CompressedDelta, shapes: Shapes, device: torch.device | str = "cpu"
) -> dict[str, Tensor]:
    """The float32 delta a `CompressedDelta` stands for; ValueError if inconsistent."""
    layout = layout_of(compressed, shapes)
    return _unflat(_decompress_flat(compressed, layout), layout, device)
