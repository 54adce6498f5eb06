"""Compression: packing, top-k selection, quantization bounds, error feedback."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from policy.compression import (
    DENSE_FP16,
    TOPK,
    bytes_of,
    compress,
    decompress,
    dense_fp32_bytes,
    k_for,
    make_layout,
    pack_bits,
    rice_decode,
    rice_encode,
    rice_parameter,
    unpack_bits,
)

SHAPES = {"w": (40, 300), "b": (300,), "tiny": (3,), "big": (2, 4096)}


def _delta(seed: int, scale: float = 1e-3, shapes: dict = SHAPES) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}


def _sub(a: dict, b: dict) -> dict:
    return {n: a[n] - b[n] for n in a}


@pytest.mark.parametrize("width", [1, 2, 3, 5, 7, 8, 12])
def test_pack_bits_round_trip(width: int) -> None:
    g = torch.Generator().manual_seed(width)
    for count in (0, 1, 7, 8, 9, 1000):
        values = torch.randint(0, 1 << width, (count,), generator=g)
        packed = pack_bits(values, width)
        assert packed.dtype == torch.uint8 and packed.numel() == (count * width + 7) // 8
        assert torch.equal(unpack_bits(packed, width, count), values)


def test_unpack_bits_refuses_bad_lengths_and_padding() -> None:
    packed = pack_bits(torch.tensor([1, 2, 3]), 3)  # 9 bits -> 2 bytes
    with pytest.raises(ValueError):
        unpack_bits(packed[:1], 3, 3)
    with pytest.raises(ValueError):
        unpack_bits(torch.cat([packed, packed[:1]]), 3, 3)
    dirty = packed.clone()
    dirty[-1] |= 0x80  # a padding bit set
    with pytest.raises(ValueError, match="padding"):
        unpack_bits(dirty, 3, 3)


@pytest.mark.parametrize("r", [0, 1, 4, 6, 9])
def test_rice_round_trip(r: int) -> None:
    g = torch.Generator().manual_seed(r)
    gaps = torch.randint(0, 300, (500,), generator=g)
    unary, low = rice_encode(gaps, r)
    assert torch.equal(rice_decode(unary, low, r, 500), gaps)


def test_rice_decode_refuses_non_canonical_streams() -> None:
    gaps = torch.tensor([3, 0, 70, 5])
    unary, low = rice_encode(gaps, 2)
    with pytest.raises(ValueError):
        rice_decode(unary, low, 2, 5)  # one code too few
    with pytest.raises(ValueError):
        rice_decode(unary, low, 2, 3)  # one code too many
    with pytest.raises(ValueError, match="trailing"):
        rice_decode(torch.cat([unary, torch.zeros(1, dtype=torch.uint8)]), low, 2, 4)


def test_rice_parameter_and_k() -> None:
    assert k_for(1 / 64, 4096) == 64
    assert rice_parameter(4096, 64) == 6
    assert k_for(1.0, 100) == 100 and k_for(1e-9, 100) == 1


def test_layout_chunks_each_tensor_separately() -> None:
    layout = make_layout({"a": (80,), "b": (4, 40), "c": (1,)}, chunk_size=64, k=16)
    assert layout.chunk_start.tolist() == [0, 64, 80, 144, 208, 240]
    assert layout.chunk_len.tolist() == [64, 16, 64, 64, 32, 1]
    assert layout.chunk_k.tolist() == [16, 4, 16, 16, 8, 1]
    assert layout.n_selected == 61
    with pytest.raises(ValueError, match="chunk_size"):
        make_layout({"a": (80,)}, chunk_size=8, k=2)  # tiny chunks: too many scales


def test_dense_fp16_error_is_fp16_rounding() -> None:
    delta = _delta(0)
    compressed, residual = compress(delta, None, encoding=DENSE_FP16)
    out = decompress(compressed, SHAPES)
    for n in delta:
        err = (out[n] - delta[n]).abs()
        # half a unit in the last place: 2**-11 relative, 2**-25 absolute for subnormals
        bound = torch.clamp(delta[n].abs() * 2**-11, min=2**-25)
        assert bool((err <= bound).all())
        assert torch.equal(residual[n], delta[n] - out[n])
    assert bytes_of(compressed) * 2 == dense_fp32_bytes(SHAPES)


def _chunks_of(flat: torch.Tensor, c: int) -> list[torch.Tensor]:
    return [flat[i : i + c] for i in range(0, flat.numel(), c)]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_topk_keeps_the_largest_entries_and_bounds_the_error(bits: int) -> None:
    c, density = 256, 1 / 16
    g = torch.Generator().manual_seed(bits)
    # distinct magnitudes, so "the k largest" is unambiguous
    delta = {
        n: (torch.randperm(math.prod(s), generator=g).float() + 1.0).reshape(s)
        * torch.where(torch.rand(s, generator=g) < 0.5, -1e-4, 1e-4)
        for n, s in SHAPES.items()
    }
    compressed, residual = compress(delta, None, density=density, bits=bits, chunk_size=c)
    assert compressed.encoding == TOPK and compressed.k == 16
    out = decompress(compressed, SHAPES)
    k = compressed.k
    for n in delta:
        for orig, dec, res in zip(
            _chunks_of(delta[n].reshape(-1), c),
            _chunks_of(out[n].reshape(-1), c),
            _chunks_of(residual[n].reshape(-1), c),
            strict=True,
        ):
            kk = max(1, min(orig.numel(), math.ceil(k * orig.numel() / c)))
            expected = set(torch.topk(orig.abs(), kk).indices.tolist())
            kept = set(torch.nonzero(dec).reshape(-1).tolist())
            assert kept == expected
            scale = float(orig.abs().max())
            stored = scale * (1 + 2**-7) * (1 + 2**-8)  # the bfloat16 scale, rounded up
            idx = torch.tensor(sorted(expected))
            assert float((dec[idx] - orig[idx]).abs().max()) <= stored / 2**bits
            assert torch.equal(res, orig - dec)


def test_quantization_error_is_within_scale_over_levels() -> None:
    # one chunk, keep everything: isolates the quantizer
    g = torch.Generator().manual_seed(0)
    delta = {"x": torch.randn(4096, generator=g)}
    for bits in (2, 3, 4, 8):
        compressed, _ = compress(delta, None, density=1.0, bits=bits, chunk_size=4096)
        scale = float(compressed.arrays["scales"].float()[0])
        assert scale >= float(delta["x"].abs().max())
        err = (decompress(compressed, {"x": (4096,)})["x"] - delta["x"]).abs().max()
        assert float(err) <= scale / 2**bits
        assert float(err) > scale / 2 ** (bits + 2)  # the bound is not vacuous


def test_zero_delta_transmits_zeros() -> None:
    zero = {n: torch.zeros(s) for n, s in SHAPES.items()}
    compressed, residual = compress(zero, None)
    out = decompress(compressed, SHAPES)
    assert all(not out[n].any() and not residual[n].any() for n in SHAPES)


def test_error_feedback_transmits_the_sum_of_deltas() -> None:
    shapes = {"w": (64, 128), "b": (128,)}
    drift = _delta(100, scale=1e-3, shapes=shapes)
    residual = None
    sum_true = {n: torch.zeros(s) for n, s in shapes.items()}
    sum_ef = {n: torch.zeros(s) for n, s in shapes.items()}
    sum_plain = {n: torch.zeros(s) for n, s in shapes.items()}
    errors = []
    for step in range(200):
        noise = _delta(step, scale=2e-3, shapes=shapes)
        delta = {n: drift[n] + noise[n] for n in shapes}
        compressed, residual = compress(delta, residual, density=1 / 64, bits=2, chunk_size=1024)
        plain, _ = compress(delta, None, density=1 / 64, bits=2, chunk_size=1024)
        sent, sent_plain = decompress(compressed, shapes), decompress(plain, shapes)
        for n in shapes:
            sum_true[n] += delta[n]
            sum_ef[n] += sent[n]
            sum_plain[n] += sent_plain[n]
        # the invariant: transmitted + residual == everything given
        if step % 50 == 49:
            gap = max(float((sum_ef[n] + residual[n] - sum_true[n]).abs().max()) for n in shapes)
            assert gap < 1e-4
            norm_true = math.sqrt(sum(float(t.pow(2).sum()) for t in sum_true.values()))
            errors.append(
                math.sqrt(sum(float((sum_ef[n] - sum_true[n]).pow(2).sum()) for n in shapes))
                / norm_true
            )
    plain_error = math.sqrt(
        sum(float((sum_plain[n] - sum_true[n]).pow(2).sum()) for n in shapes)
    ) / math.sqrt(sum(float(t.pow(2).sum()) for t in sum_true.values()))
    print("relative error of the transmitted sum:", errors, "without feedback:", plain_error)
    # the residual stays bounded while the sum grows: the relative error shrinks ~1/T
    assert all(b < a for a, b in itertools.pairwise(errors))
    assert errors[-1] < errors[0] / 2
    assert errors[-1] < plain_error / 2


def test_compress_refuses_non_finite_and_decompress_wrong_shapes() -> None:
    delta = _delta(1)
    delta["b"][3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        compress(delta, None)
    compressed, _ = compress(_delta(1), None)
    with pytest.raises(ValueError, match="layout"):
        decompress(compressed, {**SHAPES, "b": (301,)})


def test_residual_keeps_the_deltas_device_and_names() -> None:
    delta = _delta(2)
    _, residual = compress(delta, None)
    assert set(residual) == set(delta)
    assert all(
        residual[n].dtype == torch.float32 and residual[n].shape == delta[n].shape for n in delta
    )
