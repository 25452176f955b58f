"""Tests for fp8select.kernels.quant (torch) and fp8select.kernels.triton_quant (Triton).

The Triton kernels run on CPU under the Triton interpreter. Triton decides interpreter or
compiled mode when each ``@triton.jit`` function is decorated, its own ``triton.language``
helpers included, so ``TRITON_INTERPRET=1`` is set here before anything imports triton.
Expected values are computed here independently in float64.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8select.kernels.quant import (
    M_MAJOR,
    ROW_MAJOR,
    ScaleLayout,
    fp8_max,
    quantize_per_token_group,
)

E4M3 = torch.float8_e4m3fn
E4M3_FNUZ = torch.float8_e4m3fnuz
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


QuantFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(scope="module")
def quant_triton() -> QuantFn:
    """The Triton quantizer, running under the interpreter (skips without triton)."""
    triton = pytest.importorskip("triton")
    if type(triton.language.max).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set; rerun with TRITON_INTERPRET=1")
    module = importlib.import_module("fp8select.kernels.triton_quant")
    if type(module._quant_kernel).__name__ != "InterpretedFunction":
        module = importlib.reload(module)  # decorated before the variable was set
    return module.quantize_per_token_group_triton


def _activation(m: int, k: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """Random non-zero activations with per-token magnitudes spread over ~6 decades."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen) * 3)
    x = torch.where(x == 0, torch.full_like(x, 1e-3), x)
    return x.to(dtype)


def _group_amax64(x: torch.Tensor, group: int) -> torch.Tensor:
    """Per-token, per-group amax in float64 (independent of the library's padding)."""
    m, k = x.shape
    groups = math.ceil(k / group)
    out = torch.empty((m, groups), dtype=torch.float64)
    for g in range(groups):
        out[:, g] = x[:, g * group : (g + 1) * group].double().abs().amax(dim=1)
    return out


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# ---------------------------------------------------------------------------------------------
# torch reference implementation
# ---------------------------------------------------------------------------------------------


def test_fp8_max_values() -> None:
    assert fp8_max(E4M3) == 448.0
    assert fp8_max(E4M3_FNUZ) == 240.0
    with pytest.raises(ValueError, match="float8"):
        fp8_max(torch.bfloat16)


@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize(("m", "k", "group"), [(5, 256, 128), (7, 300, 128), (3, 200, 64), (2, 100, 128)])
def test_torch_quant_numerics(in_dtype: torch.dtype, m: int, k: int, group: int) -> None:
    x = _activation(m, k, in_dtype)
    q, s = quantize_per_token_group(x, group, dtype=E4M3)
    groups = math.ceil(k / group)
    assert q.shape == (m, k) and q.dtype == E4M3 and q.is_contiguous()
    assert s.shape == (m, groups) and s.dtype == torch.float32 and s.stride() == (groups, 1)
    expect = _group_amax64(x, group) / 448.0
    torch.testing.assert_close(s.double(), expect, rtol=1e-6, atol=0)
    # Every element within half an e4m3 ulp (2**-4 relative) plus half the subnormal quantum.
    s_full = s.double().repeat_interleave(group, dim=1)[:, :k]
    xd = x.double()
    err = (q.double() * s_full - xd).abs()
    assert bool((err <= xd.abs() * 2.0**-4 + 2.0**-10 * s_full).all())
    # The largest element of each group maps to the fp8 maximum.
    qmax = _group_amax64(q.double(), group)
    assert bool((qmax == 448.0).all())


def test_torch_quant_all_zero_group_uses_eps() -> None:
    x = _activation(3, 256)
    x[1, 128:] = 0
    q, s = quantize_per_token_group(x, eps=1e-10)
    assert torch.isfinite(s).all() and s[1, 1].item() == pytest.approx(1e-10 / 448.0, rel=1e-6)
    assert bool((q[1, 128:].float() == 0).all())


def test_torch_quant_fnuz_max_240() -> None:
    x = _activation(4, 256)
    q, s = quantize_per_token_group(x, dtype=E4M3_FNUZ)
    assert q.dtype == E4M3_FNUZ
    assert bool((_group_amax64(q.double(), 128) == 240.0).all())
    torch.testing.assert_close(s.double(), _group_amax64(x, 128) / 240.0, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("layout", "m", "expect_stride"),
    [
        (ROW_MAJOR, 5, (3, 1)),
        (M_MAJOR, 5, (1, 5)),
        (ScaleLayout(mn_major=True, m_align=4), 5, (1, 8)),
        (ScaleLayout(mn_major=True, m_align=4), 8, (1, 8)),
        (ScaleLayout(mn_major=True, m_align=4, ue8m0=True), 3, (1, 4)),
    ],
)
def test_torch_quant_layouts(layout: ScaleLayout, m: int, expect_stride: tuple[int, int]) -> None:
    x = _activation(m, 300)
    _, s_ref = quantize_per_token_group(x, layout=ROW_MAJOR)
    _, s = quantize_per_token_group(x, layout=layout)
    assert s.shape == (m, 3)
    assert s.stride() == expect_stride
    if not layout.ue8m0:
        assert torch.equal(_bytes(s), _bytes(s_ref))


def test_torch_quant_ue8m0_powers_of_two() -> None:
    x = _activation(6, 384)
    _, plain = quantize_per_token_group(x)
    q, s = quantize_per_token_group(x, layout=ScaleLayout(ue8m0=True))
    mant, _ = torch.frexp(s.double())
    assert bool((mant == 0.5).all()), "ue8m0 scales must be exact powers of two"
    expect = torch.tensor([[2.0 ** math.ceil(math.log2(v)) for v in row] for row in plain.double().tolist()])
    assert torch.equal(s.double(), expect.double())
    # Quantized with the rounded scale: group maxima are at most 448 and still dequantize well.
    s_full = s.double().repeat_interleave(128, dim=1)
    assert bool((q.double().abs() <= 448).all())
    err = (q.double() * s_full - x.double()).norm() / x.double().norm()
    assert err < 0.1


def test_torch_quant_m_zero() -> None:
    x = torch.empty((0, 300), dtype=torch.bfloat16)
    for layout in (ROW_MAJOR, M_MAJOR, ScaleLayout(mn_major=True, m_align=4)):
        q, s = quantize_per_token_group(x, layout=layout)
        assert q.shape == (0, 300) and s.shape == (0, 3)


def test_torch_quant_non_contiguous_input() -> None:
    base = _activation(300, 20, torch.float16)
    x = base.t()  # [20, 300], strides (1, 20)
    q, s = quantize_per_token_group(x)
    q_ref, s_ref = quantize_per_token_group(x.contiguous())
    assert torch.equal(_bytes(q), _bytes(q_ref)) and torch.equal(_bytes(s), _bytes(s_ref))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"x": torch.zeros(2, 3, 4)}, "2-D"),
        ({"x": torch.zeros(2, 128, dtype=torch.int32)}, "bfloat16"),
        ({"group_size": 0}, "group_size"),
        ({"dtype": torch.float16}, "float8"),
        ({"eps": 0.0}, "eps"),
    ],
)
def test_torch_quant_rejects_bad_args(kwargs: dict, match: str) -> None:
    args = {"x": torch.ones(2, 128), "group_size": 128, "dtype": E4M3, "eps": 1e-10, **kwargs}
    with pytest.raises(ValueError, match=match):
        quantize_per_token_group(args.pop("x"), args.pop("group_size"), **args)


def test_scale_layout_rejects_bad_alignment() -> None:
    with pytest.raises(ValueError, match="m_align"):
        ScaleLayout(mn_major=True, m_align=0)


def test_importing_kernels_package_does_not_import_triton() -> None:
    code = (
        "import sys, fp8select.kernels, fp8select.kernels.quant; "
        "assert 'triton' not in sys.modules, 'triton imported'"
    )
    import fp8select

    root = str(Path(next(iter(fp8select.__path__))).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------
# Triton kernel: bitwise equal to the torch implementation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize("dtype", [E4M3, E4M3_FNUZ])
@pytest.mark.parametrize(
    "layout",
    [ROW_MAJOR, M_MAJOR, ScaleLayout(mn_major=True, m_align=4), ScaleLayout(mn_major=True, m_align=4, ue8m0=True)],
)
def test_triton_quant_bitwise_equal(quant_triton: QuantFn, in_dtype: torch.dtype, dtype: torch.dtype, layout: ScaleLayout) -> None:
    x = _activation(19, 300, in_dtype, seed=1)
    q_ref, s_ref = quantize_per_token_group(x, dtype=dtype, layout=layout)
    q, s = quant_triton(x, dtype=dtype, layout=layout)
    assert q.dtype == dtype and q.is_contiguous()
    assert s.shape == s_ref.shape and s.stride() == s_ref.stride()
    assert torch.equal(_bytes(q), _bytes(q_ref))
    assert torch.equal(_bytes(s), _bytes(s_ref))


def test_triton_quant_layout_strides(quant_triton: QuantFn) -> None:
    x = _activation(5, 256)
    assert quant_triton(x, layout=ROW_MAJOR)[1].stride() == (2, 1)
    assert quant_triton(x, layout=M_MAJOR)[1].stride() == (1, 5)
    _, s = quant_triton(x, layout=ScaleLayout(mn_major=True, m_align=4, ue8m0=True))
    assert s.stride() == (1, 8)
    mant, _ = torch.frexp(s.double())
    assert bool((mant == 0.5).all())


def test_triton_quant_zero_group_and_m_zero(quant_triton: QuantFn) -> None:
    x = _activation(4, 256)
    x[2, :128] = 0
    q_ref, s_ref = quantize_per_token_group(x)
    q, s = quant_triton(x)
    assert torch.equal(_bytes(q), _bytes(q_ref)) and torch.equal(_bytes(s), _bytes(s_ref))
    q0, s0 = quant_triton(x[:0], layout=M_MAJOR)
    assert q0.shape == (0, 256) and s0.shape == (0, 2)


def test_triton_quant_non_contiguous_input(quant_triton: QuantFn) -> None:
    base = _activation(300, 24)
    for x in (base.t(), _activation(9, 700)[:, 50:650:2]):
        q_ref, s_ref = quantize_per_token_group(x.contiguous())
        q, s = quant_triton(x)
        assert torch.equal(_bytes(q), _bytes(q_ref)) and torch.equal(_bytes(s), _bytes(s_ref))


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 9),
    k=st.integers(1, 300),
    group=st.sampled_from([32, 64, 128]),
    log_scale=st.floats(-20, 20),
    seed=st.integers(0, 2**16),
)
def test_triton_quant_matches_torch_property(quant_triton: QuantFn, m: int, k: int, group: int, log_scale: float, seed: int) -> None:
    x = (_activation(m, k, torch.float32, seed=seed) * 2.0**log_scale).to(torch.bfloat16)
    q_ref, s_ref = quantize_per_token_group(x, group)
    q, s = quant_triton(x, group)
    assert torch.equal(_bytes(q), _bytes(q_ref)) and torch.equal(_bytes(s), _bytes(s_ref))
