"""The delta packet codec: round trips, refusals with reasons, and the size of a share."""

from __future__ import annotations

import json
import pickle
import random
import struct
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from policy.compression import (
    DENSE_FP16,
    CompressedDelta,
    compress,
    decompress,
    dense_fp32_bytes,
    make_layout,
    rice_encode,
    rice_parameter,
)
from policy.delta_codec import DeltaCodecError, decode_packet, encode_packet
from policy.tiny import build_tiny_model
from swarm.errors import WireError
from swarm.messages import DeltaPacket, encode_payload

SHAPES = {"w": (40, 300), "b": (300,), "tiny": (3,)}


def _delta(seed: int = 0, shapes: dict = SHAPES) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * 1e-3 for n, s in shapes.items()}


def _topk(bits: int = 2) -> CompressedDelta:
    return compress(_delta(), None, density=1 / 32, bits=bits, chunk_size=512)[0]


def load_metadata(data: bytes) -> dict[str, str]:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])["__metadata__"]


def _reason(data: bytes, shapes: dict = SHAPES) -> str:
    with pytest.raises(DeltaCodecError) as info:
        decode_packet(data, shapes)
    return info.value.reason


def _with_arrays(compressed: CompressedDelta, **arrays: torch.Tensor) -> bytes:
    return encode_packet(replace(compressed, arrays={**compressed.arrays, **arrays}))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_topk_round_trip(bits: int) -> None:
    compressed = _topk(bits)
    data = encode_packet(compressed)
    decoded = decode_packet(data, SHAPES)
    assert decoded.encoding == compressed.encoding and decoded.bits == bits
    a, b = decompress(compressed, SHAPES), decompress(decoded, SHAPES)
    assert all(torch.equal(a[n], b[n]) for n in SHAPES)
    # it is a plain safetensors file: the reference parser reads the same arrays
    reference = load_safetensors(data)
    assert all(torch.equal(reference[k], decoded.arrays[k]) for k in reference)


def test_dense_round_trip() -> None:
    compressed, _ = compress(_delta(), None, encoding=DENSE_FP16)
    decoded = decode_packet(encode_packet(compressed), SHAPES)
    assert torch.equal(decoded.arrays["values"], compressed.arrays["values"])


def test_non_finite_values_are_refused() -> None:
    compressed = _topk()
    scales = compressed.arrays["scales"].clone()
    scales[1] = float("nan")
    assert _reason(_with_arrays(compressed, scales=scales)) == "non_finite"
    scales[1] = float("inf")
    assert _reason(_with_arrays(compressed, scales=scales)) == "non_finite"
    dense, _ = compress(_delta(), None, encoding=DENSE_FP16)
    values = dense.arrays["values"].clone()
    values[5] = float("nan")
    assert _reason(_with_arrays(dense, values=values)) == "non_finite"


def test_wrong_shapes_are_refused() -> None:
    data = encode_packet(_topk())
    assert _reason(data, {**SHAPES, "w": (300, 40)}) == "wrong_shape"
    assert _reason(data, {**SHAPES, "extra": (2,)}) == "wrong_shape"
    assert _reason(data, {"w": (40, 300), "b": (300,)}) == "wrong_shape"


def test_indices_outside_a_chunk_are_refused() -> None:
    compressed = _topk()
    layout = make_layout(SHAPES, compressed.chunk_size, compressed.k)
    r = rice_parameter(compressed.chunk_size, compressed.k)
    length, kept = int(layout.chunk_len[0]), int(layout.chunk_k[0])
    # every gap 0 except one in the first chunk: its last index is kept - 1 + gap
    for big in (10_000, length - kept + 1):
        gaps = torch.zeros(layout.n_selected, dtype=torch.int64)
        gaps[3] = big
        unary, low = rice_encode(gaps, r)
        assert _reason(_with_arrays(compressed, unary=unary, low=low)) == "bad_delta"
    gaps[3] = length - kept  # the last index exactly at the chunk's end: accepted
    unary, low = rice_encode(gaps, r)
    decode_packet(_with_arrays(compressed, unary=unary, low=low), SHAPES)


def test_negative_scales_and_wrong_sizes_are_refused() -> None:
    compressed = _topk()
    scales = compressed.arrays["scales"].clone()
    scales[0] = -1.0
    assert _reason(_with_arrays(compressed, scales=scales)) == "bad_delta"
    codes = compressed.arrays["codes"]
    assert _reason(_with_arrays(compressed, codes=codes[:-1])) == "bad_delta"
    assert _reason(_with_arrays(compressed, scales=scales[:-1].abs())) == "bad_delta"
    meta = {k: v for k, v in load_metadata(encode_packet(compressed)).items()}
    as_int8 = {**compressed.arrays, "codes": codes.to(torch.int8)}
    assert _reason(save_safetensors(as_int8, metadata=meta)) == "bad_delta"
    unary = compressed.arrays["unary"]
    assert _reason(_with_arrays(compressed, unary=unary[:-1])) == "bad_delta"


def test_bad_metadata_is_refused() -> None:
    compressed = _topk()
    assert _reason(encode_packet(replace(compressed, encoding="pickle"))) == "bad_delta"
    assert _reason(encode_packet(replace(compressed, k=0))) == "bad_delta"
    assert _reason(encode_packet(replace(compressed, bits=5))) == "bad_delta"
    assert _reason(encode_packet(replace(compressed, chunk_size=1 << 21))) == "bad_delta"
    assert _reason(encode_packet(replace(compressed, chunk_size=1, k=1))) == "bad_delta"
    arrays = {k: v.contiguous() for k, v in compressed.arrays.items()}
    extra_meta = save_safetensors(arrays, metadata={"format": "swarm-delta/1", "x": "1"})
    assert _reason(extra_meta) == "bad_delta"


def test_truncated_and_garbage_bytes_raise_only_the_codec_error() -> None:
    data = encode_packet(_topk())
    for cut in [0, 1, 7, 8, 9, 50, len(data) // 2, len(data) - 1]:
        assert _reason(data[:cut]) == "bad_delta"
    assert _reason(pickle.dumps({"w": torch.zeros(3)})) == "bad_delta"
    assert _reason(data + b"\0") == "bad_delta"
    huge_header = struct.pack("<Q", 1 << 40) + b"{}"
    assert _reason(huge_header) == "bad_delta"
    nested = b"[" * 5000 + b"]" * 5000
    assert _reason(struct.pack("<Q", len(nested)) + nested) == "bad_delta"
    dup = b'{"a": {}, "a": {}}'
    assert _reason(struct.pack("<Q", len(dup)) + dup) == "bad_delta"


def test_random_corruption_never_escapes_as_another_error() -> None:
    rng = random.Random(0)
    originals = [
        encode_packet(_topk()),
        encode_packet(compress(_delta(), None, encoding=DENSE_FP16)[0]),
    ]
    reasons: set[str] = set()
    for i in range(400):
        data = bytearray(originals[i % 2])
        header_len = struct.unpack("<Q", data[:8])[0]
        # half the flips in the header, half in the tensor data
        span = (8, 8 + header_len) if i % 4 < 2 else (8 + header_len, len(data))
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(*span)
            data[pos] = rng.randrange(256)
        try:
            decoded = decode_packet(bytes(data), SHAPES)
        except DeltaCodecError as exc:
            reasons.add(exc.reason)
            continue
        out = decompress(decoded, SHAPES)  # accepted means usable
        assert all(bool(torch.isfinite(t).all()) for t in out.values())
    assert reasons <= {"bad_delta", "wrong_shape", "non_finite"}
    assert "bad_delta" in reasons


def test_header_json_must_describe_1d_tensors() -> None:
    header = {"x": {"dtype": "U8", "shape": [2, 2], "data_offsets": [0, 4]}, "__metadata__": {}}
    raw = json.dumps(header).encode()
    assert _reason(struct.pack("<Q", len(raw)) + raw + b"\0" * 4) == "bad_delta"


def _packet_with_header(header: dict, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def test_header_values_of_unhashable_or_huge_types_are_refused() -> None:
    """Found by benchmarks/fuzz_wire.py: these escaped as TypeError and ValueError."""
    data = encode_packet(_topk())
    (length,) = struct.unpack("<Q", data[:8])
    header, body = json.loads(data[8 : 8 + length]), data[8 + length :]
    for dtype in ({"a": 1}, ["U8"]):
        entry = {**header["scales"], "dtype": dtype}
        assert _reason(_packet_with_header({**header, "scales": entry}, body)) == "bad_delta"
    # an integer literal longer than Python's int() limit (4300 digits) in the JSON header
    raw = json.dumps(header).replace('"k": "', '"k": ' + "9" * 4400 + ', "x": "', 1).encode()
    assert b"9" * 4400 in raw
    assert _reason(struct.pack("<Q", len(raw)) + raw + body) == "bad_delta"


def test_oversized_packets_are_refused_before_parsing() -> None:
    data = encode_packet(_topk())
    with pytest.raises(DeltaCodecError, match="over the bound"):
        decode_packet(data, SHAPES, max_bytes=len(data) - 1)
    assert issubclass(DeltaCodecError, WireError)


def test_tiny_model_share_is_over_150x_smaller_than_dense_fp32() -> None:
    model = build_tiny_model("tiny", seed=0)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    dense = dense_fp32_bytes(shapes)
    compressed, _ = compress(_delta(1, shapes), None)  # the defaults: 1/64, 2 bits, 4096
    data = encode_packet(compressed)
    packet = DeltaPacket("family", 0, compressed.encoding, data, {"version": "4"})
    wire = len(encode_payload(packet))
    print(
        f"tiny model: dense fp32 {dense} B, safetensors {len(data)} B ({dense / len(data):.0f}x),"
    )
    print(f"payload with DeltaPacket fields {wire} B ({dense / wire:.0f}x)")
    assert dense / wire >= 150
    decoded = decode_packet(data, shapes)
    assert decoded.numel == sum(p.numel() for p in model.parameters())
