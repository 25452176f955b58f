"""AITER's fused MoE adapter on CPU against the strict fake of ``aiter.fused_moe`` (tests/fakes/aiter_moe.py).

The gates on the matrix's AMD snapshots; the fake refusing what AITER would (or what it could not tell from
values on hardware); the whole layer through ``resolve(...).prepare_moe(...)`` on gfx942 (e4m3fnuz) and
gfx950, compared with the independent fp64 reference: with AITER's own roundings (the bf16 ``silu * up``
buffer; on gfx942 the e4m3fnuz grid, ``amax / 240``) within 1e-2 relative, and against the e4m3fn semantics
by how much those roundings cost. -1 ids, idle experts, M 0, a NaN row; ``explain --moe`` lists the backend.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fakes import install
from fakes.aiter_moe import ActivationType, QuantType
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
from fp8select.backends.moe_aiter import AiterMoe
from fp8select.moe_select import moe_chain

MI300X = MATRIX["mi300x-aiter"][0]
MI355X = dataclasses.replace(MATRIX["mi355x-aiter"][0], package_symbols=MI300X.package_symbols)
ARCHES = {"gfx942": (MI300X, torch.float8_e4m3fnuz), "gfx950": (MI355X, torch.float8_e4m3fn)}
E, H, INTER, K = 4, 256, 128, 2
TOL = 1e-2


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(E, H, INTER, seed=0)


def _x(m: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(m, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _check(y: torch.Tensor, problem, x, w, ids, fp8: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    aiter_ref = expected_moe(x, *problem.weights(), w, ids, act_out=torch.bfloat16, fp8=fp8)
    assert rel_err(y, aiter_ref) < TOL / 2  # the function AITER computes (its bf16 output: ~2e-3)
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < (TOL * 10 if fp8 == torch.float8_e4m3fnuz else TOL * 2)


def test_gates_on_the_matrix() -> None:
    backend = AiterMoe()
    assert backend.check(MI300X).ok and backend.check(MI355X).ok
    no_flag = backend.check(MATRIX["mi300x-aiter-no-flag"][0])
    assert not no_flag.ok and "FP8SELECT_USE_AITER=1" in no_flag.reason
    assert "not installed" in backend.check(MATRIX["mi300x"][0]).reason
    assert "requires device rocm, found cuda" in backend.check(MATRIX["h200-torch2.11"][0]).reason
    assert "requires device rocm, found npu" in backend.check(MATRIX["ascend-950-npu-moe"][0]).reason
    old = backend.check(dataclasses.replace(MI300X, packages={**MI300X.packages, "aiter": "0.1.4"}))
    assert not old.ok and "aiter>=0.1.5" in old.reason and "0.1.4" in old.reason
    dense_only = backend.check(dataclasses.replace(MI300X, package_symbols={"aiter": ("gemm_a8w8_blockscale",)}))
    assert not dense_only.ok and "fused_moe" in dense_only.reason
    other_arch = backend.check(dataclasses.replace(MI300X, gfx_arch="gfx90a"))
    assert not other_arch.ok and "gfx942/gfx950" in other_arch.reason and "gfx90a" in other_arch.reason
    ok = backend.supports(MoeProblem(256, 7168, 2048, 8), MI300X, "fused")
    assert ok.ok
    odd = backend.supports(MoeProblem(8, 7168, 1408 + 64, 8), MI300X, "fused")
    assert not odd.ok and "requires I % 128 == 0" in odd.reason
    fp16 = backend.supports(MoeProblem(8, 7168, 2048, 8, act_dtype=torch.float16), MI300X, "fused")
    assert not fp16.ok and "bfloat16" in fp16.reason and "float16" in fp16.reason


def test_the_rule_plans_aiter_where_it_is_opted_in_and_triton_elsewhere_on_gfx942_and_gfx950() -> None:
    sel = resolve(MI300X, plugins=False, verify=False)
    assert [b.name for b in moe_chain(sel)] == ["aiter", "triton", "reference"]
    assert sel.moe_plan_for(32, 7168, 2048, 8).summary() == "any M: aiter/fused"
    gfx942 = resolve(MATRIX["mi300x"][0], plugins=False, verify=False)  # no AITER: Triton, in e4m3fnuz
    assert gfx942.moe_plan_for(32, 7168, 2048, 8).summary() == "any M: triton/sorted"
    gfx950 = resolve(MI355X, plugins=False, verify=False)
    assert gfx950.moe_plan_for(32, 7168, 2048, 8).summary() == "any M: aiter/fused"  # the user's flag decides
    no_flag = resolve(MATRIX["mi355x"][0], plugins=False, verify=False)
    assert no_flag.moe_plan_for(32, 7168, 2048, 8).summary() == "any M: triton/sorted"


@pytest.mark.parametrize("gfx", sorted(ARCHES))
def test_the_layer_matches_fp64_with_minus_one_ids_idle_experts_and_m0(monkeypatch, problem, gfx: str) -> None:  # type: ignore[no-untyped-def]
    caps, fp8 = ARCHES[gfx]
    fake = install(monkeypatch, "aiter", gfx=gfx)
    moe = resolve(caps, plugins=False, verify=False).prepare_moe(*problem.weights(), top_k=K)
    assert moe.main_plan.summary() == "any M: aiter/fused"
    for m, skew in ((1, False), (6, True), (300, False)):
        w, ids = random_routing(m, K, E, seed=m, skew=skew)
        with_minus_ones(ids)
        x = _x(m, seed=m)
        _check(moe(x, w, ids), problem, x, w, ids, fp8)
    call = fake.last("fused_moe").arguments
    assert call["w1"].dtype == fp8 and call["w1"].is_shuffled and call["w2"].is_shuffled
    assert call["quant_type"] is QuantType.per_128x128 and call["activation"] is ActivationType.Silu
    assert call["expert_mask"].tolist() == [1] * E + [0] and call["topk_ids"].dtype == torch.int32
    assert int(call["topk_ids"][1, 1]) == E and call["topk_weight"].dtype == torch.float32
    assert call["a1_scale"] is None and call["dtype"] == torch.bfloat16
    if gfx == "gfx942":  # the e4m3fnuz copy: same values, scales doubled
        assert torch.equal(call["w1_scale"], problem.s13 * 2)
    one = torch.full((7, 1), 2, dtype=torch.int64)  # every token on expert 2: three idle experts; int64 ids
    w1 = torch.ones(7, 1)
    x = _x(7, seed=3)
    _check(moe(x, w1, one), problem, x, w1, one, fp8)
    fake.clear_calls()
    y = moe(x[:0], w1[:0], one[:0])
    assert y.shape == (0, H) and fake.calls == []


def test_all_minus_one_gives_zeros_and_nan_stays_in_its_row(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    install(monkeypatch, "aiter", gfx="gfx950")
    backend = AiterMoe()
    run = backend.bind(backend.prepare(MoeWeights(*problem.weights(), (128, 128)), MI355X), "fused", None, MI355X)
    x, w, ids = assert_minus_one_and_nan_rows(run, H, K, E)
    x[2] = torch.inf  # a non-finite token none of whose experts is here: zeros, as the semantics say
    ids[2] = -1
    assert torch.equal(run(x, w, ids)[2], torch.zeros(H, dtype=x.dtype))


def _fused_args(problem, fake):  # type: ignore[no-untyped-def]
    """A call the fake accepts (gfx950): AITER's own shuffle, int32 ids, fp32 weights, the SGLang mask."""
    shuffle = fake.modules["aiter.ops.shuffle"].shuffle_weight
    w13, s13, w2, s2 = problem.weights()
    w, ids = random_routing(3, K, E, seed=1)
    return dict(hidden_states=_x(3), w1=shuffle(w13, layout=(16, 16)), w2=shuffle(w2, layout=(16, 16)), topk_weight=w,
                topk_ids=ids, expert_mask=torch.tensor([1] * E + [0], dtype=torch.int32), activation=ActivationType.Silu,
                quant_type=QuantType.per_128x128, w1_scale=s13, w2_scale=s2)


BREAKS = {
    "minus-one-id": (lambda d: d["topk_ids"].__setitem__((0, 0), -1), RuntimeError, "does not accept -1"),
    "minus-one-without-mask": (lambda d: d.update(expert_mask=None, topk_ids=torch.full_like(d["topk_ids"], E)),
                               RuntimeError, r"must lie in \[0, 4\)"),
    "int64-ids": (lambda d: d.update(topk_ids=d["topk_ids"].long()), RuntimeError, "topk_ids must be a contiguous int32"),
    "bf16-weights": (lambda d: d.update(topk_weight=d["topk_weight"].bfloat16()), RuntimeError, "topk_weight must be"),
    "unshuffled": (lambda d: d.update(w1=d["w1"].clone()), RuntimeError, "pre-shuffled"),
    "e4m3fnuz-on-gfx950": (lambda d: d.update(w2=d["w2"].view(torch.float8_e4m3fnuz)), RuntimeError,
                           r"w2 must be torch\.float8_e4m3fn"),
    "scale-transposed": (lambda d: d.update(w2_scale=d["w2_scale"].transpose(1, 2).contiguous()), RuntimeError,
                         r"w2_scale must be a contiguous float32 \[4, 2, 1\]"),
    "mask-int64": (lambda d: d.update(expert_mask=d["expert_mask"].long()), RuntimeError, "expert_mask must be"),
    "mask-wrong-count": (lambda d: d.update(expert_mask=torch.ones(E + 1, dtype=torch.int32)), RuntimeError,
                         "exactly the E=4"),
    "enum-as-int": (lambda d: d.update(quant_type=5), AttributeError, "value"),
    "fp32-out": (lambda d: d.update(dtype=torch.float32), AssertionError, "unsupported out dtype"),
    "static-a1-scale": (lambda d: d.update(a1_scale=torch.ones(3, 2)), RuntimeError, "dynamic activation scales"),
    "w1-cut": (lambda d: d.update(w1=d["w1"][:, :64]), AssertionError, "Invalid MoE weight"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_the_fake_rejects_what_aiter_would(monkeypatch, problem, case: str) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "aiter", gfx="gfx950")
    fused_moe = fake.modules["aiter.fused_moe"].fused_moe
    args = _fused_args(problem, fake)
    y = fused_moe(**args)  # the unbroken call passes and is right
    w, ids = args["topk_weight"], args["topk_ids"]
    assert rel_err(y, expected_moe(args["hidden_states"], *problem.weights(), w, ids, act_out=torch.bfloat16)) < TOL / 2
    change, error, message = BREAKS[case]
    args = _fused_args(problem, fake)
    change(args)
    with pytest.raises(error, match=message):
        fused_moe(**args)


def test_the_fake_rejects_e4m3fn_weights_on_gfx942(monkeypatch, problem) -> None:  # type: ignore[no-untyped-def]
    fake = install(monkeypatch, "aiter", gfx="gfx942")
    with pytest.raises(RuntimeError, match="normalize e4m3fn weights to e4m3fnuz"):
        fake.modules["aiter.fused_moe"].fused_moe(**_fused_args(problem, fake))
