"""The MoE experts layer as a ``torch.library`` custom op, so a compiled graph sees one opaque node.

As :mod:`fp8select.ops` does for the dense layer: under ``torch.compile`` a prepared
:class:`~fp8select.moe.Fp8MoE` call becomes one ``fp8select::moe_experts`` node whose fake gives the
output (``x``'s shape and dtype) without running anything; the real implementation runs the layer's
eager call. The op takes an integer handle to the layer (a weak-reference registry; handles are
never reused and local to the process). Nothing is registered with torch at import: the op is
defined the first time a MoE layer is made. Inference only: inputs are detached.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch

from fp8select.ops import Live, define_op

__all__ = ["OP_NAME", "compiled_call", "register"]

OP_NAME = "fp8select::moe_experts"
SCHEMA = "(Tensor x, Tensor topk_weights, Tensor topk_ids, int handle) -> Tensor"
HANDLE_ATTR = "_fp8select_moe_handle"


class MoeOpLayer(Protocol):
    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor: ...


_LAYERS: Live[MoeOpLayer] = Live("MoE layer")


def register(layer: MoeOpLayer) -> int:
    """Give ``layer`` a handle (once; defines the op on first use) and return it."""
    _define()
    return _LAYERS.register(layer, HANDLE_ATTR)


def compiled_call(layer: MoeOpLayer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """``layer`` on its inputs as one ``fp8select::moe_experts`` node (for a graph being compiled)."""
    return torch.ops.fp8select.moe_experts.default(  # type: ignore[no-any-return]
        x.detach(), topk_weights.detach(), topk_ids, getattr(layer, HANDLE_ATTR))


def _experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
    out = _LAYERS.get(handle).forward(x, topk_weights, topk_ids)
    return out if out.is_contiguous() else out.contiguous()


def _experts_fake(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty(x.shape)


@functools.cache
def _define() -> Any:
    """Define ``fp8select::moe_experts`` with torch (once per process) and return its library."""
    return define_op(OP_NAME, SCHEMA, _experts, _experts_fake)
