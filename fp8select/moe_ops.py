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
import itertools
import weakref
from typing import Any, Protocol

import torch

from fp8select.errors import InvalidInputError

__all__ = ["OP_NAME", "compiled_call", "register"]

OP_NAME = "fp8select::moe_experts"
SCHEMA = "(Tensor x, Tensor topk_weights, Tensor topk_ids, int handle) -> Tensor"
HANDLE_ATTR = "_fp8select_moe_handle"


class MoeOpLayer(Protocol):
    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor: ...


_LAYERS: weakref.WeakValueDictionary[int, MoeOpLayer] = weakref.WeakValueDictionary()
_NEXT = itertools.count(1)


def register(layer: MoeOpLayer) -> int:
    """Give ``layer`` a handle (once; defines the op on first use) and return it."""
    _define()
    handle = layer.__dict__.get(HANDLE_ATTR)
    if isinstance(handle, int) and _LAYERS.get(handle) is layer:
        return handle
    handle = next(_NEXT)
    _LAYERS[handle] = layer
    setattr(layer, HANDLE_ATTR, handle)
    return handle


def compiled_call(layer: MoeOpLayer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """``layer`` on its inputs as one ``fp8select::moe_experts`` node (for a graph being compiled)."""
    return torch.ops.fp8select.moe_experts.default(  # type: ignore[no-any-return]
        x.detach(), topk_weights.detach(), topk_ids, getattr(layer, HANDLE_ATTR))


def _experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
    layer = _LAYERS.get(handle)
    if layer is None:
        raise InvalidInputError(f"handle: expected the handle of a live fp8select MoE layer, found {handle}, whose "
                                "layer was freed (a compiled graph outlived the layer it was traced with)")
    out = layer.forward(x, topk_weights, topk_ids)
    return out if out.is_contiguous() else out.contiguous()


def _experts_fake(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty(x.shape)


@functools.cache
def _define() -> Any:
    """Define ``fp8select::moe_experts`` with torch (once per process) and return its library."""
    namespace, name = OP_NAME.split("::")
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(name + SCHEMA)
    lib.impl(name, _experts, "CompositeExplicitAutograd")
    torch.library.register_fake(OP_NAME, _experts_fake, lib=lib)
    return lib
