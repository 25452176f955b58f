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
