"""The vendor MoE routes as a GPU runs them, on CPU: fp8select's Triton kernels around the GEMMs (slot
quantization, silu*up with its quantization, weighted sum) under Triton's interpreter, against the strict
fakes of DeepGEMM's and sgl-kernel's grouped GEMMs, every buffer those kernels allocate starting NaN.

The adapters' own tests (tests/test_moe_deepgemm.py, tests/test_moe_cutlass.py) run the torch twins of these
kernels; what only the kernels do is checked here: bounds they keep their programs within (the masked
layout's silu*up covers M rows of each expert) and rows they leave unwritten (a row read that nothing wrote
is NaN). Each route meets the semantics on ids a checked call would reject, as an unchecked one (a CUDA graph,
``check_ids=False``) runs them: ids outside ``[0, E)`` count nowhere, every slot of a repeated id counts except
past M on one expert of the masked layout, which drops them.

``TRITON_INTERPRET=1`` is set before triton is first imported (see tests/test_kernels_triton_gemm.py).
"""

from __future__ import annotations

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
import torch
from interpreted import NanEmpty, moe_kernels

pytest.importorskip("triton")

from fakes import install
from fp64_moe_reference import (
    assert_minus_one_and_nan_rows,
    expected_moe,
    random_moe,
    random_routing,
    rel_err,
    with_minus_ones,
    with_strays,
)
from matrix import MATRIX

from fp8select.backends import moe, moe_cutlass, moe_deepgemm
from fp8select.backends.moe import MoeWeights
from fp8select.kernels import call_replay

moe_triton = moe_kernels()

E, H, INTER = 4, 256, 128
TOL = 1e-2
ROUTES = (("deepgemm", "contiguous"), ("deepgemm", "masked"), ("cutlass", "offsets"))
_CAPS = {
    "deepgemm": dataclasses.replace(MATRIX["h200-deepgemm"][0], package_symbols={
        "deep_gemm": ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked")}),
    "cutlass": dataclasses.replace(MATRIX["h200-sglkernel"][0],
                                   packages={**MATRIX["h200-sglkernel"][0].packages, "sgl_kernel": "0.4.4"},
                                   package_symbols={"sgl_kernel": ("fp8_blockwise_scaled_grouped_mm",
                                                                   "prepare_moe_input")}),
}
_BACKENDS = {"deepgemm": (moe_deepgemm, moe_deepgemm.DeepGemmMoe, "deep_gemm"),
             "cutlass": (moe_cutlass, moe_cutlass.CutlassMoe, "sgl_kernel")}


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(E, H, INTER, seed=0)


def _routes(monkeypatch, problem, name: str, layout: str):  # type: ignore[no-untyped-def]
    """``(kernels, twins)``: the route with fp8select's Triton kernels around the fake GEMMs, as on a GPU, and with
    their torch twins, as the adapters' own CPU tests run it."""
    module, backend_class, package = _BACKENDS[name]
    install(monkeypatch, package)
    backend, caps = backend_class(), _CAPS[name]
    prepared = backend.prepare(MoeWeights(*problem.weights(), (128, 128)), caps)
    twins = backend.bind(prepared, layout, None, caps)
    monkeypatch.setattr(module, "helpers", lambda device: moe.Helpers(
        moe_triton.quantize_slots, moe_triton.silu_mul_quant, moe_triton.weighted_sum, call_replay.vendor_call))
    monkeypatch.setattr(moe_triton, "torch", NanEmpty())
    return backend.bind(prepared, layout, None, caps), twins


@pytest.mark.parametrize(("name", "layout"), ROUTES)
@pytest.mark.parametrize(("m", "k"), [(1, 2), (7, 2), (40, 3), (150, 2)])
def test_as_the_torch_twins_with_minus_one_and_stray_ids(monkeypatch, problem, name: str, layout: str, m: int,
                                                         k: int) -> None:  # type: ignore[no-untyped-def]
    """Within 1e-2 of the same route with the torch twins (checked against fp64 by the adapters' tests; here a
    token routed to one expert can be 3.7e-2 off the bf16-rounding fp64 reference on both paths alike: I = 128
    is one quantization group, and fp32 against fp64 silu moves its fp8 roundings)."""
    run, twins = _routes(monkeypatch, problem, name, layout)
    w, ids = random_routing(m, k, E, seed=m)
    x = torch.randn(m, H, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    ids = with_minus_ones(ids)
    y = run(x, w, ids)
    assert rel_err(y, twins(x, w, ids).double()) < TOL
    if m >= 3:
        stray, minus = with_strays(ids, E)
        assert torch.equal(run(x, w, stray), run(x, w, minus))


@pytest.mark.parametrize(("name", "layout"), ROUTES)
def test_a_repeated_id_counts_each_slot_or_past_m_is_dropped(monkeypatch, problem, name: str, layout: str) -> None:  # type: ignore[no-untyped-def]
    """Expert 0 in all 200 slots of 100 tokens. The masked layout keeps an expert's first M slots (all a
    top-k routing gives one expert): its silu*up launch covers M rows of each expert, and when the layout
    kept 128 the slots past 112 had the second GEMM read rows nothing wrote (inf error)."""
    run, twins = _routes(monkeypatch, problem, name, layout)
    m = 100
    w, _ = random_routing(m, 2, E, seed=9)
    ids = torch.zeros(m, 2, dtype=torch.int32)
    x = torch.randn(m, H, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    kept = torch.where(torch.arange(2 * m).view(m, 2) < m, ids, -1) if layout == "masked" else ids
    y = run(x, w, ids)
    assert rel_err(y, expected_moe(x, *problem.weights(), w, kept, gemm_out=torch.bfloat16)) < TOL
    assert rel_err(y, twins(x, w, ids).double()) < TOL


@pytest.mark.parametrize(("name", "layout"), ROUTES)
def test_minus_one_ids_give_zeros_and_a_nan_token_its_own_nan_row(monkeypatch, problem, name: str,
                                                                  layout: str) -> None:  # type: ignore[no-untyped-def]
    assert_minus_one_and_nan_rows(_routes(monkeypatch, problem, name, layout)[0], H, 2, E)
