"""The delta packet target: `decode_packet`, then `decompress`.

Part of the fuzz harness; `tests/swarm/fuzz_wire.py` says what it checks and how it runs.
"""

from __future__ import annotations

import copy
import json
import random
import struct
from collections.abc import Mapping
from functools import cache
from typing import Any

from tests.swarm.fuzz.harness import ACCEPTED, InvariantViolation, Outcome, Target
from tests.swarm.fuzz.mutate import (
    EDGE_INTS,
    hostile_value,
    mutate_bytes,
    mutate_value,
    random_bytes,
)

# ---- delta packets ----------------------------------------------------------------------

DELTA_SHAPES: dict[str, tuple[int, ...]] = {"w": (12, 40), "b": (40,), "t": (3,)}
META_VALUES = (
    "", "0", "1", "2", "3", "4", "8", "16", "63", "64", "65", "128", "523", "524", "1048576",
    "1048577", "007", "-1", "1e3", " 1", "1 ", "９", "999999999999999", "9999999999999999",
    "topk", "dense_fp16", "swarm-delta/1", "0" * 32, "f" * 32, "F" * 32,
)  # fmt: skip
BIG_INT_MARK = "\x00big int\x00"
"""Stands for an integer literal of 4400 digits in a header (more than Python's default
int/str conversion limit, so `json` cannot write it itself)."""
BF16_SPECIALS = (b"\xc0\x7f", b"\x80\x7f", b"\x80\xff", b"\x00\x80", b"\x80\xbf", b"\x7f\x7f")


@cache
def delta_corpus() -> tuple[bytes, ...]:
    """Real packets: top-k at several densities and widths, dense, and other shapes."""
    import torch

    from policy.compression import DENSE_FP16, compress
    from policy.delta_codec import encode_packet

    def delta(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {n: torch.randn(s, generator=g) * 1e-3 for n, s in shapes.items()}

    packets = []
    for i, (bits, density, chunk_size) in enumerate(
        [(2, 1 / 16, 64), (3, 1 / 8, 64), (4, 1 / 2, 64), (8, 1.0, 64), (2, 1 / 64, 128)]
    ):
        compressed, _ = compress(
            delta(DELTA_SHAPES, i), None, density=density, bits=bits, chunk_size=chunk_size
        )
        packets.append(encode_packet(compressed))
    packets.append(encode_packet(compress(delta(DELTA_SHAPES, 9), None, encoding=DENSE_FP16)[0]))
    other = {"w": (8, 8), "t": (3,)}
    packets.append(encode_packet(compress(delta(other, 1), None, chunk_size=64)[0]))
    return tuple(packets)


def _json_bytes(value: Any) -> bytes:
    """JSON text of a msgpack-able value (bytes as hex, non-string keys skipped)."""
    text = json.dumps(value, separators=(",", ":"), default=bytes.hex, skipkeys=True)
    return text.encode()


def _json_hostile(rng: random.Random) -> Any:
    """A JSON-able hostile value (as a peer's safetensors header could hold)."""
    value = hostile_value(rng)
    r = rng.random()
    if r < 0.1:
        return BIG_INT_MARK
    if r < 0.2:
        return rng.choice(EDGE_INTS)
    if r < 0.3:
        return [rng.choice(EDGE_INTS), rng.choice(EDGE_INTS)]
    return json.loads(_json_bytes(value))


def _split_packet(data: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _join_packet(header: dict[str, Any], body: bytes, rng: random.Random) -> bytes:
    raw = _json_bytes(header)
    raw = raw.replace(json.dumps(BIG_INT_MARK).encode(), b"9" * 4400)
    r = rng.random()
    if r < 0.05:  # a duplicated key
        key = json.dumps(rng.choice([k for k in header if isinstance(k, str)] or ["x"]))
        raw = raw[:1] + f"{key}:1,".encode() + raw[1:] if len(raw) > 2 else raw
    elif r < 0.08:
        raw = mutate_bytes(rng, raw)
    elif r < 0.10:
        raw = b"[" * rng.choice((100, 5000, 16_000)) + raw
    raw += b" " * ((-len(raw)) % 8)
    length = len(raw)
    if rng.random() < 0.04:
        length = rng.choice((0, 1, max(length - 1, 0), length + 1, 2**63, 2**64 - 1, 16_385))
    return struct.pack("<Q", length) + raw + body


def _mutate_entry(rng: random.Random, entry: dict[str, Any]) -> None:
    """One field of a tensor entry: a near miss or a hostile JSON value."""
    key = rng.choice(("dtype", "shape", "data_offsets"))
    value = entry.get(key)
    near = rng.random() < 0.5
    if key == "dtype" and near:
        entry[key] = rng.choice(("U8", "BF16", "F16", "F32", "I64", "BOOL", "", "u8"))
    elif key == "shape" and near and isinstance(value, list) and len(value) == 1:
        n = value[0] if isinstance(value[0], int) else 0
        entry[key] = rng.choice(([n + 1], [n - 1], [0], [-1], [n, 1], [], [2**63], [True]))
    elif key == "data_offsets" and near and isinstance(value, list) and len(value) == 2:
        a, b = (v if isinstance(v, int) else 0 for v in value)
        entry[key] = rng.choice(([a + 1, b + 1], [b, a], [a, b + 2], [a - 1, b], [a], [a, b, b]))
    else:
        entry[key] = _json_hostile(rng)


def _mutate_body(rng: random.Random, entry: dict[str, Any], body: bytearray) -> None:
    """Special values (NaN, Inf, -0, negative bf16; runs of 0x00/0xff) inside one tensor."""
    offsets = entry.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2):
        return
    begin, end = offsets
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin < end <= len(body)):
        return
    pos = rng.randrange(begin, end)
    fill = rng.choice((*BF16_SPECIALS, b"\x00" * 64, b"\xff" * 64, b"\x01"))
    if rng.random() < 0.3:
        fill = bytes([rng.choice((0, 0xFF, 0x55))]) * (end - pos)
    body[pos : min(end, pos + len(fill))] = fill[: end - pos]


def delta_packet_input(rng: random.Random) -> bytes:
    """A mutated safetensors delta packet (header fields, tensor bytes, lengths) or garbage."""
    packets = delta_corpus()
    base = rng.choice(packets)
    r = rng.random()
    if r < 0.03:
        return random_bytes(rng)
    if r < 0.30:
        return mutate_bytes(rng, base, packets)
    header, body = _split_packet(base)
    body_out = bytearray(body)
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.randrange(6)
        meta = header.get("__metadata__")
        entries = [v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
        if op == 0 and isinstance(meta, dict) and meta:  # a metadata value
            key = rng.choice(sorted(meta))
            choice = rng.random()
            if choice < 0.6:
                meta[key] = rng.choice(META_VALUES)
            elif choice < 0.7:
                del meta[key]
            elif choice < 0.8:
                meta[rng.choice(("extra", key.upper()))] = "1"
            else:
                meta[key] = _json_hostile(rng)
        elif op == 1 and entries:
            _mutate_entry(rng, rng.choice(entries))
        elif op == 2 and len(header) > 1:  # drop, rename or add a tensor entry
            name = rng.choice([k for k in header if k != "__metadata__"])
            choice = rng.random()
            if choice < 0.4:
                del header[name]
            elif choice < 0.7:
                header[name + "x"] = header.pop(name)
            else:
                header["values" if name != "values" else "scales"] = copy.deepcopy(header[name])
        elif op == 3 and entries:
            _mutate_body(rng, rng.choice(entries), body_out)
        elif op == 4:  # the header as a whole
            header = rng.choice(({}, {"__metadata__": meta}, header))
            if rng.random() < 0.2:
                mutated = mutate_value(rng, header)
                if not isinstance(mutated, dict):
                    return _json_bytes(mutated)
                header = mutated
        elif rng.random() < 0.5 and body_out:  # body length
            del body_out[rng.randrange(len(body_out)) :]
        else:
            body_out += rng.randbytes(rng.choice((1, 2, 8, 64)))
    return _join_packet(header, bytes(body_out), rng)


def check_delta_packet(data: bytes) -> Outcome:
    import torch

    from policy.compression import decompress
    from policy.delta_codec import decode_packet

    compressed = decode_packet(data, DELTA_SHAPES)
    delta = decompress(compressed, DELTA_SHAPES)  # documented never to fail once accepted
    for name, shape in DELTA_SHAPES.items():
        tensor = delta.get(name)
        if tensor is None or tuple(tensor.shape) != shape:
            raise InvariantViolation("wrong_shape", f"{name} decompressed to a wrong shape")
        if not bool(torch.isfinite(tensor).all()):
            raise InvariantViolation("non_finite", f"{name} decompressed to NaN/Inf")
    return ACCEPTED


def delta_packet_target() -> Target:
    from policy.delta_codec import DeltaCodecError

    return Target(
        name="delta_packet",
        doc="policy.delta_codec.decode_packet (tiny shapes), then decompress",
        generate=delta_packet_input,
        check=check_delta_packet,
        refusal=DeltaCodecError,
    )
