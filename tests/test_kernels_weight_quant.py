"""Tests for fp8select.kernels.weight_quant.quantize_weight (pure torch, CPU).

Expected values are computed here independently: block amax in float64, and the fp8 rounding
error bound of e4m3 (half a unit in the last place: 2**-4 relative for normal values, half the
subnormal quantum below them).
"""

from __future__ import annotations

import math

import pytest
import torch
from fp64_reference import dequant_weight, rel_err

import fp8select
from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.kernels import weight_quant
from fp8select.kernels.weight_quant import quantize_weight

E4M3, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
FMT = {E4M3: (448.0, -6), FNUZ: (240.0, -7)}  # largest value, smallest normal exponent


def _weight(n: int, k: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # per-row magnitudes over four decades, like real layers' outlier rows
    return (torch.randn(n, k, generator=gen) * 0.02 * torch.exp(torch.randn(n, 1, generator=gen) * 2)).to(dtype)


def _expand(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    return scale.double().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]


@pytest.mark.parametrize("dtype", [E4M3, FNUZ])
@pytest.mark.parametrize(("n", "k", "block"), [(256, 384, (128, 128)), (200, 300, (128, 128)), (200, 300, (1, 128)),
                                               (96, 200, (64, 32)), (1, 7, (128, 128))])
def test_shapes_scales_and_rounding_error(dtype: torch.dtype, n: int, k: int, block: tuple[int, int]) -> None:
    w = _weight(n, k)
    q, s = quantize_weight(w, block, dtype=dtype)
    fmax, min_exp = FMT[dtype]
    nb, kb = math.ceil(n / block[0]), math.ceil(k / block[1])
    assert q.dtype == dtype and q.shape == (n, k) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (nb, kb) and s.is_contiguous()
    # scale = block amax / fp8_max
    padded = torch.zeros(nb * block[0], kb * block[1], dtype=torch.float64)
    padded[:n, :k] = w.double()
    amax = padded.view(nb, block[0], kb, block[1]).abs().amax(dim=(1, 3))
    torch.testing.assert_close(s.double(), amax / fmax, rtol=2**-23, atol=0)
    # each block's largest magnitude lands on fp8_max, nothing exceeds it
    qpad = torch.zeros_like(padded)
    qpad[:n, :k] = q.double()
    assert torch.equal(qpad.view(nb, block[0], kb, block[1]).abs().amax(dim=(1, 3)), torch.full((nb, kb), fmax, dtype=torch.float64))
    # every value within half an fp8 ulp of its block (plus fp32 slop)
    deq = q.double() * _expand(s, n, k, block)
    err = (deq - w.double()).abs()
    bound = torch.maximum(w.double().abs() * 2**-4, _expand(s, n, k, block) * 2.0 ** (min_exp - 3 - 1)) * (1 + 1e-6)
    assert (err <= bound).all()
    assert rel_err(deq, w.double()) < 0.035
    # the library's own dequantization reads it back the same way
    assert torch.equal(dequant_weight(q, s, block), deq)


def test_round_trip_from_every_float_dtype_and_input_untouched() -> None:
    base = _weight(130, 260, torch.float32)
    q32, s32 = quantize_weight(base)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        w = base.to(dtype)
        copy = w.clone()
        q, s = quantize_weight(w)
        assert torch.equal(w, copy)
        assert rel_err(dequant_weight(q, s, (128, 128)), w.double()) < 0.035
    q64, s64 = quantize_weight(base.double())
    assert torch.equal(q64.view(torch.uint8), q32.view(torch.uint8)) and torch.equal(s64, s32)


def test_zero_blocks_get_a_tiny_positive_scale() -> None:
    w = _weight(256, 256)
    w[:128, 128:] = 0
    q, s = quantize_weight(w)
    assert s[0, 1] > 0 and math.isfinite(float(s[0, 1])) and float(s[0, 1]) < 1e-12
    assert (q[:128, 128:].float() == 0).all()
    assert torch.isfinite(dequant_weight(q, s, (128, 128))).all()
    tiny = torch.full((4, 8), 1e-30)  # below the amax floor: quantizes to zero, scale stays positive
    q_tiny, s_tiny = quantize_weight(tiny, (128, 128))
    assert float(s_tiny) > 0 and (q_tiny.float() == 0).all()


def test_chunked_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _weight(300, 260)
    whole = quantize_weight(w)
    monkeypatch.setattr(weight_quant, "_CHUNK_ELEMENTS", 128 * 256)  # one row block per chunk
    q, s = quantize_weight(w)
    assert torch.equal(q.view(torch.uint8), whole[0].view(torch.uint8)) and torch.equal(s, whole[1])
    monkeypatch.setattr(weight_quant, "_CHUNK_ELEMENTS", 1)
    q1, s1 = quantize_weight(w, (1, 128))
    assert torch.equal(q1.view(torch.uint8), quantize_weight(w, (1, 128))[0].view(torch.uint8))
    assert s1.shape == (300, 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weight": torch.zeros(8)}, InvalidInputError, "2-D"),
        ({"weight": torch.zeros(2, 3, 4)}, InvalidInputError, "2-D"),
        ({"weight": torch.zeros(0, 128)}, InvalidInputError, "empty"),
        ({"weight": torch.zeros(4, 128, dtype=torch.int32)}, InvalidDtypeError, "not floating point"),
        ({"weight": torch.zeros(4, 128, dtype=torch.complex64)}, InvalidDtypeError, "not floating point"),
        ({"weight": torch.zeros(4, 128).to(E4M3)}, InvalidDtypeError, "already fp8"),
        ({"weight": [[1.0]]}, InvalidDtypeError, "torch.Tensor"),
        ({"block_size": (0, 128)}, InvalidInputError, "block_size"),
        ({"block_size": (128,)}, InvalidInputError, "block_size"),
        ({"block_size": (128.0, 128)}, InvalidInputError, "block_size"),
        ({"block_size": "128"}, InvalidInputError, "block_size"),
        ({"block_size": (True, 128)}, InvalidInputError, "block_size"),
        ({"dtype": torch.float16}, InvalidDtypeError, "dtype"),
        ({"dtype": torch.float8_e5m2}, InvalidDtypeError, "dtype"),
        ({"weight": torch.ones(4, 128, device="meta")}, InvalidInputError, "meta device"),
        ({"weight": torch.ones(4, 128).to_sparse()}, InvalidInputError, "dense tensor"),
    ],
)
def test_bad_input_is_a_typed_error(kwargs: dict, error: type[Exception], match: str) -> None:
    args = {"weight": torch.ones(4, 128), "block_size": (128, 128), "dtype": E4M3, **kwargs}
    with pytest.raises(error, match=match):
        quantize_weight(args["weight"], args["block_size"], dtype=args["dtype"])


def test_a_parameter_quantizes_without_autograd() -> None:
    """``quantize_weight(linear.weight)``: the outputs hold no graph (nor its fp32 temporaries alive)."""
    weight = torch.nn.Linear(256, 128).weight
    assert weight.requires_grad
    w_q, scale = quantize_weight(weight)
    assert not w_q.requires_grad and w_q.grad_fn is None and not scale.requires_grad and scale.grad_fn is None
    assert torch.equal(w_q.view(torch.uint8), quantize_weight(weight.detach())[0].view(torch.uint8))


def test_a_block_wider_than_the_weight_is_one_block() -> None:
    """A block size beyond the weight's size quantizes it as one block, without padding to that size."""
    weight = torch.randn(256, 384, generator=torch.Generator().manual_seed(3))
    w_q, scale = quantize_weight(weight, (2**40, 2**40))
    one_q, one_scale = quantize_weight(weight, (256, 384))
    assert scale.shape == (1, 1) and torch.equal(scale, one_scale)
    assert torch.equal(w_q.view(torch.uint8), one_q.view(torch.uint8))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_weights_are_refused_and_counted(value: float) -> None:
    w = _weight(200, 300)
    w[3, 7] = value
    w[150, 299] = value
    with pytest.raises(InvalidInputError, match=r"must be finite .* found 2 NaN or infinite values"):
        quantize_weight(w)
    with pytest.raises(InvalidInputError, match="found 1 NaN"):  # fp64 beyond the fp32 range
        quantize_weight(torch.tensor([[1e300, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
def test_a_layer_prepared_from_it_matches_the_bf16_linear(block: tuple[int, int]) -> None:
    """End to end on CPU: quantize a bf16 linear's weight, prepare a layer (reference backend),
    compare with the fp64 product of the ORIGINAL bf16 weight. Weight and activation rounding
    to e4m3 (each ~2.5% RMS) bound the error, not the kernels."""
    gen = torch.Generator().manual_seed(3)
    w = _weight(300, 520)
    bias = torch.randn(300, generator=gen).to(torch.bfloat16)
    x = torch.randn(2, 7, 520, generator=gen).to(torch.bfloat16)
    layer = fp8select.resolve(plugins=False).prepare(*quantize_weight(w, block), block)
    y = layer(x, bias=bias)
    ref = x.double() @ w.double().t() + bias.double()
    assert y.shape == (2, 7, 300) and y.dtype == torch.bfloat16
    assert rel_err(y, ref) < 0.05
