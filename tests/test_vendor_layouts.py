"""Load-time layouts for the vendor kernels: exact bit layouts and the numerics of re-quantization.

The byte order, strides and shuffles are checked against the fakes' decoders (written from
the vendors' sources, see docs/vendor-apis.md) and against hand-computed values; the UE8M0
re-quantization against its error bound, element by element.
"""

from __future__ import annotations

import pytest
import torch
from fakes import installed
from fakes import unpack_ue8m0 as fake_unpack_ue8m0
from fp64_reference import dequant_weight, random_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8select.kernels import vendor_layouts as vl

# ----------------------------------------------------------------------------- TMA alignment


@pytest.mark.parametrize("mn, aligned", [(1, 4), (4, 4), (5, 8), (6, 8), (128, 128), (129, 132)])
def test_tma_aligned_size(mn: int, aligned: int) -> None:
    assert vl.tma_aligned_size(mn) == aligned
    assert vl.tma_aligned_size(mn, element_size=2) == -(-mn // 8) * 8


@pytest.mark.parametrize("m", [1, 3, 4, 6, 17])
def test_mn_major_tma_aligned_layout_and_values(m: int) -> None:
    scale = torch.rand(m, 5) + 0.1
    out = vl.mn_major_tma_aligned(scale)
    assert out.shape == (m, 5) and out.stride(1) == vl.tma_aligned_size(m)
    assert m == 1 or out.stride(0) == 1
    assert torch.equal(out, scale)
    assert vl.mn_major_tma_aligned(out) is out  # already laid out: no copy
    with installed("deep_gemm") as fake:
        theirs = fake.module.get_mn_major_tma_aligned_tensor(scale)
    assert theirs.stride() == out.stride() and torch.equal(theirs, out)


def test_expand_block_rows() -> None:
    scale = torch.arange(6, dtype=torch.float32).view(3, 2)
    out = vl.expand_block_rows(scale, 300)
    assert out.shape == (300, 2) and out.is_contiguous()
    assert torch.equal(out[0], scale[0]) and torch.equal(out[127], scale[0])
    assert torch.equal(out[128], scale[1]) and torch.equal(out[299], scale[2])


# ----------------------------------------------------------------------------- UE8M0


def test_is_power_of_two() -> None:
    assert vl.is_power_of_two(torch.tensor([[1.0, 0.5, 2.0**-40, 2.0**100]]))
    for bad in (3.0, 0.75, 0.0, -1.0, float("inf"), float("nan"), 1e-45):
        assert not vl.is_power_of_two(torch.tensor([[1.0, bad]])), bad


def test_pack_ue8m0_byte_order_by_hand() -> None:
    """Group 4j in the least significant byte; exponent e means 2**(e-127); padding groups are 0."""
    scale = torch.tensor([[0.5, 1.0, 2.0, 4.0, 8.0]])  # biased exponents 126..130
    packed = vl.pack_ue8m0(scale)
    assert packed.dtype == torch.int32 and packed.shape == (1, 2)
    word0 = 126 | (127 << 8) | (128 << 16) | (129 << 24)
    assert word0 >= 1 << 31 and int(packed[0, 0]) == word0 - (1 << 32)  # the top byte lands in the sign bit
    assert int(packed[0, 1]) == 130


@pytest.mark.parametrize("mn, groups", [(1, 1), (3, 4), (5, 5), (8, 9), (130, 56)])
def test_pack_ue8m0_layout_matches_deepgemm(mn: int, groups: int) -> None:
    gen = torch.Generator().manual_seed(mn * groups)
    scale = torch.exp2(torch.randint(-30, 10, (mn, groups), generator=gen).float())
    packed = vl.pack_ue8m0(scale)
    words = -(-groups // 4)
    assert packed.shape == (mn, words)
    assert packed.stride(1) == vl.tma_aligned_size(mn)  # even when words == 1 (size-1 dims keep the stride)
    assert mn == 1 or packed.stride(0) == 1
    assert torch.equal(fake_unpack_ue8m0(packed, groups), scale.double())
    assert torch.equal(vl.unpack_ue8m0(packed, groups), scale)
    with installed("deep_gemm", arch="sm100") as fake:
        theirs = fake.module.get_mn_major_tma_aligned_packed_ue8m0_tensor(scale)
    assert theirs.stride() == packed.stride() and torch.equal(theirs, packed)


def test_pack_ue8m0_rejects_scales_that_would_be_truncated() -> None:
    with pytest.raises(ValueError, match="power of two"):
        vl.pack_ue8m0(torch.tensor([[1.0, 3.0]]))
    vl.pack_ue8m0(torch.tensor([[1.0, 3.0]]), check=False)  # the hot path skips the check (no host sync)


@pytest.mark.parametrize("n, k", [(256, 512), (200, 320), (128, 128), (1, 130)])
def test_requantize_ue8m0_scales_are_powers_of_two_and_values_within_half_ulp(n: int, k: int) -> None:
    w, s = random_problem(n, k, seed=n + k)
    w2, s2 = vl.requantize_ue8m0(w, s)
    assert w2.shape == w.shape and w2.dtype == w.dtype and s2.shape == s.shape
    assert vl.is_power_of_two(s2)
    before, after = dequant_weight(w, s, (128, 128)), dequant_weight(w2, s2, (128, 128))
    # Rounding onto the new grid: half an ulp, i.e. 2**-4 relative for normal e4m3 values and
    # s2 * 2**-10 (half the subnormal quantum) below them.
    s2_full = s2.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    bound = torch.maximum(before.abs() * 2.0**-4, s2_full * 2.0**-10)
    assert bool(((after - before).abs() <= bound * (1 + 1e-12)).all())
    # no value saturated: the new scale is at least amax / 448
    assert float(after.abs().max()) <= float(before.abs().max()) * (1 + 2.0**-4)


def test_requantize_ue8m0_is_lossless_on_a_ue8m0_checkpoint() -> None:
    w, s = random_problem(256, 256, seed=3)
    s = torch.exp2(torch.ceil(torch.log2(s)))  # already powers of two
    w2, s2 = vl.requantize_ue8m0(w, s)
    assert torch.equal(dequant_weight(w2, s2, (128, 128)), dequant_weight(w, s, (128, 128)))


def test_requantize_ue8m0_all_zero_block_gets_a_finite_scale() -> None:
    w, s = random_problem(256, 256, seed=4)
    w[:128, :128] = 0
    w2, s2 = vl.requantize_ue8m0(w, s)
    assert vl.is_power_of_two(s2) and not w2[:128, :128].float().any()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_requantize_is_idempotent_and_packing_round_trips(n: int, k: int, seed: int) -> None:
    w, s = random_problem(n, k, seed=seed)
    w2, s2 = vl.requantize_ue8m0(w, s)
    w3, s3 = vl.requantize_ue8m0(w2, s2)  # already on a power-of-two grid: nothing changes
    assert torch.equal(dequant_weight(w3, s3, (128, 128)), dequant_weight(w2, s2, (128, 128)))
    per_row = vl.expand_block_rows(s2, n)
    assert torch.equal(vl.unpack_ue8m0(vl.pack_ue8m0(per_row), s2.shape[1]), per_row)


# ----------------------------------------------------------------------------- AMD


def test_e4m3fn_to_e4m3fnuz_is_exact_for_every_bit_pattern() -> None:
    bits = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)
    fn = bits.view(torch.float8_e4m3fn).reshape(16, 16)
    scale = torch.tensor([[0.375]])
    fnuz, scale2 = vl.e4m3fn_to_e4m3fnuz(fn, scale)
    assert fnuz.dtype == torch.float8_e4m3fnuz and float(scale2) == 0.75
    finite = ~torch.isnan(fn.float())
    assert torch.equal(fnuz.float()[finite] * 0.75, fn.float()[finite] * 0.375)
    assert not torch.isnan(fnuz.float()[finite]).any()  # 0x80 (-0) did not become NaN
    assert float(fnuz.view(torch.int8).reshape(-1)[0]) == 0  # the 0x80 pattern is now 0


def test_shuffle_weight_matches_aiter() -> None:
    w, _ = random_problem(64, 256, seed=5)
    ours = vl.shuffle_weight_16x16(w)
    with installed("aiter", gfx="gfx950") as fake:
        theirs = fake.module.ops.shuffle.shuffle_weight(w, layout=(16, 16))
    assert ours.dtype == w.dtype and ours.shape == w.shape and ours.is_contiguous()
    assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    assert not torch.equal(ours.view(torch.uint8), w.view(torch.uint8))
    # the first 16-byte chunk of the shuffled weight is row 0, bytes 0..15; the second row 1
    assert torch.equal(ours.view(torch.uint8)[0, :16], w.view(torch.uint8)[0, :16])
    assert torch.equal(ours.view(torch.uint8)[0, 16:32], w.view(torch.uint8)[1, :16])


@pytest.mark.parametrize("shape", [(24, 64), (32, 48)])
def test_shuffle_weight_rejects_shapes_it_cannot_tile(shape: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="shuffle needs"):
        vl.shuffle_weight_16x16(torch.zeros(shape).to(torch.float8_e4m3fn))
