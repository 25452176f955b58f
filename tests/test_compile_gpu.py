"""On a CUDA GPU: a model of BlockFp8Linear modules under torch.compile, for every accepted backend.

``fullgraph=True, dynamic=True`` (one graph for every M >= 2) and ``mode="reduce-overhead"``
(Inductor's CUDA graphs), each compared with eager and with the fp64 reference. Run this file
on its own or with the other GPU tests, not in a process where TRITON_INTERPRET=1 was set.
"""

from __future__ import annotations

import os

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err

import fp8select
from fp8select.backends import DEFAULT_ORDER
from fp8select.nn import BlockFp8Linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _selection(backend: str) -> fp8select.Selection:
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 in this process: run the GPU tests on their own")
    try:
        return fp8select.resolve(backend=backend, plugins=False)
    except fp8select.BackendRejectedError as exc:
        pytest.skip(f"{backend} is rejected here: {str(exc).splitlines()[0]}")


class Toy(torch.nn.Module):
    def __init__(self, selection: fp8select.Selection) -> None:
        super().__init__()
        w1, s1 = random_problem(1024, 512, seed=1, device="cuda")
        w2, s2 = random_problem(512, 1024, seed=2, device="cuda")
        self.up = BlockFp8Linear.from_weights(w1, s1, torch.randn(1024, device="cuda", dtype=torch.bfloat16), selection=selection)
        self.down = BlockFp8Linear.from_weights(w2, s2, selection=selection)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x))) + x


@pytest.mark.parametrize("backend", [name for name in DEFAULT_ORDER if name != "reference"] + ["reference"])
def test_fullgraph_dynamic_and_cuda_graphs(backend: str) -> None:
    selection = _selection(backend)
    torch._dynamo.reset()
    model = Toy(selection)
    assert model.up.backend is not None
    up = torch.compile(model.up, fullgraph=True, dynamic=True)
    for m in (16, 64, 300, 2):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        out = up(x)
        assert rel_err(out, expected(x, model.up.weight, model.up.weight_scale_inv, (128, 128), model.up.bias)) < 1e-2, m
        assert rel_err(out, model.up(x)) < 1e-2, m  # same kernels; 1e-2 leaves room for split-K atomics
    full = torch.compile(model, fullgraph=True, dynamic=True)
    before = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    for m in (16, 64, 300):
        x = torch.randn(3, m, 512, device="cuda", dtype=torch.bfloat16)
        assert rel_err(full(x), model(x)) < 1e-2, m
    assert int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) - before == 1
    torch._dynamo.reset()
    graphed = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    for _ in range(4):  # warm-up, record, then replays
        out = graphed(x).clone()
    assert rel_err(out, model(x)) < 1e-2
    x.copy_(torch.randn(16, 512, device="cuda", dtype=torch.bfloat16))
    assert rel_err(graphed(x), model(x)) < 1e-2  # a replay sees the new input
