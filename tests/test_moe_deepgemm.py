"""DeepGEMM's MoE adapter on CPU against the strict fake of its M-grouped GEMMs (tests/fakes/deep_gemm_grouped.py).

Both layouts end to end (routing, permutation, both grouped GEMMs, silu*up quantization, weighted
sum) compared with the independent fp64 reference, which rounds the GEMM outputs to bf16 as DeepGEMM
writes them (``gemm_out``; against the exact semantics that alone costs up to a few 1e-2); the fake writes NaN into every row the adapter
must not read, so a result within tolerance also says none was read. One test hands the fake a
wrong scale layout and asserts the rejection; the gates say what they require.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fakes import install
from fp64_moe_reference import expected_moe, random_moe, random_routing, rel_err, with_strays
from matrix import MATRIX

from fp8select.backends.moe import MoeProblem, MoeWeights
from fp8select.backends.moe_deepgemm import DeepGemmMoe
from fp8select.grouped import grouped_gemm_contiguous, grouped_gemm_masked

H200 = MATRIX["h200-deepgemm"][0]
H200_MOE = dataclasses.replace(H200, package_symbols={
    "deep_gemm": ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked")})
TOL = 1e-2


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(4, 256, 128, seed=0)


def _launch(problem, layout: str):  # type: ignore[no-untyped-def]
    backend = DeepGemmMoe()
    prepared = backend.prepare(MoeWeights(*problem.weights(), (128, 128)), H200_MOE)
    return backend.bind(prepared, layout, None, H200_MOE)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize(("m", "skew"), [(1, False), (5, False), (6, True)])
def test_both_layouts_match_fp64(monkeypatch, problem, layout: str, m: int, skew: bool) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "deep_gemm")
    run = _launch(problem, layout)
    w, ids = random_routing(m, 2, 4, seed=m, skew=skew)
    if m > 1:
        ids[1, 1] = -1
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    y = run(x, w, ids)
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids, gemm_out=torch.bfloat16)) < TOL / 2
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < 5 * TOL  # bf16 gate/up: see expected_moe
    name = f"m_grouped_fp8_gemm_nt_{layout}"
    assert [c.ok for c in fake.calls_to(name)] == [True, True]
    if layout == "masked":
        assert fake.last(name).arguments["expected_m"] == max(1, -(-m * 2 // 4))


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_ids_outside_the_experts_are_counted_nowhere(monkeypatch, problem, layout: str) -> None:  # type: ignore[no-untyped-def]
    """What the layer's ids' check runs after (its read comes after the launches): strays give the -1 result."""
    install(monkeypatch, "deep_gemm")
    w, ids = random_routing(5, 2, 4, seed=4)
    stray, minus = with_strays(ids, 4)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    y = _launch(problem, layout)(x, w, stray)
    assert rel_err(y, expected_moe(x, *problem.weights(), w, minus, gemm_out=torch.bfloat16)) < TOL / 2


def test_masked_drops_the_slots_of_a_repeated_id_beyond_m(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    """Repeated ids (unchecked: a CUDA graph, ``check_ids=False``) can route more than M slots to one expert;
    the masked layout keeps its first M (all a top-k routing can give it) and the weighted sum adds nothing
    for the rest, where it used to read a clamped row (the fake leaves unused rows NaN)."""
    install(monkeypatch, "deep_gemm")
    m = 100  # slots 0..99 (tokens 0..49) kept on expert 0, tokens 50..99 dropped
    w, _ = random_routing(m, 2, 4, seed=9)
    ids = torch.zeros(m, 2, dtype=torch.int32)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    y = _launch(problem, "masked")(x, w, ids)
    kept = expected_moe(x[:50], *problem.weights(), w[:50], ids[:50], gemm_out=torch.bfloat16)
    assert rel_err(y[:50], kept) < TOL / 2
    assert torch.equal(y[50:], torch.zeros_like(y[50:]))


def test_a_wrong_scale_layout_is_rejected_by_the_fake(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "deep_gemm")
    w13, s13, _, _ = problem.weights()
    a = torch.zeros(128, 256).to(torch.float8_e4m3fn)
    row_major = torch.ones(128, 2)  # not MN-major
    with pytest.raises(RuntimeError, match="sfa is MN-major"):
        fake.module.m_grouped_fp8_gemm_nt_contiguous((a, row_major), (w13, s13), torch.empty(128, 256, dtype=torch.bfloat16),
                                                     torch.zeros(128, dtype=torch.int32))


def test_public_grouped_gemms_through_deepgemm(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    install(monkeypatch, "deep_gemm")
    w13, s13, _, _ = problem.weights()
    from fp64_moe_reference import grouped_expected
    from fp64_reference import quantize_groups

    a, s = quantize_groups(torch.randn(256, 256))
    a, s = a.contiguous(), s.to(torch.float32)
    rows = torch.tensor([1] * 128 + [-1] * 128, dtype=torch.int32)
    got = grouped_gemm_contiguous(a, s, w13, s13, rows, backend="deepgemm")
    assert rel_err(got[:128], grouped_expected(a, s, w13, s13, rows)[:128]) < TOL
    a3, s3 = a[:24].reshape(4, 6, 256), s[:24].reshape(4, 6, 2)
    counts = torch.tensor([6, 0, 2, 1], dtype=torch.int32)
    got = grouped_gemm_masked(a3, s3, w13, s13, counts, backend="deepgemm")
    want = grouped_expected(a[:24], s[:24], w13, s13, torch.arange(4).repeat_interleave(6)).view(4, 6, -1)
    assert rel_err(got[0], want[0]) < TOL and rel_err(got[2, :2], want[2, :2]) < TOL


def test_gates() -> None:
    backend = DeepGemmMoe()
    assert backend.check(H200_MOE).ok
    only_dense = backend.check(H200)
    assert not only_dense.ok and "m_grouped_fp8_gemm_nt_contiguous" in only_dense.reason
    assert not backend.check(MATRIX["b200-deepgemm"][0]).ok  # sm100 grouped needs UE8M0 scales: not written
    odd = backend.supports(MoeProblem(8, 7168, 1408 + 64, 8), H200_MOE, "masked")
    assert not odd.ok and "requires I % 128 == 0" in odd.reason
    fp16 = backend.supports(MoeProblem(8, 7168, 2048, 8, act_dtype=torch.float16), H200_MOE, "contiguous")
    assert not fp16.ok and "bfloat16" in fp16.reason
    assert backend.supports(MoeProblem(8, 7168, 2048, 8), H200_MOE, "contiguous").ok
