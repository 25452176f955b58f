"""fp8select.integrations.transformers on CPU: swapping FP8Linear-like modules for BlockFp8Linear.

The swap logic is tested with a stand-in module shaped like transformers' ``FP8Linear``
(``weight`` e4m3 [N, K], ``weight_scale_inv`` fp32 block scales multiplied in, ``block_size``,
``bias``, ``activation_scale``); the tests that need transformers itself skip without it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err
from matrix import MATRIX

from fp8select import resolve
from fp8select.integrations.transformers import replace_fp8_linears
from fp8select.nn import BlockFp8Linear

CPU = MATRIX["cpu-only"][0]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "transformers_fp8.py"
NO_TRANSFORMERS = "transformers is not installed (it is the optional 'integration' extra)"


class FakeFP8Linear(torch.nn.Module):
    """The attributes of transformers.integrations.finegrained_fp8.FP8Linear that the swap reads."""

    def __init__(self, n: int, k: int, *, seed: int, bias: bool = False, static: bool = False,
                 scale_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.in_features, self.out_features, self.block_size = k, n, (128, 128)
        w, s = random_problem(n, k, seed=seed)
        if scale_dtype != torch.float32:
            s = torch.exp2(torch.round(torch.log2(s))).to(scale_dtype)  # UE8M0: powers of two
        self.weight = torch.nn.Parameter(w, requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(s, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(n)) if bias else None
        self.activation_scale = torch.nn.Parameter(torch.tensor(1.0)) if static else None


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = FakeFP8Linear(256, 384, seed=1, bias=True)
        self.down = FakeFP8Linear(384, 256, seed=2)
        self.static = FakeFP8Linear(128, 384, seed=3, static=True)
        self.norm = torch.nn.LayerNorm(384)


def test_swaps_each_fp8_linear_and_keeps_its_tensors() -> None:
    model = torch.nn.ModuleDict({"block": Block(), "head": torch.nn.Linear(384, 8)})
    up = model["block"].up
    result = replace_fp8_linears(model, resolve(CPU, plugins=False), classes=(FakeFP8Linear,))
    assert result.replaced == ("block.up", "block.down")
    assert [name for name, _ in result.skipped] == ["block.static"] and "static" in result.skipped[0][1]
    new = model["block"].up
    assert isinstance(new, BlockFp8Linear) and new.backend == "any M: reference"
    assert new.weight.data_ptr() == up.weight.data_ptr()  # shared, not copied
    assert isinstance(model["block"].static, FakeFP8Linear) and isinstance(model["head"], torch.nn.Linear)
    x = torch.randn(2, 5, 384, dtype=torch.bfloat16)
    assert rel_err(new(x), expected(x, up.weight, up.weight_scale_inv, (128, 128), up.bias)) < 1e-2


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="torch without float8_e8m0fnu")
def test_ue8m0_scales_become_fp32_exactly() -> None:
    model = torch.nn.Sequential(FakeFP8Linear(128, 256, seed=4, scale_dtype=torch.float8_e8m0fnu))
    scale = model[0].weight_scale_inv.float()
    replace_fp8_linears(model, resolve(CPU, plugins=False), classes=(FakeFP8Linear,))
    assert model[0].weight_scale_inv.dtype == torch.float32 and torch.equal(model[0].weight_scale_inv, scale)


def test_selection_is_resolved_once_for_the_model(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fp8select.resolver

    calls = []
    monkeypatch.setattr(fp8select.resolver, "resolve", lambda: calls.append(1) or resolve(CPU, plugins=False))
    model = Block()
    replace_fp8_linears(model, classes=(FakeFP8Linear,))
    assert len(calls) == 1
    assert model.up.selection is model.down.selection


def test_transformers_fp8linear_is_swapped() -> None:
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import FP8Linear, Fp8Quantize
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    torch.manual_seed(0)
    dense = torch.randn(256, 384, dtype=torch.bfloat16) * 0.05
    quantize = Fp8Quantize(FineGrainedFP8HfQuantizer(FineGrainedFP8Config(), pre_quantized=False))
    tensors = quantize.convert({"0.weight": dense})
    layer = FP8Linear(384, 256, block_size=(128, 128))
    layer.weight = torch.nn.Parameter(tensors["0.weight"], requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(tensors["0.weight_scale_inv"], requires_grad=False)
    model = torch.nn.Sequential(layer)
    assert replace_fp8_linears(model, resolve(CPU, plugins=False)).replaced == ("0",)
    x = torch.randn(3, 384, dtype=torch.bfloat16)
    assert rel_err(model(x), expected(x, layer.weight, layer.weight_scale_inv, (128, 128))) < 1e-2


def load_example() -> Any:
    """examples/transformers_fp8.py as a module (it is a script, not part of the package)."""
    if "transformers_fp8_example" not in sys.modules:
        spec = importlib.util.spec_from_file_location("transformers_fp8_example", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["transformers_fp8_example"]


def test_example_runs_on_cpu_and_agrees_layer_by_layer() -> None:
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    example = load_example()
    result = example.run(example.Options(device="cpu", hidden=256, intermediate=512, heads=2, kv_heads=1, vocab=512,
                                         tokens=16, compile=False, timing=False))
    assert result["replaced"] == 14 and result["skipped"] == []
    assert result["per_layer_vs_transformers"]["worst_rel_err"] < 1e-2
    assert result["logits"]["fp8select_vs_transformers"]["rel_err"] < 0.1
