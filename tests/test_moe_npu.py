"""Ascend's grouped-GEMM MoE adapter on CPU against the strict fake of ``torch_npu.npu_grouped_matmul``
(tests/fakes/torch_npu_moe.py) and the dense fake's ``npu_dynamic_block_quant``.

The gates on the matrix's Ascend snapshots; the fake refusing what op-plugin and the aclnn G-B mode would; the
whole layer through ``resolve(...).prepare_moe(...)`` compared with the independent fp64 reference (the
semantics exactly: fp32 gate and up; the fake writes NaN into every output row outside the groups, so a
result within 1e-2 also says none was read), -1 ids, idle experts, M 0, a NaN row; ``explain --moe``.
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
)
from matrix import MATRIX

from fp8select import resolve
from fp8select.backends.moe import MoeProblem, MoeWeights
from fp8select.backends.moe_npu import NpuMoe
from fp8select.moe_select import moe_chain

A5 = MATRIX["ascend-950-npu-moe"][0]
E, H, INTER, K = 4, 384, 128, 2  # 2I != H: a transposed weight or scale has another shape
TOL = 1e-2


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(E, H, INTER, seed=0)


def _x(m: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(m, H, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_gates_on_the_matrix() -> None:
    backend = NpuMoe()
    assert backend.check(A5).ok and backend.check(dataclasses.replace(MATRIX["ascend-950-by-soc"][0], env=A5.env)).ok
    no_flag = backend.check(MATRIX["ascend-950"][0])
    assert not no_flag.ok and "FP8SELECT_USE_NPU_MOE=1" in no_flag.reason
    a2 = backend.check(dataclasses.replace(MATRIX["ascend-910b"][0], env=A5.env))
    assert not a2.ok and "Ascend910B3" in a2.reason and "223" in a2.reason
    assert "not installed" in backend.check(dataclasses.replace(MATRIX["ascend-950-no-torch-npu"][0], env=A5.env)).reason
    assert "requires device npu, found rocm" in backend.check(MATRIX["mi300x-aiter"][0]).reason
    assert backend.supports(MoeProblem(256, 7168, 2048, 8, act_dtype=torch.float16), A5, "grouped").ok
    many = backend.supports(MoeProblem(2048, 1024, 512, 8), A5, "grouped")
    assert not many.ok and "E <= 1024" in many.reason
    odd = backend.supports(MoeProblem(8, 7168 + 64, 2048, 8), A5, "grouped")
    assert not odd.ok and "requires H % 128 == 0" in odd.reason
    assert not backend.supports(MoeProblem(8, 7168, 2048, 8, act_dtype=torch.float32), A5, "grouped").ok


def test_the_rule_plans_npu_where_it_is_opted_in() -> None:
    sel = resolve(A5, plugins=False, verify=False)
    assert [b.name for b in moe_chain(sel)] == ["npu", "reference"]
    assert sel.moe_plan_for(32, 7168, 2048, 8).summary() == "any M: npu/grouped"
    without = resolve(MATRIX["ascend-950"][0], plugins=False, verify=False)
    assert [b.name for b in moe_chain(without)] == ["reference"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_layer_matches_fp64_with_minus_one_ids_idle_experts_and_m0(monkeypatch, problem, dtype) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "torch_npu")
    moe = resolve(A5, plugins=False, verify=False).prepare_moe(*problem.weights(), top_k=K)
    assert moe.main_plan.summary() == "any M: npu/grouped"
    for m, skew in ((1, False), (6, True), (300, False)):
        w, ids = random_routing(m, K, E, seed=m, skew=skew)
        with_minus_ones(ids)
        x = _x(m, seed=m, dtype=dtype)
        y = moe(x, w, ids)
        assert y.dtype == dtype and rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < TOL
    gemm = fake.calls_to("npu_grouped_matmul")[-2:]
    assert [c.ok for c in gemm] == [True, True]
    first = gemm[0].arguments
    assert first["weight"][0].stride() == (2 * INTER * H, 1, H) and first["scale"][0].shape == (E, 2, 3)
    assert first["group_list"].dtype == torch.int64 and int(first["group_list"].sum()) == 300 * K - 2  # two -1 slots
    assert first["x"][0].shape == (300 * K, H) and first["output_dtype"] == torch.float32
    quant = fake.last("npu_dynamic_block_quant").arguments
    assert quant["dst_type"] == torch.float8_e4m3fn and quant["col_block_size"] == 128
    one = torch.full((7, 1), 2, dtype=torch.int64)  # every token on expert 2: three idle experts; int64 ids
    w1 = torch.ones(7, 1)
    x = _x(7, seed=3, dtype=dtype)
    assert rel_err(moe(x, w1, one), expected_moe(x, *problem.weights(), w1, one)) < TOL
    assert fake.last("npu_grouped_matmul").arguments["group_list"].tolist() == [0, 0, 7, 0]
    fake.clear_calls()
    y = moe(x[:0], w1[:0], one[:0])
    assert y.shape == (0, H) and fake.calls == []


def test_all_minus_one_gives_zeros_and_nan_stays_in_its_row(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    install(monkeypatch, "torch_npu")
    backend = NpuMoe()
    run = backend.bind(backend.prepare(MoeWeights(*problem.weights(), (128, 128)), A5), "grouped", None, A5)
    assert_minus_one_and_nan_rows(run, H, K, E)


def _gmm_args(problem, rows: int = 5):  # type: ignore[no-untyped-def]
    """A call the fake accepts: the gate-up GEMM with all rows on expert 1 (checkpoint weight, transposed view)."""
    w13, s13, _, _ = problem.weights()
    a = torch.randn(rows, H).to(torch.float8_e4m3fn)
    return dict(x=[a], weight=[w13.transpose(1, 2)], scale=[s13], per_token_scale=[torch.ones(rows, H // 128)],
                group_list=torch.tensor([0, rows, 0, 0]), split_item=3, group_type=0, group_list_type=1,
                output_dtype=torch.bfloat16)


BREAKS = {
    "no-group-type": (lambda d: d.pop("group_type"), RuntimeError, "Requires manual passing group_type"),
    "split-item-0": (lambda d: d.update(split_item=0), RuntimeError, "split_item 2 or 3"),
    "weight-strided": (lambda d: d.update(weight=[torch.empty(E, H, 4 * INTER, dtype=torch.float8_e4m3fn)[:, :, :2 * INTER]]),
                       RuntimeError, r"contiguous \[g, K, N\] or the transposed view"),
    "weight-copied-k-major": (lambda d: d.update(weight=[d["weight"][0].contiguous()]), RuntimeError,
                              r"scale must be a contiguous float32 \[4, 3, 2\] tensor for a plain weight"),
    "scale-transposed": (lambda d: d.update(scale=[d["scale"][0].transpose(1, 2).contiguous()]), RuntimeError,
                         r"scale must be a contiguous float32 \[4, 2, 3\] tensor for a transposed weight"),
    "scale-bf16": (lambda d: d.update(scale=[d["scale"][0].bfloat16()]), RuntimeError, "scale must be a contiguous float32"),
    "per-token-scale-1d": (lambda d: d.update(per_token_scale=[torch.ones(5)]), RuntimeError, "per_token_scale must be"),
    "group-list-int32": (lambda d: d.update(group_list=d["group_list"].int()), RuntimeError, "group_list must be an int64"),
    "group-list-too-many-rows": (lambda d: d.update(group_list=torch.tensor([0, 6, 0, 0])), RuntimeError, "more than x's M=5"),
    "group-list-type-2": (lambda d: d.update(group_list_type=2), RuntimeError, "group_list_type must be 0 or 1"),
    "no-output-dtype": (lambda d: d.pop("output_dtype"), RuntimeError, "output_dtype must be"),
    "bias": (lambda d: d.update(bias=[torch.zeros(2 * INTER)]), RuntimeError, "bias must be empty"),
    "x-transposed": (lambda d: d.update(x=[d["x"][0].t().contiguous().t()]), RuntimeError, "x must be a contiguous"),
    "mixed-fp8": (lambda d: d.update(weight=[d["weight"][0].view(torch.float8_e5m2)]), RuntimeError, "of x's dtype"),
    "two-weights": (lambda d: d.update(weight=[d["weight"][0][0], d["weight"][0][1]]), RuntimeError, "list of one tensor"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_the_fake_rejects_what_torch_npu_would(monkeypatch, problem, case: str) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "torch_npu")
    gmm = fake.module.npu_grouped_matmul
    args = _gmm_args(problem)
    (y,) = gmm(**args)  # the unbroken call passes, computes expert 1's rows, and leaves no row beyond them
    assert y.shape == (5, 2 * INTER) and y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert torch.isnan(gmm(**{**args, "group_list": torch.tensor([0, 3, 0, 0])})[0][3:]).all()
    change, error, message = BREAKS[case]
    args = _gmm_args(problem)
    change(args)
    with pytest.raises(error, match=message):
        gmm(**args)


def test_the_fake_wants_fp8_on_arch35_only(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "torch_npu")
    fake.impl.set_soc("Ascend910B2", 220)
    with pytest.raises(RuntimeError, match="only supported on Ascend 910_95"):
        fake.module.npu_grouped_matmul(**_gmm_args(problem))
