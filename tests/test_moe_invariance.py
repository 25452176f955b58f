"""Batch invariance of the MoE experts op on CPU: the reference backend computes each token's output
from that token alone (exact fp8 block products in float64, a fixed-order sum over its k experts),
and batch-invariant selections plan one route for every M from the records (or refuse)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from batch_rows import assert_moe_rows_batch_invariant
from fp64_moe_reference import expected_moe, random_moe, random_routing, rel_err
from matrix import MATRIX
from test_cli_moe import DG_MOE

from fp8select import BatchInvariantError, resolve
from fp8select.buckets import M_BUCKET_MAX
from fp8select.kernels.moe_reference import experts_reference
from fp8select.measured.invariance import POSITIONS, Invariance, Record, merge_records
from fp8select.measured.table import backend_versions
from fp8select.moe_plan import INVARIANT
from fp8select.moe_select import moe_chain

E, H, INTER, TOP_K = 8, 1024, 512, 3
MOE_MS = (1, 2, 3, 7, 16, 17, 64, 300)


def test_the_reference_gives_a_token_the_same_bits_whatever_its_batch() -> None:
    p = random_moe(E, H, INTER, seed=2)

    def moe(x, weights, ids):  # type: ignore[no-untyped-def]
        return experts_reference(x, *p.weights(), weights, ids, (128, 128))

    assert_moe_rows_batch_invariant(moe, H, E, TOP_K, MOE_MS, seed=3)


def test_the_reference_still_computes_the_semantics() -> None:
    p = random_moe(E, H, INTER, seed=4)
    weights, ids = random_routing(40, TOP_K, E, seed=5)
    ids[::3, 0] = -1
    import torch

    x = torch.randn(40, H, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    y = experts_reference(x, *p.weights(), weights, ids, (128, 128))
    assert rel_err(y, expected_moe(x, *p.weights(), weights, ids)) < 1e-2
    x[7, 5] = float("nan")
    y = experts_reference(x, *p.weights(), weights, ids, (128, 128))
    assert y[7].isnan().all() and not y[8].isnan().any()


def test_the_gpu_tools_moe_check_finds_what_differs() -> None:
    """benchmarks/invariance.py's MoE row check (run here on CPU): nothing for the reference, every M
    above 1 for an op whose rows see the batch."""
    import torch

    from benchmarks.invariance import check_moe_rows

    p = random_moe(E, H, INTER, seed=7)

    def moe(x, weights, ids):  # type: ignore[no-untyped-def]
        return experts_reference(x, *p.weights(), weights, ids, (128, 128))

    def leaky(x, weights, ids):  # type: ignore[no-untyped-def]
        return moe(x, weights, ids) + x.float().mean(0).to(x.dtype)

    cpu, ms = torch.device("cpu"), (1, 2, 7)
    assert check_moe_rows(moe, (E, H, INTER, TOP_K), ms, cpu) == []
    found = check_moe_rows(leaky, (E, H, INTER, TOP_K), ms, cpu)
    assert {(d["m"], d["position"]) for d in found} == {(m, at) for m in (2, 7) for at in ("first", "middle", "last")}


# -- batch-invariant MoE plans -------------------------------------------------------------------

def test_a_batch_invariant_selection_plans_the_reference_on_a_cpu_and_its_tokens_keep_their_bits() -> None:
    p = random_moe(E, H, INTER, seed=11)
    moe = resolve(MATRIX["cpu-only"][0], plugins=False, batch_invariant=True).prepare_moe(*p.weights(), top_k=TOP_K)
    plan = moe.main_plan
    assert plan.summary() == "any M: reference/sorted (batch-invariant)"
    assert {r.why for r in plan.routes} == {INVARIANT} and plan.invariant.startswith("invariant by construction")
    assert "batch-invariant: a token's output depends only on that token" in plan.describe()
    assert plan.to_dict()["batch_invariant"] == plan.invariant
    assert_moe_rows_batch_invariant(moe, H, E, TOP_K, (1, 2, 7, 17), seed=12)


def test_on_a_gpu_a_moe_route_needs_its_own_record() -> None:
    """No MoE record: every route says why, and the call is refused, never planned as usual; a record of
    deepgemm/contiguous over M 1-8192 at the installed versions makes it the plan, one route for every M."""
    sel = resolve(DG_MOE, plugins=False, verify=False)
    chain = moe_chain(sel)
    bare = replace(sel, batch_invariant=True, invariance=Invariance(DG_MOE, sel.chain, ()))
    with pytest.raises(BatchInvariantError) as info:
        bare.moe_plan_for(32, 7168, 2048, 8)
    reasons = {c.name: c.reason for c in info.value.candidates}
    assert "no batch-invariance record" in reasons["deepgemm/masked"] and "reference/sorted" in reasons
    deepgemm = next(b for b in chain if b.name == "deepgemm")
    record = Record("deepgemm", backend_versions(DG_MOE, deepgemm.packages), ((1, None),), ((32, 7168, 2048, 8),),
                    (1, M_BUCKET_MAX), POSITIONS, True, layout="contiguous")
    data = merge_records(None, [record], DG_MOE.device_name or "")
    recorded = replace(sel, batch_invariant=True, invariance=Invariance(DG_MOE, sel.chain, [("test", data)]))
    plan = recorded.moe_plan_for(32, 7168, 2048, 8)
    assert plan.summary() == "any M: deepgemm/contiguous (batch-invariant)"
    assert "deepgemm/contiguous measured batch-invariant" in plan.invariant
    # the shipped table's rows of this route time every bucket; the masked layout has no record
    assert all(r.us is not None and "measured" in r.detail for r in plan.routes)
    assert "not measured at 8x7168x2048x8" in recorded.moe_plan_for(8, 7168, 2048, 8).invariant


def test_a_triton_record_written_before_fused_act_still_names_the_fused_kernel() -> None:
    """A triton/sorted record's configuration has no FUSED_ACT: it is the fused gate-up (1) and matches
    the rows of that configuration; a faster row of the plain gate-up with the same tiles (FUSED_ACT 0,
    which no record names) is never planned, nor counted as the record's time."""
    from fp8select.kernels.moe_config import MoeTritonConfig

    caps = MATRIX["h200-torch2.9"][0]
    sel = resolve(caps, plugins=False, verify=False)
    triton = next(b for b in moe_chain(sel) if b.name == "triton")
    old = {"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4, "QUANT_IN_KERNEL": 0}
    record = Record("triton", backend_versions(caps, triton.packages), ((1, old),), ((32, 7168, 2048, 8),),
                    (1, M_BUCKET_MAX), POSITIONS, True, layout="sorted")
    recorded = replace(sel, batch_invariant=True, invariance=Invariance(
        caps, sel.chain, [("test", merge_records(None, [record], caps.device_name or ""))]))
    plain = {**old, "FUSED_ACT": 0}
    measured = {"triton/sorted": {1: {"us": 10.0, "config": plain}, 2: {"us": 50.0, "config": old}}}
    plan = recorded.moe_plan_for(32, 7168, 2048, 8, measured=measured)
    assert plan.summary() == "any M: triton/sorted (batch-invariant)"
    assert {r.config for r in plan.routes} == {MoeTritonConfig.from_dict(old)} and plan.routes[0].config.FUSED_ACT == 1
    assert plan.routes[0].us is None and "no time measured" in plan.routes[0].detail
    assert plan.routes[1].us == 50.0
