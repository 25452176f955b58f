"""sgl-kernel's CUTLASS MoE adapter on CPU against the strict fake of its grouped GEMM (tests/fakes/sgl_kernel_moe.py).

End to end (``prepare_moe_input``, the row gathers, both grouped GEMMs, silu*up quantization, weighted
sum) compared with the independent fp64 reference, which rounds the GEMM outputs to bf16 as the kernel
writes them (``gemm_out``); the fake writes NaN into every output row outside an expert and leaves the
unrouted permutation entries unwritten, so a result within tolerance also says none of them was read.
Both of the kernel's paths are run (A and B swapped up to 2048 rows, not above). Other tests hand the
fake a wrong argument and assert the rejection, and check the gates, the plan order and the selection.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
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

from fp8select import resolve
from fp8select.backends.moe import MoeProblem, MoeWeights
from fp8select.backends.moe_cutlass import CutlassMoe
from fp8select.moe_select import moe_chain

H200 = MATRIX["h200-sglkernel"][0]
SYMBOLS = ("fp8_blockwise_scaled_mm", "fp8_blockwise_scaled_grouped_mm", "prepare_moe_input")
H200_MOE = dataclasses.replace(H200, packages={**H200.packages, "sgl_kernel": "0.4.4"},
                               package_symbols={"sgl_kernel": SYMBOLS})
E, H, INTER = 4, 384, 128
TOL = 1e-2


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(E, H, INTER, seed=0)


def _launch(problem):  # type: ignore[no-untyped-def]
    backend = CutlassMoe()
    prepared = backend.prepare(MoeWeights(*problem.weights(), (128, 128)), H200_MOE)
    return backend.bind(prepared, "offsets", None, H200_MOE)


def _check(y: torch.Tensor, problem, x, w, ids) -> None:  # type: ignore[no-untyped-def]
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids, gemm_out=torch.bfloat16)) < TOL / 2
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < 5 * TOL  # bf16 gate/up: see expected_moe


@pytest.mark.parametrize(("m", "k", "skew"), [(1, 2, False), (5, 2, False), (6, 3, True), (700, 3, False)])
def test_matches_fp64_with_minus_one_ids(monkeypatch, problem, m: int, k: int, skew: bool) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "sgl_kernel")
    run = _launch(problem)
    w, ids = random_routing(m, k, E, seed=m, skew=skew)
    with_minus_ones(ids)
    x = torch.randn(m, H, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    y = run(x, w, ids)
    _check(y, problem, x, w, ids)
    calls = fake.calls_to("fp8_blockwise_scaled_grouped_mm")
    assert [c.ok for c in calls] == [True, True] and [c.ok for c in fake.calls_to("prepare_moe_input")] == [True]
    rows = [c.arguments["a"].shape[0] for c in calls]
    assert rows == [m * k] * 2  # 2100 rows at M 700: the kernel's unswapped path
    first = calls[0].arguments
    assert first["expert_offsets"].shape == (E,) and first["b"].stride()[1] == 1  # the weight's transpose(1, 2) view


def test_ids_outside_the_experts_are_counted_nowhere(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    """What the layer's ids' check runs after (its read comes after the launches): strays give the -1 result."""
    install(monkeypatch, "sgl_kernel")
    w, ids = random_routing(5, 2, E, seed=3)
    stray, minus = with_strays(ids, E)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    _check(_launch(problem)(x, w, stray), problem, x, w, minus)


def test_empty_experts_int64_ids_and_fp16(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    install(monkeypatch, "sgl_kernel")
    run = _launch(problem)
    w = torch.softmax(torch.randn(7, 1), dim=1)
    ids = torch.full((7, 1), 2, dtype=torch.int64)  # every token on expert 2: three experts empty
    x = torch.randn(7, H).to(torch.float16)
    y = run(x, w, ids)
    assert y.dtype == torch.float16
    _check(y, problem, x, w, ids)


def test_all_minus_one_gives_zeros_and_nan_stays_in_its_row(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    install(monkeypatch, "sgl_kernel")
    assert_minus_one_and_nan_rows(_launch(problem), H, 2, E)


def test_the_layer_plans_cutlass_and_m0_launches_nothing(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "sgl_kernel")
    sel = resolve(H200_MOE, plugins=False, verify=False)
    assert [b.name for b in moe_chain(sel)][:2] == ["triton", "cutlass"]  # the rule's order
    # a shape no table holds: modelled from the shipped H200 rows, where Triton is the fastest at most decode
    # points and CUTLASS at most of the others
    plan = sel.prepare_moe(*problem.weights(), top_k=2).main_plan
    assert {r.why for r in plan.routes} == {"model"} and set(plan.backends) == {"cutlass", "triton"}
    assert sel.prepare_moe(*problem.weights(), top_k=2, measured={}).main_plan.summary() == "any M: triton/sorted"
    moe = resolve(H200_MOE, plugins=False, verify=False, backend="cutlass").prepare_moe(*problem.weights(), top_k=2)
    assert moe.main_plan.summary() == "any M: cutlass/offsets"
    w, ids = random_routing(3, 2, E, seed=3)
    x = torch.randn(3, H).to(torch.bfloat16)
    _check(moe(x, w, ids), problem, x, w, ids)
    fake.clear_calls()
    y = moe(x[:0], w[:0], ids[:0])
    assert y.shape == (0, H) and fake.calls_to("prepare_moe_input") == []


def test_deepgemm_stays_first_and_explicit_picks_cutlass() -> None:
    both = dataclasses.replace(H200_MOE, packages={**H200_MOE.packages, "deep_gemm": "2.6.1"}, package_symbols={
        "sgl_kernel": SYMBOLS, "deep_gemm": ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked")})
    sel = resolve(both, plugins=False, verify=False)
    assert [b.name for b in moe_chain(sel)][:3] == ["deepgemm", "triton", "cutlass"]
    assert sel.moe_plan_for(32, 7168, 2048, 8, measured={}).backends == ("deepgemm",)  # no rows: the rule
    # the shipped H200 table's rows of this shape: CUTLASS where it measured fastest, DeepGEMM and Triton elsewhere
    assert {"cutlass", "deepgemm"} <= set(sel.moe_plan_for(32, 7168, 2048, 8).backends) <= {"cutlass", "deepgemm", "triton"}
    explicit = resolve(both, plugins=False, verify=False, backend="sgl_kernel")
    assert explicit.moe_plan_for(32, 7168, 2048, 8).summary() == "any M: cutlass/offsets"


def test_gates() -> None:
    backend = CutlassMoe()
    assert backend.check(H200_MOE).ok
    only_dense = backend.check(dataclasses.replace(H200_MOE, package_symbols={"sgl_kernel": SYMBOLS[:1]}))
    assert not only_dense.ok and "fp8_blockwise_scaled_grouped_mm" in only_dense.reason
    old = backend.check(H200)  # sglang-kernel 0.3.9: not the version checked
    assert not old.ok and "sgl_kernel>=0.4.4" in old.reason
    assert not backend.check(MATRIX["b200-deepgemm"][0]).ok
    odd = backend.supports(MoeProblem(8, 7168, 1408 + 64, 8), H200_MOE, "offsets")
    assert not odd.ok and "requires I % 128 == 0" in odd.reason
    many = backend.supports(MoeProblem(2048, 1024, 512, 8), H200_MOE, "offsets")
    assert not many.ok and "E <= 1024" in many.reason
    assert backend.supports(MoeProblem(8, 7168, 2048, 8, act_dtype=torch.float16), H200_MOE, "offsets").ok
    assert not backend.supports(MoeProblem(8, 7168, 2048, 8, act_dtype=torch.float32), H200_MOE, "offsets").ok


def _gemm_args(problem, rows: int = 4):  # type: ignore[no-untyped-def]
    w13, s13, _, _ = problem.weights()
    n, k = 2 * INTER, H
    a = torch.zeros(rows, k).to(torch.float8_e4m3fn)
    return dict(
        output=torch.empty(rows, n, dtype=torch.bfloat16), a_ptrs=torch.empty(E, dtype=torch.int64),
        b_ptrs=torch.empty(E, dtype=torch.int64), out_ptrs=torch.empty(E, dtype=torch.int64),
        a_scales_ptrs=torch.empty(E, dtype=torch.int64), b_scales_ptrs=torch.empty(E, dtype=torch.int64), a=a,
        b=w13.transpose(1, 2), scales_a=torch.ones(rows, k // 128), scales_b=s13.transpose(1, 2),
        stride_a=torch.full((E,), k), stride_b=torch.full((E,), k), stride_c=torch.full((E,), n),
        layout_sfa=torch.empty(E, 5, dtype=torch.int32), layout_sfb=torch.empty(E, 5, dtype=torch.int32),
        problem_sizes=torch.tensor([[rows, n, k]] + [[0, n, k]] * (E - 1), dtype=torch.int32),
        expert_offsets=torch.zeros(E, dtype=torch.int32), workspace=torch.empty(1 << 20, dtype=torch.uint8))


BREAKS = {
    "offsets-size": (lambda d: d.update(expert_offsets=torch.zeros(E + 1, dtype=torch.int32)), "must match expert_offsets"),
    "stride-int32": (lambda d: d.update(stride_a=d["stride_a"].int()), "stride_a must be int64"),
    "layout-1d": (lambda d: d.update(layout_sfa=torch.empty(E * 5, dtype=torch.int32)), "layout_sfa must be 1D"),
    "out-fp32": (lambda d: d.update(output=d["output"].float()), "output must be bfloat16 or half"),
    "stride-value": (lambda d: d.update(stride_c=torch.full((E,), H)), r"stride_c\[:E\] =="),
    "scales-a-m-major": (lambda d: d.update(scales_a=torch.ones(2, 4).t()), "scales_a is .R, K/128. row-major"),
    "b-copied-k-major": (lambda d: d.update(b=d["b"].contiguous()), "b is .E, 256, 384. row-major per expert"),
    "rows-outside": (lambda d: d["problem_sizes"].__setitem__((0, 0), 5), r"rows \[0, 5\) inside R=4"),
    "small-workspace": (lambda d: d.update(workspace=torch.empty(1024, dtype=torch.uint8)), "workspace of at least"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_the_fake_rejects_what_the_kernel_would(monkeypatch, problem, case: str) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "sgl_kernel")
    args = _gemm_args(problem)
    fake.module.fp8_blockwise_scaled_grouped_mm(**args)  # the unbroken arguments pass
    assert args["a_ptrs"][0] == args["a"].data_ptr() and args["b_ptrs"][1] == args["b"].data_ptr() + H * 2 * INTER
    change, message = BREAKS[case]
    args = _gemm_args(problem)
    change(args)
    with pytest.raises(RuntimeError, match=message):
        fake.module.fp8_blockwise_scaled_grouped_mm(**args)


def test_the_fake_routing_leaves_unrouted_entries_and_wants_int32(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "sgl_kernel")
    ids = torch.tensor([[2, -1], [0, 2]], dtype=torch.int32)
    offsets, ps1, ps2 = torch.zeros(4, dtype=torch.int32), torch.zeros(3, 3, dtype=torch.int32), torch.zeros(3, 3, dtype=torch.int32)
    rows, where = torch.full((4,), 77, dtype=torch.int32), torch.full((4,), 77, dtype=torch.int32)
    fake.module.prepare_moe_input(ids, offsets, ps1, ps2, rows, where, 3, 128, 256)
    assert offsets.tolist() == [0, 1, 1, 3] and ps1[2].tolist() == [2, 256, 256] and ps2[2].tolist() == [2, 256, 128]
    assert rows[3] == 77 and where[1] == 77  # the -1 slot's entries: unwritten
    assert sorted(rows[1:3].tolist()) == [0, 1] and rows[0] == 1 and where[2] == 0
    with pytest.raises(RuntimeError, match=r"topk_ids\.dtype"):
        fake.module.prepare_moe_input(ids.long(), offsets, ps1, ps2, rows, where, 3, 128, 256)


def _package(root, files: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_flashinfer_moe_gate_reads_whether_its_module_can_build(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The trimmed FlashInfer (the dense GEMM's sources only) exposes ``cutlass_fused_moe`` but lacks the
    binding source its JIT build compiles: rejected, saying so. With the source: only "not implemented"."""
    import importlib
    import sys

    from fp8select.backends.moe import FlashInferMoe
    from fp8select.detect import FLASHINFER_MOE_SOURCE, _package_symbols

    trimmed = {"flashinfer/__init__.py": "raise RuntimeError('imported')\n",
               "flashinfer/gemm/__init__.py": "from .gemm_base import fp8_blockscale_gemm_sm90\n",
               "flashinfer/fused_moe/__init__.py": "from .core import (\n    cutlass_fused_moe,\n)\n"}
    _package(tmp_path, trimmed)
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    packages = {**H200.packages, "flashinfer": "0.7.2.post1"}

    def caps():  # type: ignore[no-untyped-def]
        return dataclasses.replace(H200, packages=packages, package_symbols=_package_symbols(packages))

    verdict = FlashInferMoe().check(caps())
    assert not verdict.ok and "FusedMoeRunner" in verdict.reason and "fused_moe_90" in verdict.reason
    _package(tmp_path, {f"flashinfer/{FLASHINFER_MOE_SOURCE}": "class FusedMoeRunner : public tvm::ffi::ModuleObj {};\n"})
    verdict = FlashInferMoe().check(caps())
    assert not verdict.ok and verdict.reason == "not implemented in this version"
    assert not FlashInferMoe().check(dataclasses.replace(caps(), cuda_version="12.6")).ok
    assert "flashinfer" not in sys.modules
