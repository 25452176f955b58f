"""Tests for fp8select.kernels.triton_gemm (and its kernels), run on CPU under the Triton interpreter.

Triton decides interpreter or compiled mode when each ``@triton.jit`` function is decorated,
its own ``triton.language`` helpers included, so ``TRITON_INTERPRET=1`` is set here before
anything imports triton.

References are computed here in float64 from the fp8 values and their scales, independently
of the library: the GEMM must match the dequantized product (tight) and the product of the
original unquantized activation with the dequantized weight (loose: see UNQUANTIZED_TOL).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
import torch
from interpreted import rebuild

pytest.importorskip("triton")

import triton
import triton.language as tl

from fp8select.kernels import triton_gemm as tg
from fp8select.kernels import triton_gemm_kernels as tgk
from fp8select.kernels import triton_quant, triton_search
from fp8select.kernels.quant import M_MAJOR, ScaleLayout, quantize_per_token_group
from fp8select.kernels.triton_config import TritonConfig

if type(triton.language.max).__name__ != "InterpretedFunction":
    pytest.skip(
        "triton was imported before TRITON_INTERPRET=1 was set; rerun with TRITON_INTERPRET=1",
        allow_module_level=True,
    )
rebuild()  # decorated before the variable was set (triton itself already interpreted)

E4M3 = torch.float8_e4m3fn
# e4m3 keeps 3 mantissa bits: rounding each activation costs ~2.5% RMS of its value, and the
# product inherits that (measured 2.4% on these data), so 1e-2 against the UNQUANTIZED
# activation is out of reach for any fp8 kernel; the tight check is against the dequantized one.
UNQUANTIZED_TOL = 4e-2


def _cfg(path: str = "gemm", block_m: int = 16, block_n: int = 64, split_k: int = 1, **more: int) -> TritonConfig:
    """A small configuration (the interpreter ignores warps and stages); FIXUP/TMA as given or defaulted.
    The wgmma path's smallest instead (its limits: 64 rows per warpgroup, TMA, no split-K); off an H100/H200
    it runs the gemm path with those tiles."""
    if path == "wgmma":
        return TritonConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=4, num_stages=2,
                            path="wgmma", FIXUP=0, TMA=1)
    return TritonConfig.from_dict({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 128, "GROUP_M": 8,
                                   "SPLIT_K": split_k, "num_warps": 4, "num_stages": 2, "path": path, **more})


SMALL = _cfg()
SWAP_SMALL = _cfg("swap")

def _weight(n: int, k: int, bn: int, dtype: torch.dtype = E4M3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random fp8 weight ``[n, k]`` and positive fp32 block scales ``[ceil(n/bn), ceil(k/128)]``."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 64).clamp(-200, 200).to(dtype)
    scale = torch.rand(math.ceil(n / bn), math.ceil(k / 128), generator=gen) * 1e-2 + 1e-3
    return w, scale


def _activation(m: int, k: int, dtype: torch.dtype = torch.bfloat16, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen))
    return torch.where(x == 0, torch.full_like(x, 0.5), x).to(dtype)


def _dequant64(q: torch.Tensor, scale: torch.Tensor, rows_per_scale: int) -> torch.Tensor:
    """fp64 ``q * scale`` with each scale covering ``rows_per_scale`` rows and 128 columns."""
    n, k = q.shape
    s = scale.double().repeat_interleave(rows_per_scale, dim=0)[:n]
    return q.double() * s.repeat_interleave(128, dim=1)[:, :k]


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    if ref.numel() == 0:
        return 0.0
    return float((out.double() - ref).norm() / ref.norm())


def _check(
    out: torch.Tensor,
    x: torch.Tensor,
    xq: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bn: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> None:
    """``out`` matches the dequantized product (tight) and the unquantized one (loose)."""
    wd = _dequant64(w, ws, bn)
    ref = _dequant64(xq, xs, 1) @ wd.t()
    ref_x = x.double() @ wd.t()
    if bias is not None:
        ref = ref + bias.double()
        ref_x = ref_x + bias.double()
    assert out.dtype == out_dtype and out.shape == ref.shape and out.is_contiguous()
    tight = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[out_dtype]
    assert _rel(out, ref) < tight
    assert _rel(out, ref_x) < UNQUANTIZED_TOL


@pytest.mark.parametrize("m", [0, 1, 3, 17])
@pytest.mark.parametrize("n", [128, 200])
@pytest.mark.parametrize("k", [256, 320])
def test_gemm_shapes(m: int, n: int, k: int) -> None:
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    out = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.bfloat16, config=SMALL)
    _check(out, x, xq, xs, w, ws, 128, None, torch.bfloat16)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
@pytest.mark.parametrize("split_k", [1, 2])
def test_gemm_blocks_bias_dtypes_split(out_dtype: torch.dtype, block: tuple[int, int], split_k: int) -> None:
    m, n, k = 5, 200, 320
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, block[0])
    bias = torch.randn(n, dtype=torch.bfloat16)
    cfg = _cfg(split_k=split_k)
    out = tg.w8a8_block_gemm(xq, xs, w, ws, block, out_dtype=out_dtype, bias=bias, config=cfg)
    _check(out, x, xq, xs, w, ws, block[0], bias, out_dtype)


@pytest.mark.parametrize("layout", [M_MAJOR, ScaleLayout(mn_major=True, m_align=4)])
def test_gemm_m_major_scale_matches_row_major(layout: ScaleLayout) -> None:
    m, n, k = 3, 200, 320
    x = _activation(m, k)
    xq, xs_row = quantize_per_token_group(x)
    _, xs = quantize_per_token_group(x, layout=layout)
    assert xs.stride()[0] == 1
    w, ws = _weight(n, k, 128)
    out = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32, config=SMALL)
    out_row = tg.w8a8_block_gemm(xq, xs_row, w, ws, (128, 128), out_dtype=torch.float32, config=SMALL)
    assert torch.equal(out, out_row)
    _check(out, x, xq, xs_row, w, ws, 128, None, torch.float32)


def test_gemm_transposed_weight_scale_strides() -> None:
    m, n, k = 3, 200, 320
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    ws_t = ws.t().contiguous().t()  # same values, column-major strides
    out = tg.w8a8_block_gemm(xq, xs, w, ws_t, (128, 128), out_dtype=torch.float32, config=SMALL)
    _check(out, x, xq, xs, w, ws, 128, None, torch.float32)


@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_split_k_matches_single_pass(split_k: int) -> None:
    m, n, k = 4, 128, 640
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    one = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32, config=SMALL)
    split = tg.w8a8_block_gemm(
        xq, xs, w, ws, (128, 128), out_dtype=torch.float32, config=_cfg(split_k=split_k)
    )
    torch.testing.assert_close(split, one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize(("block", "split_k"), [((128, 128), 1), ((1, 128), 2)])
def test_fused_matches_quantize_then_gemm(m: int, block: tuple[int, int], split_k: int) -> None:
    n, k = 200, 320
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, block[0])
    cfg = _cfg("fused", split_k=split_k)
    fused = tg.w8a8_block_linear_fused(x, w, ws, block, out_dtype=torch.float32, config=cfg)
    separate = tg.w8a8_block_gemm(xq, xs, w, ws, block, out_dtype=torch.float32, config=cfg)  # runs as gemm
    # Same quantization, same dot order: the fused path reproduces the separate one exactly.
    assert torch.equal(fused, separate)
    _check(fused, x, xq, xs, w, ws, block[0], None, torch.float32)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_fused_bias_strided_input_fp16(out_dtype: torch.dtype) -> None:
    m, n, k = 3, 200, 256
    wide = _activation(m, 2 * k, torch.float16)
    x = wide[:, 64 : 64 + k]  # row stride 2K
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    bias = torch.randn(n)
    out = tg.w8a8_block_linear_fused(
        x, w, ws, (128, 128), out_dtype=out_dtype, bias=bias, config=_cfg("fused", split_k=2)
    )
    _check(out, x, xq, xs, w, ws, 128, bias, out_dtype)


def test_fused_m_zero() -> None:
    w, ws = _weight(128, 256, 128)
    out = tg.w8a8_block_linear_fused(torch.empty(0, 256, dtype=torch.bfloat16), w, ws, (128, 128), out_dtype=torch.bfloat16)
    assert out.shape == (0, 128) and out.dtype == torch.bfloat16


def test_gemm_fnuz() -> None:
    m, n, k = 3, 128, 256
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x, dtype=torch.float8_e4m3fnuz)
    w, ws = _weight(n, k, 128, dtype=torch.float8_e4m3fnuz)
    out = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32, config=SMALL)
    _check(out, x, xq, xs, w, ws, 128, None, torch.float32)
    fused = tg.w8a8_block_linear_fused(x, w, ws, (128, 128), out_dtype=torch.float32, config=_cfg("fused"))
    assert torch.equal(fused, out)


def test_gemm_default_config() -> None:
    m, n, k = 2, 128, 384
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    out = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.bfloat16)
    _check(out, x, xq, xs, w, ws, 128, None, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# linear(): every path (gemm, fused, decode = swap-AB with in-kernel quantization, swap)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", tg.PATHS)
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize(
    ("block", "split_k", "fixup"), [((128, 128), 1, 0), ((1, 128), 2, 1), ((128, 128), 3, 1), ((128, 128), 2, 0)]
)
def test_linear_paths_match_fp64(path: str, m: int, block: tuple[int, int], split_k: int, fixup: int) -> None:
    n, k = 200, 320  # ragged N (not a multiple of BLOCK_N or 128) and K (2.5 scale groups)
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, block[0])
    cfg = _cfg(path, split_k=split_k, FIXUP=fixup)
    out = tg.linear(x, w, ws, block, out_dtype=torch.float32, config=cfg)
    _check(out, x, xq, xs, w, ws, block[0], None, torch.float32)


@pytest.mark.parametrize("path", tg.PATHS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_linear_bias_dtypes_strided_fp16_input(path: str, out_dtype: torch.dtype) -> None:
    m, n, k = 3, 200, 256
    wide = _activation(m, 2 * k, torch.float16)
    x = wide[:, 64 : 64 + k]  # row stride 2K
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    bias = torch.randn(n, dtype=torch.bfloat16)
    out = tg.linear(x, w, ws, (128, 128), out_dtype=out_dtype, bias=bias, config=_cfg(path, split_k=2))
    _check(out, x, xq, xs, w, ws, 128, bias, out_dtype)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 9, 16, 40])
def test_decode_quantizes_like_the_quant_kernel(m: int) -> None:
    """In-kernel quantization == quantize_per_token_group, bit for bit.

    ``decode`` quantizes x inside the swap-AB kernel (only next_pow2(M) rows, repeated to the
    16-row tile: M = 1, 2, 3-4, 5-8, 9-16 take different branches; 40 spans three M tiles);
    ``swap`` runs the same kernel and dot order on the torch quantizer's output. Equal outputs
    mean equal fp8 activations and scales (any differing element would change its row).
    """
    n, k = 200, 300
    gen = torch.Generator().manual_seed(m)
    x = (torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen) * 3)).to(torch.bfloat16)
    w, ws = _weight(n, k, 128)
    bias = torch.randn(n)
    fused = tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32, bias=bias, config=_cfg("decode", split_k=2))
    xq, xs = quantize_per_token_group(x)
    separate = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32, bias=bias,
                                  config=_cfg("swap", split_k=2))
    assert torch.equal(fused, separate)
    _check(fused, x, xq, xs, w, ws, 128, bias, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.float32])
def test_fused_paths_equal_separate_quantization(dtype: torch.dtype, x_dtype: torch.dtype) -> None:
    m, n, k = 5, 128, 256
    x = _activation(m, k, x_dtype)
    xq, xs = quantize_per_token_group(x, dtype=dtype)
    w, ws = _weight(n, k, 128, dtype=dtype)
    for fused_path, separate_path in (("decode", "swap"), ("fused", "gemm")):
        fused = tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32, config=_cfg(fused_path))
        separate = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32, config=_cfg(separate_path))
        assert torch.equal(fused, separate), fused_path
        # and the path through the quantization kernel gives the same bits as well
        assert torch.equal(tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32,
                                     config=_cfg(separate_path)), separate)


@pytest.mark.parametrize("path", ["gemm", "decode"])
@pytest.mark.parametrize("split_k", [2, 3, 7])  # the last program reads the partials four at a time
def test_fixup_equals_two_pass_reduction_and_resets_counters(path: str, split_k: int) -> None:
    m, n, k = 17, 200, 896
    x = _activation(m, k)
    w, ws = _weight(n, k, 128)
    bias = torch.randn(n)
    cfg = _cfg(path, split_k=split_k)
    one_launch = tg.linear(x, w, ws, (128, 128), out_dtype=torch.bfloat16, bias=bias, config=replace(cfg, FIXUP=1))
    two_pass = tg.linear(x, w, ws, (128, 128), out_dtype=torch.bfloat16, bias=bias, config=replace(cfg, FIXUP=0))
    # Both sum the partials in split order: bitwise equal (and run-to-run reproducible).
    assert torch.equal(one_launch, two_pass)
    counters = importlib.import_module("fp8select.kernels.triton_device")._COUNTERS
    assert counters and all(int(buf.abs().sum()) == 0 for buf in counters.values())


def test_no_split_k_counters_are_kept_from_a_compiled_cuda_graph_trees_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the stream where torch.compile's CUDA graphs warm up (every allocation in their pool), a call that passes
    no counters gets zeroed ones of its own and none are kept; on any other stream the stream's buffer is kept."""
    triton_device = importlib.import_module("fp8select.kernels.triton_device")
    monkeypatch.setattr(triton_device, "_COUNTERS", {})
    pooled = {"yes": True}
    monkeypatch.setattr(triton_device, "cudagraph_tree_stream", lambda device, stream: pooled["yes"])
    m, n, k = 17, 200, 896
    x = _activation(m, k)
    w, ws = _weight(n, k, 128)
    cfg = replace(_cfg("gemm", split_k=3), FIXUP=1)
    first = triton_device._fixup_counters(torch.device("cpu"), 10)
    assert first is not triton_device._fixup_counters(torch.device("cpu"), 10) and not first.any()
    pooled_out = tg.linear(x, w, ws, (128, 128), out_dtype=torch.bfloat16, config=cfg)
    assert triton_device._COUNTERS == {}
    pooled["yes"] = False
    kept = triton_device._fixup_counters(torch.device("cpu"), 10)
    assert kept is triton_device._fixup_counters(torch.device("cpu"), 10)
    assert torch.equal(tg.linear(x, w, ws, (128, 128), out_dtype=torch.bfloat16, config=cfg), pooled_out)


@pytest.mark.parametrize("layout", [M_MAJOR, ScaleLayout(mn_major=True, m_align=4)])
def test_swap_prequantized_scale_layouts_and_weight_scale_strides(layout: ScaleLayout) -> None:
    m, n, k = 3, 200, 320
    x = _activation(m, k)
    xq, xs_row = quantize_per_token_group(x)
    _, xs = quantize_per_token_group(x, layout=layout)
    w, ws = _weight(n, k, 128)
    ws_t = ws.t().contiguous().t()  # same values, column-major strides
    cfg = SWAP_SMALL
    out = tg.w8a8_block_gemm(xq, xs, w, ws_t, (128, 128), out_dtype=torch.float32, config=cfg)
    out_row = tg.w8a8_block_gemm(xq, xs_row, w, ws, (128, 128), out_dtype=torch.float32, config=cfg)
    assert torch.equal(out, out_row)
    _check(out, x, xq, xs_row, w, ws, 128, None, torch.float32)


_ORIGINAL_REPEAT_ROWS = tgk._repeat_rows


@triton.jit
def _repeat_rows_without_reshape(t, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    tl.static_assert((ROWS == 1) or (ROWS == BLOCK_M), "reshape unsupported (simulated)")
    return _ORIGINAL_REPEAT_ROWS(t, ROWS, BLOCK_M)


def test_decode_falls_back_to_whole_tile_when_row_repeat_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    m, n, k = 3, 128, 256  # QUANT_ROWS 4 of a 16-row tile: the reshape branch
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    want = tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32, config=_cfg("decode"))
    monkeypatch.setattr(tgk, "_repeat_rows", _repeat_rows_without_reshape)
    bound = tg.BoundLinear(w, ws, (128, 128), _cfg("decode"), out_dtype=torch.float32)
    got = bound(x)
    gemm, _ = bound._bind(_cfg("decode"))
    assert not gemm.repeat_rows_ok  # learnt once, for this bound launch
    assert torch.equal(bound(x), got)
    assert torch.equal(got, want)  # whole wrapped tile quantized: same rows, same results
    _check(got, x, xq, xs, w, ws, 128, None, torch.float32)


@pytest.mark.parametrize("path", [p for p in tg.PATHS if p != "wgmma"])  # wgmma: always TMA
@pytest.mark.parametrize(("m", "block"), [(1, (128, 128)), (17, (1, 128))])
def test_tma_loads_equal_pointer_loads(path: str, m: int, block: tuple[int, int]) -> None:
    """TMA descriptors zero-fill the ragged N and K edges: same bits as the masked pointer loads."""
    n, k = 200, 320
    x = _activation(m, k)
    w, ws = _weight(n, k, block[0])
    cfg = _cfg(path, split_k=2, FIXUP=1)
    ptr = tg.linear(x, w, ws, block, out_dtype=torch.float32, config=cfg)
    tma = tg.linear(x, w, ws, block, out_dtype=torch.float32, config=replace(cfg, TMA=1))
    assert torch.equal(tma, ptr)
    # A weight whose rows are not 16-byte aligned cannot back a descriptor: pointer loads then.
    wide = torch.zeros(n, k + 8, dtype=E4M3)
    wide[:, :k] = w
    odd = tg.linear(x, wide[:, :k], ws, block, out_dtype=torch.float32, config=replace(cfg, TMA=1))
    assert torch.equal(odd, ptr)


def test_swap_1x128_weight_scales_and_wide_tile() -> None:
    m, n, k = 2, 96, 384  # BLOCK_N 64 over 96 rows of per-row weight scales
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 1)
    for cfg in (_cfg("decode"), _cfg("decode", block_m=32, block_n=128, split_k=2)):
        out = tg.linear(x, w, ws, (1, 128), out_dtype=torch.float32, config=cfg)
        _check(out, x, xq, xs, w, ws, 1, None, torch.float32)


def test_linear_empty_and_zero_k() -> None:
    w, ws = _weight(128, 256, 128)
    for path in tg.PATHS:
        out = tg.linear(torch.empty(0, 256, dtype=torch.bfloat16), w, ws, (128, 128), out_dtype=torch.bfloat16,
                        config=_cfg(path))
        assert out.shape == (0, 128)
    bias = torch.randn(128)
    w0 = torch.empty(128, 0, dtype=E4M3)
    out = tg.linear(torch.empty(2, 0), w0, torch.empty(1, 0), (128, 128), out_dtype=torch.float32, bias=bias,
                    config=_cfg("decode"))
    assert torch.equal(out, bias.expand(2, 128))


def _launched(monkeypatch: pytest.MonkeyPatch) -> list[TritonConfig]:
    """Record the configuration of every kernel launch from now on."""
    seen: list[TritonConfig] = []
    launch = tg.BoundGemm.__call__
    monkeypatch.setattr(tg.BoundGemm, "__call__", lambda self, *a: seen.append(self.cfg) or launch(self, *a))
    return seen


def test_no_config_runs_the_heuristic_of_the_shape_and_m(monkeypatch: pytest.MonkeyPatch) -> None:
    m, n, k = 3, 200, 384
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    seen = _launched(monkeypatch)
    out = tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32)
    _check(out, x, xq, xs, w, ws, 128, None, torch.float32)
    tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32)
    tg.w8a8_block_linear_fused(x, w, ws, (128, 128), out_dtype=torch.float32)
    assert seen == [triton_search.heuristic_config(n, k, m, "gemm"), triton_search.heuristic_config(n, k, m, "gemm"),
                    triton_search.heuristic_config(n, k, m, "fused")]


@pytest.mark.parametrize(("given", "runs"), [("fused", "gemm"), ("decode", "swap"), ("gemm", "gemm"), ("swap", "swap")])
def test_prequantized_input_runs_the_prequantized_sibling(monkeypatch: pytest.MonkeyPatch, given: str, runs: str) -> None:
    m, n, k = 3, 200, 320
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    cfg = _cfg(given, split_k=2, FIXUP=1, TMA=1)
    seen = _launched(monkeypatch)
    pre = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32, config=cfg)
    assert seen == [replace(cfg, path=runs)]  # same tiles, split, FIXUP and TMA
    assert cfg.prequantized() == replace(cfg, path=runs)
    # and the same product as the unquantized activation through the configuration's own path
    assert torch.equal(pre, tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32, config=cfg))


def test_fused_entry_takes_only_in_kernel_quantizing_paths() -> None:
    w, ws = _weight(128, 256, 128)
    with pytest.raises(ValueError, match="fused or decode path, got 'swap'"):
        tg.w8a8_block_linear_fused(_activation(2, 256), w, ws, (128, 128), out_dtype=torch.float32, config=SWAP_SMALL)


def test_backend_runs_the_given_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from fp8select import Capabilities
    from fp8select.backends.triton import TritonBackend

    m, n, k = 3, 128, 256
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    backend = TritonBackend()
    caps = Capabilities(torch_version="2.13.0")
    prepared = backend.prepare(w, ws, (128, 128), caps)
    assert set(prepared.extra) == {"fixup_counters"}  # its own split-K counters; no side channel: the configuration comes with each call
    seen = _launched(monkeypatch)
    decode = _cfg("decode", split_k=2)
    out = backend.run(prepared, x, input_scale=None, bias=None, out_dtype=torch.float32, caps=caps, config=decode)
    _check(out, x, xq, xs, w, ws, 128, None, torch.float32)
    pre = backend.run(prepared, xq, input_scale=xs, bias=None, out_dtype=torch.float32, caps=caps, config=decode)
    assert torch.equal(pre, out)  # the same kernel on the pre-quantized input
    backend.run(prepared, x, input_scale=None, bias=None, out_dtype=torch.float32, caps=caps)
    assert seen == [decode, replace(decode, path="swap"), triton_search.heuristic_config(n, k, m)]
    # a tuning-table row becomes the configuration run() takes; a malformed one names its key
    assert backend.launch_config(decode.to_dict()) == decode
    with pytest.raises(ValueError, match="'SPLIT_K' must be a positive int"):
        backend.launch_config({**decode.to_dict(), "SPLIT_K": 0})


def test_backend_gate_rejects_a_prequantized_input_of_another_fp8_dtype() -> None:
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from matrix import MATRIX

    from fp8select.backends.triton import TritonBackend
    from fp8select.problem import Problem

    fn, fnuz = torch.float8_e4m3fn, torch.float8_e4m3fnuz
    backend = TritonBackend()
    h200, mi300x = MATRIX["h200-torch2.11"][0], MATRIX["mi300x"][0]

    def verdict(caps: object, weight: torch.dtype, act: torch.dtype) -> tuple[bool, str]:
        v = backend.supports(Problem(256, 512, (128, 128), 16, weight, act, torch.bfloat16), caps)  # type: ignore[arg-type]
        return v.ok, v.reason

    ok, reason = verdict(h200, fn, fnuz)
    assert not ok and "float8_e4m3fn" in reason and "found input float8_e4m3fnuz" in reason
    ok, reason = verdict(h200, fnuz, fn)
    assert not ok and "found input float8_e4m3fn with weight float8_e4m3fnuz" in reason
    assert verdict(h200, fn, fn)[0] and verdict(h200, fn, torch.bfloat16)[0]
    # gfx942 multiplies an e4m3fn checkpoint as e4m3fnuz (converted at prepare): the input must be fnuz
    assert verdict(mi300x, fn, fnuz)[0] and verdict(mi300x, fnuz, fnuz)[0]
    ok, reason = verdict(mi300x, fn, fn)
    assert not ok and "float8_e4m3fnuz" in reason and "gfx942" in reason


def test_hardware_rounding_only_for_compiled_nvidia_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp32 pre-rounding (for the interpreter's cast) is skipped only where the cast is the
    NVIDIA cvt.rn.satfinite instruction; the GPU run checks those bits against torch."""

    class InterpretedFunction:
        pass

    class JITFunction:
        pass

    cuda = torch.device("cuda")
    assert triton_quant.hw_rne(JITFunction(), cuda, E4M3)
    assert triton_quant.hw_rne(JITFunction(), cuda, torch.float8_e5m2)
    assert not triton_quant.hw_rne(JITFunction(), cuda, torch.float8_e4m3fnuz)
    assert not triton_quant.hw_rne(InterpretedFunction(), cuda, E4M3)
    assert not triton_quant.hw_rne(JITFunction(), torch.device("cpu"), E4M3)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not triton_quant.hw_rne(JITFunction(), cuda, E4M3)
    assert not triton_quant.hw_rne(tgk._w8a8_swap_kernel, torch.device("cpu"), E4M3)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"block_size": (128, 64)}, "block_size"),
        ({"a_scale": torch.ones(3, 3)}, "a_scale"),
        ({"b_scale": torch.ones(2, 2)}, "b_scale"),
        ({"out_dtype": torch.int32}, "out_dtype"),
        ({"bias": torch.ones(7)}, "bias"),
        ({"config": {"BLOCK_M": 16}}, "TritonConfig or None"),
        ({"b": torch.zeros(128, 256, dtype=torch.float8_e5m2)}, "same fp8 dtype"),
    ],
)
def test_gemm_rejects_bad_args(change: dict, match: str) -> None:
    xq, xs = quantize_per_token_group(_activation(3, 256))
    w, ws = _weight(128, 256, 128)
    args = {"a": xq, "a_scale": xs, "b": w, "b_scale": ws, "block_size": (128, 128), "out_dtype": torch.bfloat16,
            "bias": None, "config": None, **change}
    with pytest.raises(ValueError, match=match):
        tg.w8a8_block_gemm(
            args["a"], args["a_scale"], args["b"], args["b_scale"], args["block_size"],
            out_dtype=args["out_dtype"], bias=args["bias"], config=args["config"],
        )




# ---------------------------------------------------------------------------------------------
# Sweep script (CPU-only parts)
# ---------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def _sweep_module() -> ModuleType:
    from benchmarks import sweep_triton

    return sweep_triton


def test_sweep_parsing() -> None:
    sweep = _sweep_module()
    shapes = sweep.parse_shapes("deepseek-v3")
    assert (7168, 16384) in shapes and len(shapes) == 8
    assert sweep.parse_shapes("128x256,4096,7168") == [(128, 256), (4096, 7168)]
    assert sweep.parse_m_list("1,8,16") == [1, 8, 16]
    assert sweep.parse_paths("all") == list(tg.PATHS)
    assert sweep.parse_paths("gemm, decode") == ["gemm", "decode"]
    with pytest.raises(ValueError, match="subset"):
        sweep.parse_paths("gemm,bogus")


def test_sweep_driver_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    cmd = [
        sys.executable, "-m", "benchmarks.sweep_triton", "--device", "cpu", "--out", str(out),
        "--shapes", "128x256", "--m", "1", "--replays", "1", "--max-candidates", "4", "--budget-s", "120",
    ]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["complete"] and report["quant_bitwise"]["row_major"]["fp8_mismatches"] == 0
    (res,) = report["results"]
    assert res["best"]["rel_err"] < 1e-2
    from fp8select.kernels.triton_search import candidates

    assert set(res["paths"]) == {c.path for c in candidates(128, 256, 1, limit=3)}  # the first round (2/3 of 4) at M = 1
    assert res["paths"]["decode"]["bitwise_vs_prequant"] is True
    assert TritonConfig.from_dict(res["best"]["config"]).to_dict() == res["best"]["config"]  # every key written
    assert "median_us" in res["gemm_alone"]
    assert "error" in res["cublas"]["exact"]  # block-wise scaled_mm is CUDA-only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]  # results only, no table


def test_programmatic_dependent_launch_is_off_on_the_cpu_and_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from fp8select.kernels import triton_pdl

    assert not triton_pdl.use_pdl(tgk._w8a8_block_kernel, torch.device("cpu"), 1)
    assert not triton_pdl.use_pdl(tgk._w8a8_block_kernel, torch.device("cuda", 0), triton_pdl.PDL_MAX_M + 1)
    assert not triton_pdl.use_pdl(tgk._w8a8_block_kernel, torch.device("cuda", 0), 1, triton_pdl.PDL_MAX_WEIGHT + 1)
    if type(tgk._w8a8_block_kernel).__name__ == "InterpretedFunction":
        assert not triton_pdl.use_pdl(tgk._w8a8_block_kernel, torch.device("cuda", 0), 1)
    triton_pdl._device_has_pdl.cache_clear()
    monkeypatch.setenv(triton_pdl.ENV_PDL, "0")
    try:
        assert not triton_pdl._device_has_pdl(0)  # off before the device is even asked
    finally:
        triton_pdl._device_has_pdl.cache_clear()


@pytest.mark.parametrize(("path", "weight_limited"), [("decode", False), ("fused", False), ("swap", True), ("gemm", True)])
def test_the_pdl_weight_limit_applies_only_behind_the_quantizer(monkeypatch: pytest.MonkeyPatch, path: str,
                                                              weight_limited: bool) -> None:
    """A GEMM that quantizes in the kernel asks for PDL at any weight size (H200 run 16); one behind
    the quantization kernel gives its weight, which PDL_MAX_WEIGHT caps."""
    asked: list[int] = []

    def record(kernel: object, device: torch.device, weight_elements: int = 0) -> bool:
        asked.append(weight_elements)
        return False

    monkeypatch.setattr(importlib.import_module("fp8select.kernels.triton_bound"), "pdl_possible", record)
    n, k = 64, 256
    w, s = _weight(n, k, 128)
    tg.linear(torch.randn(3, k), w, s, (128, 128), out_dtype=torch.float32, config=_cfg(path))
    assert asked == [n * k if weight_limited else 0]


@pytest.mark.parametrize(("block", "block_n"), [((128, 128), 64), ((128, 128), 256), ((1, 128), 64)])
@pytest.mark.parametrize("programs_per_sm", [1, 3])
def test_persistent_launch_equals_the_tile_kernel(block: tuple[int, int], block_n: int, programs_per_sm: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """PERSISTENT (a few programs looping over the tiles; one SM under the interpreter, so 1 or 3
    programs take 2-3 row tiles x 2-5 column tiles each) gives the tile kernel's bits: per-tile and
    per-column weight scales, ragged M, N and K (TMA zero-fills), bias, NaN rows kept."""
    m, n, k = 40, 300, 704
    x = _activation(m, k)
    x[7, 5] = float("nan")
    w, ws = _weight(n, k, block[0])
    bias = torch.randn(n)
    tile = _cfg("gemm", 16, block_n, TMA=1)
    persistent = replace(tile, PERSISTENT=programs_per_sm)
    grids: list[tuple[int, ...]] = []
    kernel = tgk._w8a8_persistent_kernel
    monkeypatch.setattr(importlib.import_module("fp8select.kernels.triton_bound"), "_w8a8_persistent_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: grids.append(grid) or kernel[grid]})())
    out = tg.linear(x, w, ws, block, out_dtype=torch.float32, bias=bias, config=persistent)
    assert grids == [(programs_per_sm, 1, 1)]
    ref = tg.linear(x, w, ws, block, out_dtype=torch.float32, bias=bias, config=tile)
    assert len(grids) == 1  # the tile configuration runs the tile kernel
    rows = torch.arange(m) != 7
    assert out[7].isnan().all() and torch.equal(out[rows], ref[rows])
    xq, xs = quantize_per_token_group(x[rows])
    _check(out[rows].contiguous(), x[rows], xq, xs, w, ws, block[0], bias, torch.float32)


def test_persistent_needs_the_gemm_path_tma_and_no_split() -> None:
    for change in ({"path": "fused"}, {"path": "decode"}, {"SPLIT_K": 2}, {"TMA": 0}):
        with pytest.raises(ValueError, match="PERSISTENT"):
            TritonConfig.from_dict({**_cfg("gemm", 16, 64, TMA=1).to_dict(), "PERSISTENT": 2, **change})
    with pytest.raises(ValueError, match=r"0\.\.4"):
        _cfg("gemm", 16, 64, TMA=1, PERSISTENT=5)
    cfg = _cfg("gemm", 16, 64, TMA=1, PERSISTENT=2)
    assert TritonConfig.from_dict(cfg.to_dict()) == cfg and cfg.describe().endswith(" tma p2")
    assert TritonConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "PERSISTENT"}).PERSISTENT == 0


def test_wgmma_path_off_hopper_runs_the_gemm_path_with_its_tiles() -> None:
    """Where the Gluon kernel cannot run (here: the CPU interpreter) the wgmma path is the gemm path with
    the same tiles, bit for bit, on either entry point."""
    assert not tg.wgmma_runs(torch.device("cpu"))
    m, n, k = 5, 200, 320
    x = _activation(m, k)
    xq, xs = quantize_per_token_group(x)
    w, ws = _weight(n, k, 128)
    wgmma = _cfg("wgmma")
    gemm = replace(wgmma, path="gemm")
    assert torch.equal(tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32, config=wgmma),
                       tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32, config=gemm))
    assert torch.equal(tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.bfloat16, config=wgmma),
                       tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.bfloat16, config=gemm))


def test_wgmma_kernel_only_on_sm90_with_the_triton_releases_it_is_written_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gluon's API changes between Triton releases: outside :data:`WGMMA_TRITON` (and off sm90) the wgmma path runs
    the gemm path's kernel instead of failing to compile in a forward pass."""
    decide = importlib.import_module("fp8select.kernels.triton_device")._wgmma_device.__wrapped__
    try:
        from fp8select.kernels import gluon_gemm  # noqa: F401
        importable = True
    except ImportError:  # a Triton without Gluon's Hopper API: never
        importable = False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    low, high = tg.WGMMA_TRITON
    for version, runs in ((f"{low[0]}.{low[1] - 1}.1", False), (f"{low[0]}.{low[1]}.0", True),
                          (f"{high[0]}.{high[1] - 1}.0", True), (f"{high[0]}.{high[1]}.0", False)):
        monkeypatch.setattr(triton, "__version__", version)
        assert decide(0) is (runs and importable), version
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (10, 0))
    assert decide(0) is False
