"""fp8select layers as ``torch.library`` custom ops, so compiled graphs see one opaque node.

``torch.compile`` must not trace into a layer: Dynamo and Inductor cannot follow its
Python dispatch (the per-call plan lookup mutates a dict) nor the Triton launches of its
quantizers and GEMMs. Under compilation a layer call becomes one ``fp8select::linear``
node instead, whose fake (meta) implementation gives the output's shape and dtype without
running anything; the real implementation calls the layer's eager ``forward``.

A layer is a Python object, not a tensor, so the op takes an integer *handle* to it: layers
register themselves when they are created (:func:`register`), the registry holds them by
weak reference (a layer is freed as usual when its owner drops it), and Dynamo treats the
handle as a constant of the graph. The op also takes N and the output dtype (as a code,
:data:`OUT_DTYPES`), all the fake needs, so the fake is a pure function of its arguments. Handles are local to the process:
a graph holding one cannot be exported or run in another process.

Eager calls do not go through the dispatcher: a layer's ``__call__`` runs its ``forward``
directly unless ``torch.compiler.is_compiling()``, and uses :func:`compiled_call` then.

The op is inference-only and has no autograd formula. Outputs never require grad, eager
or compiled: an input that requires grad is detached (the product of an fp8-quantized
activation has no useful gradient, and a backward that silently returned zeros would be
worse than none).

Nothing is registered with torch when fp8select is imported: :func:`register` defines the
op the first time a layer is created (``_define`` is idempotent).
"""

from __future__ import annotations

import functools
import itertools
import weakref
from typing import Any, Protocol

import torch

from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.kernels.quant import ACTIVATION_DTYPES


class OpLayer(Protocol):
    """What the op needs of a layer (:class:`fp8select.layer.Fp8Linear`, which imports this module)."""

    n: int
    out_dtype: torch.dtype | None

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                input_scale: torch.Tensor | None = None) -> torch.Tensor: ...

OP_NAME = "fp8select::linear"
SCHEMA = "(Tensor x, Tensor? bias, Tensor? input_scale, int handle, int n, int out_dtype) -> Tensor"
OUT_DTYPES = ACTIVATION_DTYPES
"""The output dtypes by the code the op takes for them (their index): an int, which torch's
dispatcher parses in a fraction of the time a ``ScalarType`` takes (about 0.8 us a call on a CPU)."""
_OUT_CODES = {dtype: code for code, dtype in enumerate(OUT_DTYPES)}
HANDLE_ATTR = "_fp8select_handle"


class _LiveLayers:
    """Handle -> layer, by weak reference. Handles are never reused, so a stale one is an error, not another layer."""

    def __init__(self) -> None:
        self._layers: weakref.WeakValueDictionary[int, OpLayer] = weakref.WeakValueDictionary()
        self._next = itertools.count(1)

    def add(self, layer: OpLayer) -> int:
        handle = next(self._next)
        self._layers[handle] = layer
        return handle

    def get(self, handle: int) -> OpLayer:
        layer = self._layers.get(handle)
        if layer is None:
            raise InvalidInputError(
                f"handle: expected the handle of a live fp8select layer, found {handle}, whose layer was freed "
                "(a compiled graph outlived the layer it was traced with)")
        return layer

    def holds(self, handle: int, layer: OpLayer) -> bool:
        return self._layers.get(handle) is layer

    def __len__(self) -> int:
        return len(self._layers)


# The one process-wide registry the op's real implementation looks handles up in: ops are
# process-global in torch, so the table they read is too. It holds no strong references.
_LIVE = _LiveLayers()


def register(layer: OpLayer) -> int:
    """Give ``layer`` a handle for the custom op (once; defines the op on first use) and return it."""
    _define()
    handle = layer.__dict__.get(HANDLE_ATTR)
    if isinstance(handle, int) and _LIVE.holds(handle, layer):
        return handle
    handle = _LIVE.add(layer)  # new, or a copy that carried its original's handle
    setattr(layer, HANDLE_ATTR, handle)
    return handle


def live_layers() -> int:
    """How many layers are registered and alive (for tests and diagnostics)."""
    return len(_LIVE)


def compiled_call(layer: OpLayer, x: torch.Tensor, bias: torch.Tensor | None = None,
                  input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``layer`` on ``x`` as one ``fp8select::linear`` node, for a graph being compiled (the layer's
    ``__call__`` runs its eager ``forward`` otherwise). Inputs are detached: inference only."""
    out_dtype = layer.out_dtype or x.dtype
    code = _OUT_CODES.get(out_dtype)
    if code is None:
        raise InvalidDtypeError(f"x: expected one of {', '.join(map(str, OUT_DTYPES))}, found {out_dtype}")
    return torch.ops.fp8select.linear.default(  # type: ignore[no-any-return]
        x.detach(), None if bias is None else bias.detach(), None if input_scale is None else input_scale.detach(),
        getattr(layer, HANDLE_ATTR), layer.n, code)


def _linear(x: torch.Tensor, bias: torch.Tensor | None, input_scale: torch.Tensor | None, handle: int, n: int,
            out_dtype: int) -> torch.Tensor:
    out = _LIVE.get(handle).forward(x, bias, input_scale)
    # The fake promises a fresh contiguous tensor; compiled code relies on those strides.
    return out if out.is_contiguous() else out.contiguous()


def _linear_fake(x: torch.Tensor, bias: torch.Tensor | None, input_scale: torch.Tensor | None, handle: int, n: int,
                 out_dtype: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n), dtype=OUT_DTYPES[out_dtype])


@functools.cache
def _define() -> Any:
    """Define ``fp8select::linear`` with torch (once per process) and return its library.

    Defined through ``torch.library.Library`` with one ``CompositeExplicitAutograd`` kernel rather
    than ``torch.library.custom_op``, whose autograd and dispatch wrappers cost about 10 us more
    per call (measured on CPU: 3 us against 13 us for an op that returns its input). No autograd
    kernel: the layer detaches what it passes (inference only)."""
    name = OP_NAME.split("::")[1]
    lib = torch.library.Library(OP_NAME.split("::")[0], "DEF")
    lib.define(name + SCHEMA)
    lib.impl(name, _linear, "CompositeExplicitAutograd")
    torch.library.register_fake(OP_NAME, _linear_fake, lib=lib)
    return lib
