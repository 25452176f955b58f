"""NaN and +-inf in activations: a non-finite value in a token's 1x128 group makes that token's
output row NaN on every path, and leaves every other row bit for bit as it was.

Covers the torch and Triton quantizers, every Triton GEMM path (gemm, fused, decode, swap;
split-K with FIXUP 0 and 1; M = 1, 16 and 130) under the Triton interpreter, the fp64 references, and
``propagate_nonfinite_rows`` (torch and Triton). ``TRITON_INTERPRET=1`` is set before anything
imports triton (see tests/test_kernels_triton_gemm.py).
"""

from __future__ import annotations

import importlib
import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
import torch
from fp64_reference import expected, random_problem
from interpreted import rebuild

from fp8select.backends.reference import dequantize_activation
from fp8select.kernels.nonfinite import propagate_nonfinite_rows
from fp8select.kernels.quant import M_MAJOR, ROW_MAJOR, ScaleLayout, quantize_per_token_group
from fp8select.kernels.triton_config import TritonConfig
from fp8select.verify import expected_output

# numpy under the interpreter warns about inf - inf and NaN comparisons: expected here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

E4M3, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
NONFINITE = (math.nan, math.inf, -math.inf)
K = 320  # three scale groups, the last one partial


def _triton() -> tuple[object, object, object]:
    """(triton_quant, triton_gemm, triton_nonfinite) built for the interpreter; skips otherwise."""
    triton = pytest.importorskip("triton")
    if type(triton.language.max).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set; rerun with TRITON_INTERPRET=1")
    tq, tg, tn = rebuild("triton_quant", "triton_gemm", "triton_nonfinite")  # the same modules, rebuilt or not
    return tq, tg, tn


def _activation(m: int, k: int = K, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen))).to(dtype)


def _poison(x: torch.Tensor, value: float | None = None) -> tuple[torch.Tensor, list[int], set[tuple[int, int]]]:
    """A copy of ``x`` with non-finite values in some rows and groups (the partial last one too).

    ``value`` None puts NaN, +inf and -inf in different rows; else ``value`` everywhere.
    Returns the copy, the poisoned rows and their (row, group) pairs.
    """
    m = x.shape[0]
    spots = [(0, 5), (m // 2, 130), (m - 1, K - 1), (m - 1, 0)]
    bad = x.clone()
    groups: set[tuple[int, int]] = set()
    for i, (row, col) in enumerate(spots):
        bad[row, col] = NONFINITE[i % 3] if value is None else value
        groups.add((row, col // 128))
    return bad, sorted({row for row, _ in spots}), groups


def _weight(n: int, k: int = K, dtype: torch.dtype = E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    w = (torch.randn(n, k, generator=gen) * 64).clamp(-200, 200).to(dtype)
    return w, torch.rand(-(-n // 128), -(-k // 128), generator=gen) * 1e-2 + 1e-3


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int32 if t.element_size() == 4
                               else torch.int16)


def _check_quantized(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, groups: set[tuple[int, int]],
                     clean: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype) -> None:
    """Poisoned groups: NaN scale and NaN values; every other group bit for bit as ``clean``."""
    q_clean, s_clean = clean
    m, g = s.shape
    poisoned = torch.zeros(m, g, dtype=torch.bool)
    for row, group in groups:
        poisoned[row, group] = True
    assert torch.equal(s.isnan(), poisoned)
    assert torch.equal(_bits(s)[~poisoned], _bits(s_clean)[~poisoned])
    cols = poisoned.repeat_interleave(128, dim=1)[:, : x.shape[1]]
    assert torch.equal(q.float().isnan(), cols)
    nan_bits = {E4M3: {0x7F, 0xFF}, FNUZ: {0x80}}[dtype]
    assert set(_bits(q)[cols].unique().tolist()) <= nan_bits
    assert torch.equal(_bits(q)[~cols], _bits(q_clean)[~cols])


@pytest.mark.parametrize("dtype", [E4M3, FNUZ])
@pytest.mark.parametrize("layout", [ROW_MAJOR, ScaleLayout(mn_major=True, m_align=4, ue8m0=True)])
@pytest.mark.parametrize("m", [1, 16, 256])
def test_torch_quantizer(dtype: torch.dtype, layout: ScaleLayout, m: int) -> None:
    x = _activation(m)
    for value in (None, *NONFINITE) if m > 1 else NONFINITE:
        bad, _, groups = _poison(x, value)
        q, s = quantize_per_token_group(bad, dtype=dtype, layout=layout)
        _check_quantized(bad, q, s, groups, quantize_per_token_group(x, dtype=dtype, layout=layout), dtype)


TRITON_QUANT_CASES = [(16, dtype, layout) for dtype in (E4M3, FNUZ)
                      for layout in (ROW_MAJOR, M_MAJOR, ScaleLayout(mn_major=True, m_align=4, ue8m0=True))]
TRITON_QUANT_CASES += [(1, E4M3, ROW_MAJOR), (256, E4M3, M_MAJOR)]


@pytest.mark.parametrize(("m", "dtype", "layout"), TRITON_QUANT_CASES)
def test_triton_quantizer_matches_torch(m: int, dtype: torch.dtype, layout: ScaleLayout) -> None:
    tq, _, _ = _triton()
    x = _activation(m, dtype=torch.float16)
    for value in (None,) if m > 1 else NONFINITE:  # M > 1: NaN, +inf and -inf in different rows
        bad, _, groups = _poison(x, value)
        q, s = tq.quantize_per_token_group_triton(bad, dtype=dtype, layout=layout)  # type: ignore[attr-defined]
        _check_quantized(bad, q, s, groups, quantize_per_token_group(x, dtype=dtype, layout=layout), dtype)
        q_ref, s_ref = quantize_per_token_group(bad, dtype=dtype, layout=layout)
        assert torch.equal(q.float().isnan(), q_ref.float().isnan()) and torch.equal(_bits(s), _bits(s_ref))
        finite = ~q_ref.float().isnan()
        assert torch.equal(_bits(q)[finite], _bits(q_ref)[finite])


def _config(path: str, split_k: int, fixup: int, m: int) -> TritonConfig:
    block_m = 64 if m > 64 else 16  # fewer interpreted programs at the larger M
    return TritonConfig.from_dict({"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": split_k,
                                   "num_warps": 4, "num_stages": 2, "path": path, "FIXUP": fixup})


def _check_rows(out: torch.Tensor, clean: torch.Tensor, rows: list[int]) -> None:
    """``rows`` entirely NaN; every other row bit for bit as ``clean``."""
    bad = torch.zeros(out.shape[0], dtype=torch.bool)
    bad[rows] = True
    assert out[bad].isnan().all()
    assert torch.equal(_bits(out[~bad]), _bits(clean[~bad]))


@pytest.mark.parametrize("path", ["gemm", "fused", "decode", "swap"])
@pytest.mark.parametrize(("split_k", "fixup"), [(1, 0), (2, 0), (2, 1)])
def test_every_triton_path(path: str, split_k: int, fixup: int) -> None:
    _, tg, _ = _triton()
    n = 96  # ragged against BLOCK_N 64 and the 128-row weight blocks
    w, ws = _weight(n)
    bias = torch.randn(n)
    # M = 1 takes one value per split mode (each path sees all three); M > 1 puts NaN, +inf and
    # -inf in different rows; the larger M (several M tiles, the last partial) once per path.
    one_value = NONFINITE[[(1, 0), (2, 0), (2, 1)].index((split_k, fixup))]
    for m in (1, 16, 130) if fixup else (1, 16):
        cfg = _config(path, split_k, fixup, m)
        x = _activation(m, seed=m)
        clean = tg.linear(x, w, ws, (128, 128), out_dtype=torch.bfloat16, bias=bias, config=cfg)  # type: ignore[attr-defined]
        for value in (one_value,) if m == 1 else (None,):
            bad, rows, _ = _poison(x, value)
            out = tg.linear(bad, w, ws, (128, 128), out_dtype=torch.bfloat16, bias=bias, config=cfg)  # type: ignore[attr-defined]
            _check_rows(out, clean, rows)
            if path in ("gemm", "swap") and m == 16:
                # the prequantized entry, fed by the torch quantizer's NaN scales and values
                xq, xs = quantize_per_token_group(bad, layout=M_MAJOR)
                pre = tg.w8a8_block_gemm(xq, xs, w, ws, (128, 128), out_dtype=torch.float32, config=cfg)  # type: ignore[attr-defined]
                assert torch.equal(pre.isnan().all(dim=1), out.isnan().all(dim=1))


def test_fnuz_and_1x128_weight_blocks() -> None:
    _, tg, _ = _triton()
    n = 80
    for dtype, block in ((FNUZ, (128, 128)), (E4M3, (1, 128))):
        w, _ = _weight(n, dtype=dtype)
        ws = torch.rand(-(-n // block[0]), 3) * 1e-2 + 1e-3
        x = _activation(16)
        bad, rows, _ = _poison(x)
        for path in ("decode", "gemm"):
            cfg = _config(path, 2, 1, 16)
            clean = tg.linear(x, w, ws, block, out_dtype=torch.float32, config=cfg)  # type: ignore[attr-defined]
            _check_rows(tg.linear(bad, w, ws, block, out_dtype=torch.float32, config=cfg), clean, rows)  # type: ignore[attr-defined]


def test_fp64_references_give_nan_rows() -> None:
    """The references the backends are checked against have the same semantics."""
    w, ws = _weight(96)
    x = _activation(16)
    bad, rows, _ = _poison(x)
    for ref, clean in ((expected(bad, w, ws, (128, 128)), expected(x, w, ws, (128, 128))),
                       (expected_output(bad, w, ws, (128, 128)), expected_output(x, w, ws, (128, 128)))):
        _check_rows(ref, clean, rows)
    # and the reference backend's dequantized activation is NaN on the poisoned rows
    q, s = quantize_per_token_group(bad)
    deq = dequantize_activation(q, s)
    assert torch.equal(deq.isnan().any(dim=1), torch.isin(torch.arange(16), torch.tensor(rows)))


@pytest.mark.parametrize(("engine", "m"), [("torch", 1), ("torch", 16), ("torch", 256), ("triton", 1), ("triton", 16),
                                           ("triton", 100)])
def test_propagate_nonfinite_rows(engine: str, m: int) -> None:
    if engine == "triton":
        _, _, tn = _triton()
        propagate = tn.propagate_nonfinite_rows_triton  # type: ignore[attr-defined]
    else:
        propagate = propagate_nonfinite_rows
    x = _activation(m, k=1200)  # K spans two of the Triton kernel's K tiles
    out = torch.randn(m, 2100).to(torch.bfloat16)[:, ::2]  # strided output, N spans three N tiles
    out[0, :3] = torch.tensor([-0.0, 0.0, -1.0])  # signed zeros must survive untouched
    for value in NONFINITE:
        bad = x.clone()
        rows = sorted({0, m // 2, m - 1})
        for i, row in enumerate(rows):
            bad[row, 1199 - 600 * i] = value
        before = out.clone()
        assert propagate(bad, out) is out
        _check_rows(out, before, rows)
        out.copy_(before)
    untouched = out.clone()
    propagate(x, out)
    assert torch.equal(_bits(out), _bits(untouched))


def test_propagate_nonfinite_rows_checks_arguments() -> None:
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="same M"):
        propagate_nonfinite_rows(x, torch.empty(3, 5))
    with pytest.raises(ValueError, match="floating point"):
        propagate_nonfinite_rows(x, torch.empty(4, 5, dtype=torch.int32))
    empty = torch.empty(0, 5)
    assert propagate_nonfinite_rows(torch.empty(0, 8), empty) is empty
    x[1, 2] = math.inf
    out = propagate_nonfinite_rows(x.to(torch.float16), torch.zeros(4, 3, dtype=torch.float32))
    assert out.isnan().all(dim=1).tolist() == [False, True, False, False]


def test_only_the_poisoned_rows_are_read_as_nan_with_fixup_counters_reset() -> None:
    """A NaN row in one split-K launch leaves the FIXUP counters at zero for the next launch."""
    _, tg, _ = _triton()
    w, ws = _weight(96)
    x = _activation(16)
    bad, rows, _ = _poison(x)
    cfg = _config("decode", 2, 1, 16)
    first = tg.linear(bad, w, ws, (128, 128), out_dtype=torch.float32, config=cfg)  # type: ignore[attr-defined]
    again = tg.linear(x, w, ws, (128, 128), out_dtype=torch.float32, config=cfg)  # type: ignore[attr-defined]
    assert torch.isfinite(again).all()
    _check_rows(first, again, rows)
    counters = importlib.import_module("fp8select.kernels.triton_device")._COUNTERS
    assert all(int(buf.abs().sum()) == 0 for buf in counters.values())


def test_a_layer_owns_its_split_k_counters_and_no_call_caches_one() -> None:
    """A layer's split-K launches use the counters made at prepare(), so a call allocates nothing
    that outlives it (what Inductor's CUDA-graph trees require); too few counters fall back to
    the two-kernel sum."""
    import fp8select
    from fp8select.kernels import triton_device
    from fp8select.kernels import triton_gemm as tg
    from fp8select.kernels.triton_config import TritonConfig

    caps = fp8select.Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",), packages={"triton": "3.9.0"},
                                  env={"TRITON_INTERPRET": "1"})
    w, s = random_problem(256, 512, seed=3)
    layer = fp8select.resolve(caps, backend="triton", plugins=False, tuning=False).prepare(w, s)
    counters = layer.prepared["triton"].extra["fixup_counters"]
    assert counters.dtype == torch.int32 and counters.numel() >= 32 * 8 and not counters.any()
    triton_device._COUNTERS.clear()
    cfg = TritonConfig.from_dict({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 4,
                                  "num_warps": 4, "num_stages": 2, "path": "decode", "FIXUP": 1})
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    out = tg.linear(x, w, s, (128, 128), out_dtype=torch.bfloat16, config=cfg, counters=counters)
    assert triton_device._COUNTERS == {} and not counters.any()  # used and left at zero, nothing cached
    few = torch.zeros(1, dtype=torch.int32)
    again = tg.linear(x, w, s, (128, 128), out_dtype=torch.bfloat16, config=cfg, counters=few)
    assert torch.equal(out, again) and triton_device._COUNTERS == {}  # summed by the second kernel instead
