"""On a CUDA GPU: batch-invariant plans give a row the same bits whatever its batch (skipped without one).

The invariant plan of ``resolve(batch_invariant=True)`` on two DeepSeek-V3 shapes, every backend a
records file of this device qualifies (pinned: the record must still hold), and the reference,
invariant by construction, at M 1, 2, 3, 7, 16, 17, 64, 300, 2048, 8192 and three positions. Before
the first measurement (``python -m benchmarks.invariance --out DIR --write-record
fp8select/data/invariance-nvidia-h200.json``) no backend qualifies and the first two are skipped.
"""

from __future__ import annotations

import pytest
import torch

import fp8select
from benchmarks.invariance import MS, check_rows
from fp8select.layer import Fp8Linear
from fp8select.measure.bench import random_weight
from fp8select.measured.invariance import invariance_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
SHAPES = ((7168, 2048), (2112, 7168))


def _weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return random_weight(n, k, "cuda", torch.Generator(device="cuda").manual_seed(n + k))


@pytest.fixture(scope="module")
def selection() -> fp8select.Selection:
    fp8select.forget_detected()
    return fp8select.resolve(plugins=False)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_the_invariant_plan_gives_the_same_row_at_every_m_and_position(shape: tuple[int, int]) -> None:
    try:
        invariant = fp8select.resolve(plugins=False, batch_invariant=True)
    except fp8select.BatchInvariantError as exc:
        pytest.skip(f"no backend recorded invariant for these versions yet: {str(exc).splitlines()[1]}")
    n, k = shape
    layer = invariant.prepare(*_weight(n, k))
    assert layer.main_plan.invariant is not None and len(layer.main_plan.backends) == 1
    assert check_rows(layer, k, MS, torch.device("cuda")) == []


def test_every_qualifying_record_still_holds(selection: fp8select.Selection) -> None:
    index = invariance_for(selection.capabilities, selection.chain)
    qualified = [b for b in selection.chain if index.options(b)[0] and b.invariant is None]
    if not qualified:
        pytest.skip("no measured record qualifies a backend on this device at these versions")
    n, k = SHAPES[0]
    for backend in qualified:
        try:
            layer = Fp8Linear([backend], selection.capabilities, *_weight(n, k), explicit=backend.name, invariance=index)
        except fp8select.UnsupportedProblemError:
            continue
        assert check_rows(layer, k, MS, torch.device("cuda")) == [], backend.name


def test_the_reference_is_invariant_on_the_gpu_too(selection: fp8select.Selection) -> None:
    reference = fp8select.resolve(plugins=False, backend="reference", batch_invariant=True)
    n, k = 1024, 2048
    layer = reference.prepare(*_weight(n, k))
    assert layer.main_plan.backends == ("reference",)
    assert check_rows(layer, k, MS, torch.device("cuda")) == []


MOE_SHAPE = (8, 7168, 2048, 8)  # deepseek-v3-e8
MOE_MS = (1, 2, 3, 7, 16, 17, 64, 300, 2048)


def _experts() -> tuple[torch.Tensor, ...]:
    from fp8select.measure.tune_moe import random_experts

    e, h, i, _ = MOE_SHAPE
    return random_experts(e, h, i, "cuda", torch.Generator(device="cuda").manual_seed(5))


def test_the_moe_reference_is_invariant_on_the_gpu_too() -> None:
    from benchmarks.invariance import check_moe_rows

    moe = fp8select.resolve(plugins=False, backend="reference", batch_invariant=True).prepare_moe(
        *_experts(), top_k=MOE_SHAPE[3])
    assert moe.main_plan.summary() == "any M: reference/sorted (batch-invariant)"
    assert check_moe_rows(moe, MOE_SHAPE, (1, 2, 7, 64), torch.device("cuda")) == []


def test_the_invariant_moe_plan_gives_a_token_the_same_bits_at_every_m_and_position() -> None:
    from benchmarks.invariance import check_moe_rows

    try:
        moe = fp8select.resolve(plugins=False, batch_invariant=True).prepare_moe(*_experts(), top_k=MOE_SHAPE[3])
    except fp8select.BatchInvariantError as exc:
        pytest.skip(f"no MoE route recorded invariant for these versions yet: {str(exc).splitlines()[1]}")
    assert moe.main_plan.invariant is not None and len({(r.backend, r.layout) for r in moe.main_plan.routes}) == 1
    assert check_moe_rows(moe, MOE_SHAPE, MOE_MS, torch.device("cuda")) == []
