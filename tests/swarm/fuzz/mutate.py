"""The mutation engine: byte-level and structure-aware mutations of corpus items.

Part of the fuzz harness; `tests/swarm/fuzz_wire.py` says what it checks and how it runs.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

from tests.swarm.fuzz.harness import MAX_INPUT_BYTES

# ---- mutation engine --------------------------------------------------------------------

INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0x8F, 0x9F, 0xBF, 0xE0, 0xC0, 0xC1, 0xC2)
HOSTILE_HEADERS: tuple[bytes, ...] = (
    b"\xdc\xff\xff",  # array16 of 65535 items
    b"\xdd\xff\xff\xff\xff",  # array32 of 2**32-1 items
    b"\xde\xff\xff",  # map16 of 65535 pairs
    b"\xdf\xff\xff\xff\xff",  # map32 of 2**32-1 pairs
    b"\xd9\xff",  # str8 of 255
    b"\xda\xff\xff",  # str16
    b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
    b"\xc4\xff",  # bin8
    b"\xc5\xff\xff",  # bin16
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xc7\xff\x01",  # ext8
    b"\xc9\xff\xff\xff\xff\x01",  # ext32 of 4 GiB
    b"\xd4\x01\x00",  # fixext1
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp32
    b"\xd7\xff" + b"\xff" * 8,  # timestamp64, out of range nanoseconds
    b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # float64 NaN
    b"\xcb\xff\xf0\x00\x00\x00\x00\x00\x00",  # float64 -inf
    b"\xca\x7f\xc0\x00\x00",  # float32 NaN
    b"\xcf" + b"\xff" * 8,  # uint64 max
    b"\xd3\x80" + b"\x00" * 7,  # int64 min
    b"\xc1",  # the one byte msgpack never uses
    b"\x91" * 64,  # arrays nested 64 deep
    b"\x81\xa1k" * 32,  # maps nested 32 deep
    b"\x81\x01\x02",  # a map with an int key
    b"\x81\xc4\x01k\x02",  # a map with a bytes key
    b"\xa3\xed\xa0\x80",  # a str holding a UTF-16 surrogate (invalid UTF-8)
    b"\xa2\xc3\x28",  # a str of invalid UTF-8
)
EDGE_INTS = (
    0, 1, -1, 2, 3, 7, 255, 256, 4095, 4096, 4097, 65535, 65536, 65537, 2**24, 2**31 - 1,
    2**31, 2**32, 2**34, 2**34 + 1, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -(2**31),
    -(2**63),
)  # fmt: skip
EDGE_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 0.5, -1.0, 1e308, 5e-324, 2.0**63)
EDGE_TEXTS = (
    "", "x", "\x00", "é", "\u202e", "😀", "\ufeff", "add", "rg:acre", "topk", "dense_fp16",
    "<answer>1</answer>", "a" * 64, "a" * 65, "a" * 256, "a" * 257, "a" * 4097,
)  # fmt: skip
LONG_TEXT_CHARS = (1025, 4097, 65536, 65537, 70_000)


def random_bytes(rng: random.Random) -> bytes:
    size = rng.choice((0, 1, 2, 3, 8, 16, 64, 100, 256, 1000, 2048, 65_536))
    return rng.randbytes(rng.randint(0, size))


def mutate_bytes(rng: random.Random, data: bytes, others: Sequence[bytes] = ()) -> bytes:
    """1 to 8 stacked byte-level mutations of `data` (splicing draws from `others`)."""
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 5, 8))):
        n = len(out)
        op = rng.randrange(10) if n else 0
        if op == 0:  # insert random bytes or a hostile msgpack header
            pos = rng.randint(0, n)
            insert = (
                rng.choice(HOSTILE_HEADERS)
                if rng.random() < 0.5
                else rng.randbytes(rng.randint(1, 16))
            )
            out[pos:pos] = insert
        elif op == 1:  # flip bits
            for _ in range(rng.randint(1, 4)):
                out[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 2:
            out[rng.randrange(n)] = rng.choice(INTERESTING_BYTES)
        elif op == 3:
            out[rng.randrange(n)] = rng.randint(0xC0, 0xDF)  # a msgpack type byte
        elif op == 4:  # truncate
            del out[rng.randrange(n) :]
        elif op == 5:  # overwrite with a hostile header
            header = rng.choice(HOSTILE_HEADERS)
            pos = rng.randrange(n)
            out[pos : pos + len(header)] = header
        elif op == 6:  # duplicate a range
            begin = rng.randrange(n)
            piece = out[begin : begin + rng.randint(1, 64)] * rng.choice((1, 1, 2, 16))
            pos = rng.randint(0, n)
            out[pos:pos] = piece
        elif op == 7:  # delete a range
            begin = rng.randrange(n)
            del out[begin : begin + rng.randint(1, 32)]
        elif op == 8 and others:  # splice with another corpus item
            other = rng.choice(others)
            out = out[: rng.randint(0, n)] + bytearray(other[rng.randint(0, len(other)) :])
        else:
            out[rng.randrange(n)] = rng.randrange(256)
    return bytes(out[:MAX_INPUT_BYTES])


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    """A msgpack-able value of a random type, often at an edge (never unpackable)."""
    kind = rng.randrange(15)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(EDGE_INTS)
    if kind == 3:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 4:
        return rng.choice(EDGE_FLOATS)
    if kind == 5:
        return rng.choice(EDGE_TEXTS)
    if kind == 6:
        return rng.choice("a\x00é😀<") * rng.choice(LONG_TEXT_CHARS)
    if kind == 7:
        return rng.randbytes(rng.choice((0, 1, 31, 32, 33, 64, 1000)))
    if kind == 8 and depth < 3:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == 9 and depth < 3:
        keys = (rng.choice(EDGE_TEXTS) for _ in range(rng.randint(0, 4)))
        return {key: hostile_value(rng, depth + 1) for key in keys}
    if kind == 10:  # nested deeper than any limit
        value: Any = rng.choice((0, "x", {}))
        for _ in range(rng.choice((7, 8, 9, 10, 64, 300))):
            value = [value]
        return value
    if kind == 11:  # longer than the container limits
        return [rng.choice((0, 1.5, "x"))] * rng.choice((257, 4096, 4097, 5000))
    if kind == 12:
        return {f"k{i}": i for i in range(rng.choice((16, 17, 256, 257, 300)))}
    if kind == 13:  # non-string map keys (refused by strict_map_key)
        return {rng.choice((1, b"k", -1)): hostile_value(rng, 3)}
    return rng.uniform(-1e9, 1e9)


def _paths(obj: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[Any, ...]]:
    """Key paths into lists and maps (a few items of long lists; not too deep)."""
    if depth > 12:
        return
    if isinstance(obj, dict):
        items: list[tuple[Any, Any]] = list(obj.items())
    elif isinstance(obj, list):
        indexes = list(range(min(len(obj), 6)))
        if len(obj) > 6:
            indexes.append(len(obj) - 1)
        items = [(i, obj[i]) for i in indexes]
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key), depth + 1)


def _tweak(rng: random.Random, value: Any) -> Any:
    """A near miss of `value`: off by one, negated, one char more or less, emptied."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):  # kept within msgpack's int range
        near = rng.choice((value + 1, value - 1, -value, value * 2**32, value + 2**63))
        return min(max(near, -(2**63)), 2**64 - 1)
    if isinstance(value, float):
        whole = int(value) if math.isfinite(value) and abs(value) < 2**63 else 0
        return rng.choice((-value, value * 1e308, math.nan, float(whole), whole))
    if isinstance(value, str):
        return rng.choice((value + "x", value[:-1], value.upper(), value * 2, value.encode()))
    if isinstance(value, bytes):
        return rng.choice((value + b"\x00", value[:-1], value * 2, value.decode("latin-1")))
    if isinstance(value, list):
        return rng.choice(([], value + value[-1:], value[:-1], [value]))
    if isinstance(value, dict):
        return rng.choice(({}, [value], list(value.values())))
    return hostile_value(rng)


def mutate_value(rng: random.Random, obj: Any) -> Any:
    """Structure-aware mutation of a decoded msgpack value (a mutated deep copy)."""
    obj = copy.deepcopy(obj)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        paths = list(_paths(obj))
        if not paths or rng.random() < 0.03:
            return hostile_value(rng)
        path = rng.choice(paths)
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = rng.randrange(8)
        if op <= 2:
            parent[key] = hostile_value(rng)
        elif op == 3:
            parent[key] = _tweak(rng, parent[key])
        elif op == 4:
            del parent[key]
        elif op == 5:  # an extra field or item
            if isinstance(parent, dict):
                parent[rng.choice(("extra", "", "\x00", f"{key}_"))] = hostile_value(rng)
            else:
                parent.insert(key, copy.deepcopy(parent[key]))
        elif op == 6 and isinstance(parent, dict):  # a field under another name
            parent[rng.choice((str(key).upper(), f" {key}", f"{key}\x00"))] = parent.pop(key)
        else:  # a list grown past a bound, or a value repeated
            value = parent[key]
            if isinstance(value, list) and value:
                reps = rng.choice((2, 64, 257, 4097)) // len(value) + 1
                parent[key] = (value * reps)[:5000]
            else:
                parent[key] = [value] * rng.choice((2, 33, 257))
    return obj
