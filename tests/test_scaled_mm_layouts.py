"""Layout contracts of the two ``F.scaled_mm`` backends, on CPU with fakes that check strides.

The fakes accept exactly the layouts torch documents and we measured (FACTS.md): on CUDA the
activation scale is M-major (strides (1, M)) and the 128x128 weight scale is the checkpoint's
scale ``.t()`` with K-blocks padded to a multiple of 4; on XPU the activation scale is
row-major and the weight scale transposed-contiguous. Anything else raises, as the real call
would (CUDA) or would cost a copy per call (XPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fp64_reference import expected, random_problem, rel_err
from matrix import MATRIX

from fp8select import resolve
from fp8select.backends import scaled_mm as smm

ST = F.ScalingType


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _dequant_call(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb_nk: torch.Tensor, block: tuple[int, int],
                  bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    k = a.shape[1]
    n = b.shape[1]
    cols = torch.arange(k) // 128
    a64 = a.to(torch.float64) * sa.to(torch.float64)[:, cols]
    rows = torch.arange(n) // block[0]
    w64 = b.t().to(torch.float64) * sb_nk.to(torch.float64)[rows][:, cols]
    out = a64 @ w64.t()
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out.to(out_dtype)


def cuda_fake(calls: list[dict[str, Any]]) -> Callable[..., torch.Tensor]:
    def fake(a, b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None, bias=None,
             output_dtype=torch.bfloat16, contraction_dim=(), use_fast_accum=False):  # type: ignore[no-untyped-def]
        m, k = a.shape
        n = b.shape[1]
        kb = -(-k // 128)
        assert a.dtype == torch.float8_e4m3fn and a.is_contiguous(), "mat_a must be row-major fp8"
        assert b.t().is_contiguous(), "mat_b must be column-major (the [N, K] weight .t())"
        if recipe_a != ST.BlockWise1x128:
            raise ValueError("scale_recipe_a must be BlockWise1x128")
        if m % 4:
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED (block-wise scaling needs M % 4 == 0)")
        if scale_a.shape != (m, kb) or scale_a.stride() != (1, m) or scale_a.dtype != torch.float32:
            raise ValueError(f"scale_a must have strides (1, M): shape {tuple(scale_a.shape)} stride {scale_a.stride()}")
        if recipe_b == ST.BlockWise128x128:
            l4 = _round_up(kb, 4)
            if scale_b.shape != (l4, -(-n // 128)) or scale_b.stride() != (1, l4):
                raise ValueError(f"scale_b must have shape {l4} x {-(-n // 128)} and strides (1, {l4}), "
                                 f"found {tuple(scale_b.shape)} {scale_b.stride()}")
            if l4 != kb and bool(scale_b[kb:].ne(0).any()):
                raise ValueError("padded K-blocks of scale_b must be zero")
            sb_nk, block = scale_b[:kb].t(), (128, 128)
        elif recipe_b == ST.BlockWise1x128:
            if scale_b.shape != (n, kb) or scale_b.stride() != (1, n):
                raise ValueError(f"scale_b strides must be (1, {n}); got: {list(scale_b.stride())}")
            sb_nk, block = scale_b, (1, 128)
        else:
            raise ValueError("unexpected scale_recipe_b")
        calls.append({"m": m, "recipe_b": recipe_b})
        return _dequant_call(a, b, scale_a, sb_nk, block, bias, output_dtype)

    return fake


def xpu_fake(calls: list[dict[str, Any]]) -> Callable[..., torch.Tensor]:
    def fake(a, b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None, bias=None,
             output_dtype=torch.bfloat16, contraction_dim=(), use_fast_accum=False):  # type: ignore[no-untyped-def]
        m, k = a.shape
        n = b.shape[1]
        kb = -(-k // 128)
        assert a.is_contiguous() and b.t().is_contiguous()
        if scale_a.shape != (m, kb) or not scale_a.is_contiguous():
            raise ValueError(f"XPU scale_a must be row-major [M, K/128] (else copied per call), found {scale_a.stride()}")
        if recipe_b == ST.BlockWise128x128:
            if scale_b.shape != (kb, -(-n // 128)) or not scale_b.is_contiguous():
                raise ValueError(f"XPU 128x128 scale_b must be contiguous [K/128, N/128], found {tuple(scale_b.shape)} {scale_b.stride()}")
            sb_nk, block = scale_b.t(), (128, 128)
        else:
            if scale_b.shape != (n, kb) or not scale_b.t().is_contiguous():
                raise ValueError(f"XPU 1x128 scale_b must be [N, K/128] with .t() contiguous, found {scale_b.stride()}")
            sb_nk, block = scale_b, (1, 128)
        calls.append({"m": m, "recipe_b": recipe_b})
        return _dequant_call(a, b, scale_a, sb_nk, block, bias, output_dtype)

    return fake


@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
@pytest.mark.parametrize("n, k", [(256, 512), (256, 640), (384, 1152), (4160, 256)])
def test_cuda_scaled_mm_layouts(monkeypatch: pytest.MonkeyPatch, block: tuple[int, int], n: int, k: int) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(smm, "_scaled_mm", lambda: cuda_fake(calls))
    selection = resolve(MATRIX["h200-torch2.11"][0], plugins=False, order=["cuda-scaled-mm", "reference"])
    w, s = random_problem(n, k, block, seed=n * k)
    layer = selection.prepare(w, s, block)
    assert layer.backends == ("cuda-scaled-mm",)  # every M, the unaligned ones padded
    for m in (8, 16, 4, 5, 1, 13):
        x = torch.randn(m, k, dtype=torch.bfloat16)
        bias = torch.randn(n, dtype=torch.bfloat16)
        assert rel_err(layer(x, bias=bias), expected(x, w, s, block, bias)) < 1e-2
    # M that are not multiples of 4 reach cuBLAS padded with zero rows
    assert [c["m"] for c in calls] == [8, 16, 4, 8, 4, 16]


def test_cuda_prepare_pads_k_blocks_once() -> None:
    from fp8select.backends.scaled_mm import CudaScaledMMBackend

    w, s = random_problem(256, 640, seed=1)
    pw = CudaScaledMMBackend().prepare(w, s, (128, 128), MATRIX["h200-torch2.11"][0])
    assert pw.scale.shape == (8, 2) and pw.scale.stride() == (1, 8)
    assert torch.equal(pw.scale[:5].t(), s) and not pw.scale[5:].any()
    assert pw.weight_nk is w  # the fallback shares the weight


def test_cuda_wrong_layout_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately wrong activation-scale layout must be caught by the fake."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(smm, "_scaled_mm", lambda: cuda_fake(calls))
    monkeypatch.setattr(smm.CudaScaledMMBackend, "scale_layout_name", "row")
    selection = resolve(MATRIX["h200-torch2.11"][0], plugins=False, order=["cuda-scaled-mm", "reference"])
    w, s = random_problem(256, 512, seed=2)
    with pytest.raises(ValueError, match="strides"):
        selection.prepare(w, s)(torch.randn(16, 512, dtype=torch.bfloat16))


@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
@pytest.mark.parametrize("n, k", [(256, 512), (256, 640), (4160, 256)])
def test_xpu_scaled_mm_layouts(monkeypatch: pytest.MonkeyPatch, block: tuple[int, int], n: int, k: int) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(smm, "_scaled_mm", lambda: xpu_fake(calls))
    selection = resolve(MATRIX["arc-b580-torch2.13"][0], plugins=False)
    assert selection.backend.name == "xpu-scaled-mm"
    w, s = random_problem(n, k, block, seed=n + k)
    layer = selection.prepare(w, s, block)
    for m in (1, 3, 16):
        x = torch.randn(m, k, dtype=torch.float16)
        assert rel_err(layer(x), expected(x, w, s, block)) < 1e-2
    assert [c["m"] for c in calls] == [1, 3, 16]
    pw = layer.prepared["xpu-scaled-mm"]
    storage = pw.scale if block == (128, 128) else pw.scale.t()
    assert storage.is_contiguous()  # laid out once at prepare


def test_xpu_pre_quantized_input_scale_is_relaid_only_if_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    from fp64_reference import quantize_groups

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(smm, "_scaled_mm", lambda: xpu_fake(calls))
    selection = resolve(MATRIX["arc-b580-torch2.13"][0], plugins=False)
    w, s = random_problem(256, 256, seed=3)
    q, xs = quantize_groups(torch.randn(4, 256))
    xs = xs.to(torch.float32)
    out = selection.prepare(w, s, out_dtype=torch.bfloat16)(q.contiguous(), input_scale=xs.t().contiguous().t())
    assert rel_err(out, expected(q, w, s, (128, 128), input_scale=xs)) < 1e-2
