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

The drop-in ``Selection.linear`` (which takes the weight and finds its layer per call) is
``fp8select::dropin_linear`` under compilation, by the selection's handle (:func:`dropin_call`).

Nothing is registered with torch when fp8select is imported: :func:`register` defines the
op the first time a layer is created, :func:`register_selection` the drop-in's when a selection
is (both idempotent).
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch

from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.kernels.quant import ACTIVATION_DTYPES


class OpLayer(Protocol):
    """What the op needs of a layer (:class:`fp8select.layer.Fp8Linear`, which imports this module)."""

    n: int
    out_dtype: torch.dtype | None

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                input_scale: torch.Tensor | None = None) -> torch.Tensor: ...

class DropIn(Protocol):
    """What the drop-in op needs of a selection (:class:`fp8select.selection.Selection`, which imports this module)."""

    def linear(self, input: torch.Tensor, weight: torch.Tensor, block_size: Sequence[int], weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
               out_dtype: torch.dtype | None = None) -> torch.Tensor: ...


T = TypeVar("T")
OP_NAME = "fp8select::linear"
SCHEMA = "(Tensor x, Tensor? bias, Tensor? input_scale, int handle, int n, int out_dtype) -> Tensor"
OUT_DTYPES = ACTIVATION_DTYPES
"""The output dtypes by the code the op takes for them (their index): an int, which torch's
dispatcher parses in a fraction of the time a ``ScalarType`` takes (about 0.8 us a call on a CPU)."""
_OUT_CODES = {dtype: code for code, dtype in enumerate(OUT_DTYPES)}
HANDLE_ATTR = "_fp8select_handle"
DROPIN_OP_NAME = "fp8select::dropin_linear"
DROPIN_SCHEMA = ("(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias, Tensor? input_scale, int[] block_size, "
                 "int handle, int out_dtype) -> Tensor")
"""The drop-in ``Selection.linear`` as one node: the selection by handle, the output dtype by code (-1: the input's)."""


class Live(Generic[T]):
    """Handle -> object, by weak reference. Handles are never reused, so a stale one is an error, not another object."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._objects: weakref.WeakValueDictionary[int, T] = weakref.WeakValueDictionary()
        self._next = itertools.count(1)

    def add(self, obj: T) -> int:
        handle = next(self._next)
        self._objects[handle] = obj
        return handle

    def get(self, handle: int) -> T:
        obj = self._objects.get(handle)
        if obj is None:
            raise InvalidInputError(
                f"handle: expected the handle of a live fp8select {self._what}, found {handle}, whose {self._what} was "
                f"freed (a compiled graph outlived the {self._what} it was traced with)")
        return obj

    def register(self, obj: T, attr: str) -> int:
        """``obj``'s handle, kept in its attribute ``attr``: the one it has, else a new one (it is new, or a copy
        that carried its original's handle)."""
        handle = obj.__dict__.get(attr)
        if not isinstance(handle, int) or self._objects.get(handle) is not obj:
            handle = self.add(obj)
            setattr(obj, attr, handle)
        return handle

    def __len__(self) -> int:
        return len(self._objects)


# The process-wide registries the ops' real implementations look handles up in: ops are
# process-global in torch, so the tables they read are too. They hold no strong references.
_LIVE: Live[OpLayer] = Live("layer")
_SELECTIONS: Live[DropIn] = Live("selection")


def register(layer: OpLayer) -> int:
    """Give ``layer`` a handle for the custom op (once; defines the op on first use) and return it."""
    _define()
    return _LIVE.register(layer, HANDLE_ATTR)


def register_selection(selection: DropIn) -> int:
    """A handle for ``selection``'s drop-in calls under compilation (defines the op on first use)."""
    _define_dropin()
    return _SELECTIONS.add(selection)


def dropin_call(handle: int, x: torch.Tensor, weight: torch.Tensor, block_size: Sequence[int],
                weight_scale: torch.Tensor, input_scale: torch.Tensor | None, bias: torch.Tensor | None,
                out_dtype: torch.dtype | None) -> torch.Tensor:
    """``Selection.linear`` as one ``fp8select::dropin_linear`` node, for a graph being compiled: its real
    implementation makes the eager call (the weight's layer found, or prepared at the first call, as eagerly).
    Inputs are detached: inference only. The weight and its scale only where they require grad: the eager call
    finds a weight's layer by the tensor's identity, which a detached view (a new tensor per call) would not keep."""
    code = -1 if out_dtype is None else _OUT_CODES.get(out_dtype)
    if code is None:
        raise InvalidDtypeError(f"out_dtype: expected one of {', '.join(map(str, OUT_DTYPES))} or None, found {out_dtype}")
    return torch.ops.fp8select.dropin_linear.default(  # type: ignore[no-any-return]
        x.detach(), _undifferentiated(weight), _undifferentiated(weight_scale), None if bias is None else bias.detach(),
        None if input_scale is None else input_scale.detach(), list(block_size), handle, code)


def _undifferentiated(t: torch.Tensor) -> torch.Tensor:
    return t.detach() if t.requires_grad else t


def _dropin_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                   input_scale: torch.Tensor | None, block_size: list[int], handle: int, out_dtype: int) -> torch.Tensor:
    out = _SELECTIONS.get(handle).linear(x, weight, block_size, weight_scale, input_scale, bias,
                                         out_dtype=None if out_dtype < 0 else OUT_DTYPES[out_dtype])
    return out if out.is_contiguous() else out.contiguous()


def _dropin_linear_fake(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                        input_scale: torch.Tensor | None, block_size: list[int], handle: int,
                        out_dtype: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype if out_dtype < 0 else OUT_DTYPES[out_dtype])


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
    return define_op(OP_NAME, SCHEMA, _linear, _linear_fake)


@functools.cache
def _define_dropin() -> Any:
    """Define ``fp8select::dropin_linear`` (once per process), as :func:`_define` does ``fp8select::linear``."""
    return define_op(DROPIN_OP_NAME, DROPIN_SCHEMA, _dropin_linear, _dropin_linear_fake)


def define_op(op_name: str, schema: str, kernel: Any, fake: Any) -> Any:
    """Define ``op_name`` (``fp8select::name``) with one ``CompositeExplicitAutograd`` kernel and its fake; its library."""
    namespace, name = op_name.split("::")
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(name + schema)
    lib.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(op_name, fake, lib=lib)
    return lib
