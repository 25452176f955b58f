"""Property tests: random shapes, strides, leading dimensions and dtypes against the fp64 reference.

Two implementations are exercised: the ``reference`` backend through the layer, and the
Triton kernels under the interpreter (directly, and through the layer with
``backend="triton"``). Each example is compared with ``tests/fp64_reference.py``, which
quantizes activations per 1x128 group and multiplies in float64 independently of the
library. Examples are few and small so the file runs in well under a minute on two cores.
"""

from __future__ import annotations

import importlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported in this process

from typing import Any

import pytest
import torch
from fp64_reference import expected, quantize_groups
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from interpreted import rebuild

from fp8select import Capabilities, Selection, resolve
from fp8select.kernels.triton_config import TritonConfig

E4M3 = torch.float8_e4m3fn
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCKS = ((128, 128), (1, 128))
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")

CPU = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn", "float8_e5m2"))
CPU_TRITON = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn", "float8_e5m2"),
                          packages={"triton": "3.9.0"}, env={"TRITON_INTERPRET": "1"})

FEW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Per-element tolerance relative to the element, by output dtype: one unit in the last place
# (the Triton interpreter truncates instead of rounding to nearest, which costs up to one unit).
RTOL = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 1e-5}
# ...plus an absolute floor relative to the largest output, for fp32 accumulation over K.
ATOL_FRACTION = 1e-4


def _weight(n: int, k: int, block: tuple[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 100).clamp(-440, 440)
    w = torch.where(w.abs() < 1e-2, torch.full_like(w, 0.5), w).to(E4M3)
    s = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) * 1e-2 + 1e-3
    return w, s


def _activation(lead: tuple[int, ...], k: int, dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    """A ``[*lead, K]`` activation with the given memory layout (values are what matter, not strides)."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(*lead, k, generator=gen) * torch.exp(torch.randn(*lead, 1, generator=gen))
    if layout == "transposed":
        x = full.to(dtype).transpose(-1, -2).contiguous().transpose(-1, -2)  # K-stride != 1
    elif layout == "sliced":
        wide = torch.zeros(*lead, 2 * k + 3, dtype=dtype)
        wide[..., 3: 3 + 2 * k: 2] = full.to(dtype)
        x = wide[..., 3: 3 + 2 * k: 2]
    elif layout == "expanded" and lead and lead[-1] > 0:
        x = full[..., :1, :].to(dtype).expand(*lead, k)  # one row repeated, stride 0
    else:
        x = full.to(dtype)
    return x


def _quantize_fp32(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 1 x ``group`` e4m3 quantization with the documented fp32 arithmetic.

    ``scale = max(amax, 1e-10) / 448`` and ``x / scale`` in fp32, rounded to nearest even: the
    recipe every backend implements bit for bit, written here independently of the library.
    (``fp64_reference`` computes the scale in float64, which can move a value by one e4m3 step,
    so it is used for the relative-error check only.)
    """
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.zeros((m, groups * group), dtype=torch.float32)
    padded[:, :k] = x.to(torch.float32)
    tiles = padded.view(m, groups, group)
    scale = tiles.abs().amax(dim=2).clamp_min(1e-10) / 448.0
    q = (tiles / scale[:, :, None]).clamp(-448.0, 448.0).to(E4M3)
    return q.view(m, groups * group)[:, :k], scale


def _strict_expected(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int],
                     bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """float64 ``[..., N]`` from activations quantized exactly as the backends must."""
    k = w.shape[1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if input_scale is None:
        q, xs = _quantize_fp32(x2, block[1])
    else:
        q, xs = x2, input_scale.reshape(-1, input_scale.shape[-1])
    return expected(q, w, s, block, bias, input_scale=xs).reshape(*lead, w.shape[0])


def _assert_close(out: torch.Tensor, strict: torch.Tensor, loose: torch.Tensor, out_dtype: torch.dtype) -> None:
    """Every element within one output ulp of the strict fp64 result; relative Frobenius error against fp64_reference
    below 1e-2 beyond the recipe's own."""
    assert out.dtype == out_dtype and tuple(out.shape) == tuple(strict.shape)
    if strict.numel() == 0:
        return
    out64 = out.to(torch.float64)
    assert bool(torch.isfinite(out64).all())
    atol = ATOL_FRACTION * float(strict.abs().max())
    excess = (out64 - strict).abs() - (RTOL[out_dtype] * strict.abs() + atol)
    worst = float(excess.max())
    assert worst <= 0, f"an element is off by {worst:.3g} beyond rtol={RTOL[out_dtype]:.3g}, atol={atol:.3g}"
    rel = float((out64 - loose).norm() / loose.norm().clamp_min(1e-30))
    # The recipe's own distance from fp64_reference: its fp64 scale moves a value at a rounding tie by one e4m3
    # step (6-12%), which a handful of products (K 2, N 1) does not average away.
    recipe = float((strict - loose).norm() / loose.norm().clamp_min(1e-30))
    assert rel < 1e-2 + recipe, f"relative Frobenius error {rel:.3g} against fp64_reference (the recipe's {recipe:.3g})"


@st.composite
def layer_problems(draw: Any, max_m: int = 64) -> dict[str, Any]:
    m = draw(st.integers(0, max_m))
    lead_extra = draw(st.lists(st.integers(1, 3), max_size=2))
    return {
        "lead": (*lead_extra, m),
        "n": draw(st.integers(1, 300)),
        "k": draw(st.integers(1, 200)),
        "block": draw(st.sampled_from(BLOCKS)),
        "act": draw(st.sampled_from(ACT_DTYPES)),
        "out": draw(st.sampled_from((None, *ACT_DTYPES))),
        "layout": draw(st.sampled_from(LAYOUTS)),
        "bias": draw(st.sampled_from((None, "act", "fp32"))),
        "seed": draw(st.integers(0, 2**16)),
    }


def _run_layer(selection: Selection, p: dict[str, Any]) -> None:
    w, s = _weight(p["n"], p["k"], p["block"], p["seed"])
    x = _activation(p["lead"], p["k"], p["act"], p["layout"], p["seed"] + 1)
    bias = None
    if p["bias"] is not None:
        bias = torch.randn(p["n"]).to(p["act"] if p["bias"] == "act" else torch.float32)
    layer = selection.prepare(w, s, p["block"], out_dtype=p["out"])
    out = layer(x, bias=bias)
    xc = x.contiguous()
    _assert_close(out, _strict_expected(xc, w, s, p["block"], bias), expected(xc, w, s, p["block"], bias),
                  p["out"] or p["act"])


@pytest.fixture(scope="module")
def reference() -> Selection:
    return resolve(CPU, plugins=False)


@FEW
@given(p=layer_problems())
def test_reference_layer_matches_fp64(reference: Selection, p: dict[str, Any]) -> None:
    assert reference.backend.name == "reference"
    _run_layer(reference, p)


@FEW
@given(m=st.integers(0, 40), n=st.integers(1, 300), k=st.integers(1, 200), block=st.sampled_from(BLOCKS),
       out=st.sampled_from(ACT_DTYPES), seed=st.integers(0, 2**16))
def test_reference_prequantized_input_matches_fp64(reference: Selection, m: int, n: int, k: int,
                                                   block: tuple[int, int], out: torch.dtype, seed: int) -> None:
    w, s = _weight(n, k, block, seed)
    q, xs = quantize_groups(torch.randn(m, k, generator=torch.Generator().manual_seed(seed)))
    xs32 = xs.to(torch.float32)
    y = reference.prepare(w, s, block, out_dtype=out)(q.contiguous(), input_scale=xs32)
    ref = expected(q, w, s, block, input_scale=xs32)
    _assert_close(y, ref, ref, out)


# --- Triton, under the interpreter ---------------------------------------------------------------------

def _triton() -> tuple[Any, Any]:
    """The kernel modules built for the interpreter; skips with the reason when that is impossible."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"triton is not importable: {exc}")
    try:
        quant = importlib.import_module("fp8select.kernels.triton_quant")
        gemm = importlib.import_module("fp8select.kernels.triton_gemm")
    except ImportError as exc:
        pytest.skip(f"fp8select.kernels.triton_gemm is not importable yet: {exc}")
    if type(importlib.import_module("fp8select.kernels.triton_gemm_kernels")._w8a8_block_kernel).__name__ != "InterpretedFunction":
        import triton.language as tl

        if type(tl.max).__name__ != "InterpretedFunction":
            pytest.skip("triton was imported before TRITON_INTERPRET=1 was set; run this file on its own")
        quant, gemm = rebuild("triton_quant", "triton_gemm")
    return quant, gemm


@pytest.fixture(scope="module")
def triton_selection() -> Selection:
    _triton()
    return resolve(CPU_TRITON, backend="triton", plugins=False)


@FEW
@given(p=layer_problems(max_m=72))
def test_triton_layer_matches_fp64(triton_selection: Selection, p: dict[str, Any]) -> None:
    """Through the layer: fused quantization for M <= 64, separate quantization above."""
    assert triton_selection.backend.name == "triton"
    _run_layer(triton_selection, p)


@FEW
@given(m=st.integers(0, 64), n=st.integers(1, 300), k=st.integers(1, 300), block=st.sampled_from(BLOCKS),
       out=st.sampled_from(ACT_DTYPES), m_major=st.booleans(), strided_a=st.booleans(),
       split_k=st.sampled_from((1, 2)), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_triton_gemm_matches_fp64(m: int, n: int, k: int, block: tuple[int, int], out: torch.dtype, m_major: bool,
                                  strided_a: bool, split_k: int, bias: bool, seed: int) -> None:
    """``w8a8_block_gemm`` on a pre-quantized activation: scale layouts, strides and split-K."""
    _, gemm = _triton()
    w, s = _weight(n, k, block, seed)
    q, xs = quantize_groups(torch.randn(m, k, generator=torch.Generator().manual_seed(seed)))
    a_scale = xs.to(torch.float32)
    if m_major:
        a_scale = a_scale.t().contiguous().t()  # [M, G] with strides (1, M)
    a = q.contiguous()
    if strided_a:
        wide = torch.zeros(m, k + 16, dtype=E4M3)
        wide[:, 16:] = a
        a = wide[:, 16:]
    b = torch.randn(n).to(torch.float32) if bias else None
    config = TritonConfig.from_dict({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": split_k,
                                     "num_warps": 4, "num_stages": 2})
    y = gemm.w8a8_block_gemm(a, a_scale, w, s, block, out_dtype=out, bias=b, config=config)
    ref = expected(q, w, s, block, b, input_scale=xs.to(torch.float32))
    _assert_close(y, ref, ref, out)


@FEW
@given(m=st.integers(0, 64), n=st.integers(1, 300), k=st.integers(1, 200), block=st.sampled_from(BLOCKS),
       act=st.sampled_from(ACT_DTYPES), out=st.sampled_from(ACT_DTYPES), layout=st.sampled_from(LAYOUTS),
       seed=st.integers(0, 2**16))
def test_triton_fused_matches_fp64(m: int, n: int, k: int, block: tuple[int, int], act: torch.dtype, out: torch.dtype,
                                   layout: str, seed: int) -> None:
    """``w8a8_block_linear_fused``: quantization inside the GEMM, any activation strides."""
    _, gemm = _triton()
    w, s = _weight(n, k, block, seed)
    x = _activation((m,), k, act, layout, seed + 1)
    y = gemm.w8a8_block_linear_fused(x, w, s, block, out_dtype=out)
    xc = x.contiguous()
    _assert_close(y, _strict_expected(xc, w, s, block), expected(xc, w, s, block), out)
