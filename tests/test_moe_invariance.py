"""Batch invariance of the MoE experts op on CPU: the reference backend computes each token's output
from that token alone (exact fp8 block products in float64, a fixed-order sum over its k experts)."""

from __future__ import annotations

from batch_rows import assert_moe_rows_batch_invariant
from fp64_moe_reference import expected_moe, random_moe, random_routing, rel_err

from fp8select.kernels.moe_reference import experts_reference

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
