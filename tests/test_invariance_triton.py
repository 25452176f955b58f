"""A batch-invariant plan on fp8select's Triton kernels, run on CPU under the Triton interpreter: one
recorded configuration for every M gives a row the same bits whatever its batch and position.

The interpreter checks the kernels' logic (which rows a tile mixes, a split-K's fixed order, the
swap-AB path quantizing a varying number of rows), not the GPU's MMA order; the H200 measurement
is ``benchmarks/invariance.py`` and tests/test_invariance_gpu.py.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
from batch_rows import assert_rows_batch_invariant
from fp64_reference import random_problem

pytest.importorskip("triton")

from test_invariance import MS, record

from fp8select import Capabilities
from fp8select.backends.triton import TritonBackend
from fp8select.layer import Fp8Linear
from fp8select.measured.invariance import Invariance, merge_records
from fp8select.measured.table import backend_versions

CPU_TRITON = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",), packages={"triton": "3.9.0"},
                          env={"TRITON_INTERPRET": "1"})
N, K = 64, 384  # three K blocks: split-K 2 sums two partials of unequal length
_BASE = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 2, "TMA": 0}
CONFIGS = {
    "gemm, no split-K": {**_BASE, "SPLIT_K": 1, "path": "gemm", "FIXUP": 0},
    "decode, split-K 2 summed in the last program": {**_BASE, "SPLIT_K": 2, "path": "decode", "FIXUP": 1},
}


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_triton_rows_are_bitwise_the_same_for_any_batch(config: dict[str, object]) -> None:
    triton = TritonBackend()
    versions = backend_versions(CPU_TRITON)
    data = merge_records(None, [record("triton", versions=versions, schedule=((1, config),), shapes=((N, K),))], "cpu")
    w, s = random_problem(N, K, seed=5)[:2]
    layer = Fp8Linear([triton], CPU_TRITON, w, s, invariance=Invariance(CPU_TRITON, [triton], [("test", data)]))
    assert layer.main_plan.backends == ("triton",)
    assert {r.config.to_dict()["path"] for r in layer.main_plan.routes} == {config["path"]}
    assert_rows_batch_invariant(layer, K, MS, seed=6)


def test_a_moe_triton_record_gives_a_token_the_same_bits_whatever_its_batch() -> None:
    """The experts op on fp8select's Triton kernels, one recorded configuration for every M: a probe
    token's output alone and among tokens routed at random (sorted blocks mixing experts' rows)."""
    from dataclasses import replace

    from batch_rows import assert_moe_rows_batch_invariant
    from fp64_moe_reference import random_moe
    from interpreted import moe_kernels

    from fp8select import resolve
    from fp8select.buckets import M_BUCKET_MAX
    from fp8select.measured.invariance import POSITIONS, Record
    from fp8select.moe_select import moe_chain

    moe_kernels()
    config = {"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "QUANT_IN_KERNEL": 1}
    sel = resolve(CPU_TRITON, plugins=False, tuning=False)
    triton = next(b for b in moe_chain(sel) if b.name == "triton")
    record = Record("triton", backend_versions(CPU_TRITON, triton.packages), ((1, config),), ((4, 256, 128, 2),),
                    (1, M_BUCKET_MAX), POSITIONS, True, layout="sorted")
    invariant = replace(sel, batch_invariant=True, invariance=Invariance(
        CPU_TRITON, sel.chain, [("test", merge_records(None, [record], "cpu"))]))
    moe = invariant.prepare_moe(*random_moe(4, 256, 128, seed=3).weights(), top_k=2)
    assert moe.main_plan.summary() == "any M: triton/sorted (batch-invariant)"
    assert {r.config.to_dict()["BLOCK_M"] for r in moe.main_plan.routes} == {16}
    assert_moe_rows_batch_invariant(moe, 256, 4, 2, (1, 2, 7, 17, 40), seed=4)
