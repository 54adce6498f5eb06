"""The msgpack codec refuses oversized, deep, extended or trailing input with WireError."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.codec import Limits, _depth_ok, pack, unpack
from swarm.errors import WireError


def reason(data: object, limits: Limits | None = None) -> str:
    with pytest.raises(WireError) as info:
        unpack(data, limits or Limits())  # type: ignore[arg-type]
    return info.value.reason


def test_roundtrip_plain_types() -> None:
    obj = {"a": [1, -2, 3.5, "x", b"\x00\xff", None, True, {"b": []}]}
    assert unpack(pack(obj), Limits()) == obj


def test_whole_message_over_limit_is_oversize() -> None:
    data = pack(b"x" * 200)
    assert reason(data, Limits(max_message_bytes=100)) == "oversize"
    assert unpack(data, Limits(max_message_bytes=len(data))) == b"x" * 200


@pytest.mark.parametrize(
    ("obj", "limits"),
    [
        ("s" * 100, Limits(max_str_len=50)),
        (b"b" * 100, Limits(max_bin_len=50)),
        (list(range(100)), Limits(max_array_len=50)),
        ({str(i): i for i in range(100)}, Limits(max_map_len=50)),
    ],
)
def test_container_over_limit_is_oversize(obj: object, limits: Limits) -> None:
    assert reason(pack(obj), limits) == "oversize"


def test_deep_nesting_refused() -> None:
    obj: list = []
    for _ in range(20):
        obj = [obj]
    assert reason(pack(obj), Limits(max_depth=8)) == "malformed"
    shallow: list = [[[1]]]
    assert unpack(pack(shallow), Limits(max_depth=8)) == shallow


def _depth_ok_recursive(obj: Any, remaining: int) -> bool:
    """The codec's first depth check (recursive, one call per value): the reference."""
    if remaining < 0:
        return False
    if isinstance(obj, list):
        return all(_depth_ok_recursive(item, remaining - 1) for item in obj)
    if isinstance(obj, dict):
        return all(_depth_ok_recursive(v, remaining - 1) for v in obj.values())
    return True


_VALUES = st.recursive(
    st.none() | st.integers() | st.text(max_size=3) | st.binary(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(_VALUES, st.integers(min_value=-1, max_value=7))
def test_depth_check_agrees_with_the_recursive_definition(obj: Any, max_depth: int) -> None:
    assert _depth_ok(obj, max_depth) == _depth_ok_recursive(obj, max_depth)


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_depth_check_at_the_boundary(depth: int) -> None:
    """A scalar at depth d needs max_depth >= d; an empty list at depth d too."""
    for leaf in (7, []):
        obj: Any = leaf
        for _ in range(depth):
            obj = [obj]
        assert _depth_ok(obj, depth) and not _depth_ok(obj, depth - 1)
    assert _depth_ok({"a": [1, {"b": []}]}, 3) and not _depth_ok({"a": [1, {"b": [0]}]}, 3)


def test_very_deep_nesting_refused_without_crash() -> None:
    data = b"\x91" * 100_000 + b"\x00"
    assert reason(data, Limits(max_message_bytes=1 << 20)) in {"malformed", "oversize"}


def test_too_many_containers_refused_before_they_are_all_built() -> None:
    """Found by benchmarks/fuzz_wire.py: 1 MiB of nested or empty arrays within every
    per-container limit cost ~1 s of CPU (mostly the garbage collector) and ~70 bytes
    per array before the depth check; 4 MB cost 3.7 s and 288 MiB."""
    limits = Limits(max_message_bytes=1 << 23, max_containers=65_536)
    inner = b"\xdc\x10\x00" + b"\x90" * 4096  # an array of 4096 empty arrays
    wide = b"\xdc\x04\x00" + inner * 1024  # 4M arrays, each container within its limits
    assert reason(wide, limits) == "oversize"
    assert reason(b"\xdc\x10\x00" + (b"\x91" * 200 + b"\xc0") * 4096, limits) == "oversize"
    fits = [[]] * 9
    assert unpack(pack(fits), Limits(max_containers=10)) == fits
    assert reason(pack([[]] * 10), Limits(max_containers=10)) == "oversize"
    assert reason(pack([{"a": 1}] * 10), Limits(max_containers=10)) == "oversize"


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb(msgpack.ExtType(5, b"abc")),
        msgpack.packb(msgpack.ExtType(1, b"")),
        msgpack.packb(msgpack.Timestamp(1, 0), datetime=False),
        b"\xc7\x00\x05",  # ext8 of length 0
        b"\xd4\x05\x00",  # fixext1
    ],
)
def test_ext_types_refused(data: bytes) -> None:
    assert reason(data) == "malformed"


@pytest.mark.parametrize(
    "data",
    [
        pack(1) + pack(2),  # a second complete object
        pack([1, 2]) + b"\x92",  # an incomplete second object
        pack({"a": 1}) + b"\x00",
        pack(b"x") + b"\xc1",  # a never-used byte
    ],
)
def test_trailing_bytes_refused(data: bytes) -> None:
    assert reason(data) == "malformed"


@pytest.mark.parametrize("data", [b"", b"\x92\x01", b"\xc4\x10abc", b"\xdd\x00\x00"])
def test_truncated_refused(data: bytes) -> None:
    assert reason(data) == "malformed"


def test_non_str_map_keys_refused() -> None:
    assert reason(msgpack.packb({1: 2})) == "malformed"


def test_invalid_utf8_refused() -> None:
    assert reason(b"\xa2\xff\xfe") == "malformed"


def test_reserved_byte_refused() -> None:
    assert reason(b"\xc1") == "malformed"


@pytest.mark.parametrize("data", ["text", 12, None, [1, 2]])
def test_non_bytes_input_refused(data: object) -> None:
    assert reason(data) == "malformed"


def test_bytearray_and_memoryview_accepted() -> None:
    data = pack([1, "a"])
    assert unpack(bytearray(data), Limits()) == [1, "a"]
    assert unpack(memoryview(data), Limits()) == [1, "a"]
