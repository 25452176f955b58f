"""The transformers example's main path on a CUDA GPU (small size, no timing).

A tiny random Llama is quantized by transformers' fine-grained FP8 path, its FP8Linear
layers are swapped for BlockFp8Linear, and the logits are compared, eager, compiled and
under CUDA graphs. Bounds, from the error model of e4m3 (3 mantissa bits: one rounding
costs up to 2**-4 of a value, about 2.5% RMS):

- each swapped layer against transformers' layer on the same input: both quantize the
  activation by the same recipe and multiply the same dequantized weight, so they differ
  by accumulation order and bf16 output rounding only: the suite's 1e-2 bound;
- the whole model against transformers' path, or compiled against eager: any bf16 ulp
  that differs between two implementations moves some activation across an fp8 rounding
  boundary in the next layer, which costs a full fp8 step there; over 2 layers of 7
  linears this builds up to a few percent of the logits (4% measured on CPU between the
  reference backend and an fp32 emulation that agree to 0.4% layer by layer). 0.1 bounds
  that with margin while still failing for a wrong kernel (a wrong scale layout or a
  missing block gives errors of order 1);
- against the bf16 model: the above plus the weights' own fp8 rounding: 0.15.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu

NO_TRANSFORMERS = "transformers is not installed (it is the optional 'integration' extra)"


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 in this process: run the GPU tests on their own")
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    from test_transformers import load_example

    example = load_example()
    return example.run(example.Options(device="cuda", tokens=128, compile=True, timing=False))  # type: ignore[no-any-return]


def test_every_fp8_linear_is_swapped(result: dict[str, Any]) -> None:
    assert result["replaced"] == 14 and result["skipped"] == []
    assert "None" not in result["fp8select"]["layers_by_backend"]  # every module prepared on the GPU


def test_each_layer_agrees_with_transformers(result: dict[str, Any]) -> None:
    assert result["per_layer_vs_transformers"]["layers"] == 14
    assert result["per_layer_vs_transformers"]["worst_rel_err"] < 1e-2, result["transformers_reference"]


def test_logits_agree_eager_compiled_and_graphed(result: dict[str, Any]) -> None:
    logits = result["logits"]
    assert logits["fp8select_vs_transformers"]["rel_err"] < 0.1, result["transformers_reference"]
    assert logits["fp8select_compiled_vs_eager"]["rel_err"] < 0.1
    assert logits["fp8select_compiled_vs_transformers"]["rel_err"] < 0.1
    assert logits["fp8select_decode_cudagraph_vs_eager"]["rel_err"] < 0.1
    assert logits["fp8select_vs_bf16"]["rel_err"] < 0.15


def test_fp8select_layers_add_no_graph_break(result: dict[str, Any]) -> None:
    assert result["graph_breaks"]["fp8select"] == result["graph_breaks"]["bf16"]
