"""torch.compile(fullgraph=True, dynamic=True) of models that call fp8select layers, on CPU.

Each layer call must be one opaque ``fp8select::linear`` node (no graph break, no tracing
into the backend), one graph must serve every M (beyond the 0/1 specialisation Dynamo
makes for a first call with M=1), and the compiled result must be the eager one: the op
runs the same eager code, and the ops around it here (relu, add) are exact. Inductor on
CPU compiles C++, so these few tests are the slow ones of the suite.
"""

from __future__ import annotations

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported in this process (for the Triton case)

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err
from matrix import MATRIX

from fp8select import resolve
from fp8select.nn import BlockFp8Linear

CPU = MATRIX["cpu-only"][0]
CPU_TRITON = dataclasses.replace(CPU, packages={"triton": "3.9.0"}, env={"TRITON_INTERPRET": "1"})


class Toy(torch.nn.Module):
    """Two block-FP8 linears with a relu between: K=384 -> 256 -> 384, plus a residual."""

    def __init__(self, selection) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        torch.manual_seed(0)
        up, down = torch.nn.Linear(384, 256, dtype=torch.bfloat16), torch.nn.Linear(256, 384, bias=False, dtype=torch.bfloat16)
        self.up = BlockFp8Linear.from_linear(up, selection=selection)
        self.down = BlockFp8Linear.from_linear(down, selection=selection)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def _unique_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def test_nn_model_compiles_fullgraph_dynamic_once_for_all_m() -> None:
    torch._dynamo.reset()
    model = Toy(resolve(CPU, plugins=False))
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    before = _unique_graphs()
    for m in (7, 64, 33):
        x = torch.randn(m, 384, dtype=torch.bfloat16)
        assert torch.equal(compiled(x), model(x)), m
    assert _unique_graphs() - before == 1  # one graph for every M >= 2
    x = torch.randn(2, 3, 384, dtype=torch.bfloat16)  # leading dims
    assert torch.equal(compiled(x), model(x))
    x = torch.randn(1, 384, dtype=torch.bfloat16)
    assert torch.equal(compiled(x), model(x))
    # Against the fp64 reference of the first layer, through the compiled path.
    up = torch.compile(model.up, fullgraph=True, dynamic=True)
    x = torch.randn(5, 384, dtype=torch.bfloat16)
    assert rel_err(up(x), expected(x, model.up.weight, model.up.weight_scale_inv, (128, 128), model.up.bias)) < 1e-2


def test_a_shallow_copy_compiles_after_its_original_is_freed() -> None:
    """``copy.copy`` of a layer has a custom-op handle of its own, so it outlives the original under compile too."""
    import copy
    import gc

    torch._dynamo.reset()
    layer = resolve(CPU, plugins=False).prepare(*random_problem(256, 384, seed=5))
    twin = copy.copy(layer)
    x = torch.randn(4, 384, dtype=torch.bfloat16)
    want = layer(x)
    del layer
    gc.collect()
    compiled = torch.compile(lambda a: twin(a), backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), want)


def test_compiled_output_does_not_require_grad() -> None:
    torch._dynamo.reset()
    layer = Toy(resolve(CPU, plugins=False)).up
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 384, dtype=torch.bfloat16, requires_grad=True)
    out = compiled(x)
    assert not out.requires_grad and not layer(x).requires_grad  # the op's output, eager and compiled
    assert torch.equal(out, layer(x))


def test_prepared_layer_with_triton_interpreter_compiles_fullgraph() -> None:
    pytest.importorskip("triton")
    torch._dynamo.reset()
    selection = resolve(CPU_TRITON, plugins=False)
    assert selection.backend.name == "triton"
    w1, s1 = random_problem(256, 384, seed=1)
    w2, s2 = random_problem(384, 256, seed=2)
    first, second = selection.prepare(w1, s1), selection.prepare(w2, s2)

    def model(x: torch.Tensor) -> torch.Tensor:
        return second(torch.relu(first(x)))

    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for m in (3, 17):
        x = torch.randn(m, 384, dtype=torch.bfloat16)
        out = compiled(x)
        assert torch.equal(out, model(x)), m
    assert rel_err(first(x), expected(x, w1, s1, (128, 128))) < 1e-2


def test_reprepared_module_recompiles_instead_of_running_stale_weights() -> None:
    torch._dynamo.reset()
    selection = resolve(CPU, plugins=False)
    model = Toy(selection)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    x = torch.randn(4, 384, dtype=torch.bfloat16)
    assert torch.equal(compiled(x), model(x))
    other = Toy.__new__(Toy)
    torch.nn.Module.__init__(other)
    torch.manual_seed(1)
    other.up = BlockFp8Linear.from_linear(torch.nn.Linear(384, 256, dtype=torch.bfloat16), selection=selection)
    model.up.load_state_dict(other.up.state_dict())  # new weights: a new prepared layer
    assert torch.equal(compiled(x), model(x))
