"""On a CUDA GPU: the real decision and every accepted backend's numerics (skipped without one)."""

from __future__ import annotations

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err

import fp8select

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def selection() -> fp8select.Selection:
    fp8select.detect_capabilities.cache_clear()
    return fp8select.resolve(plugins=False)


def test_detection_is_cuda(selection: fp8select.Selection) -> None:
    caps = selection.capabilities
    assert caps.device_kind == "cuda" and caps.compute_capability is not None
    props = torch.cuda.get_device_properties(0)
    assert caps.compute_capability == (props.major, props.minor)


def test_sm90_with_new_torch_chooses_cuda_scaled_mm_then_triton(selection: fp8select.Selection) -> None:
    caps = selection.capabilities
    if caps.compute_capability != (9, 0) or "BlockWise128x128" not in caps.scaling_types:
        pytest.skip("not an sm90 machine with block-wise scaled_mm")
    assert selection.backend.name == "cuda-scaled-mm"
    assert [b.name for b in selection.chain][:2] == ["cuda-scaled-mm", "triton"]


@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
@pytest.mark.parametrize("n, k", [(2112, 7168), (576, 1536), (4160, 640), (256, 7200), (384, 1152)])
@pytest.mark.parametrize("m", [1, 2, 8, 15, 16, 100, 512])
def test_every_accepted_backend_is_correct(selection: fp8select.Selection, block: tuple[int, int], n: int, k: int, m: int) -> None:
    w, s = random_problem(n, k, block, seed=n + k + m, device="cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = expected(x, w, s, block, bias)
    for backend in selection.chain:
        if not backend.supports(fp8select.Problem(n, k, block), selection.capabilities).ok:
            continue
        layer = fp8select.resolve(selection.capabilities, backend=backend.name, plugins=False).prepare(w, s, block)
        out = layer(x, bias=bias)
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        assert rel_err(out, ref) < 1e-2, (backend.name, layer.plan(m).name)


def test_three_d_and_strided_inputs(selection: fp8select.Selection) -> None:
    w, s = random_problem(1024, 2048, device="cuda")
    layer = selection.prepare(w, s)
    x = torch.randn(2, 24, 4096, device="cuda", dtype=torch.bfloat16)[..., ::2]
    out = layer(x)
    assert out.shape == (2, 24, 1024)
    assert rel_err(out, expected(x.contiguous(), w, s, (128, 128))) < 1e-2
