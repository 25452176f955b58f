"""``BlockFp8Linear``: a block-FP8 linear layer as a ``torch.nn.Module``.

Its state dict is the checkpoint's: ``weight`` (float8_e4m3fn ``[N, K]``),
``weight_scale_inv`` (fp32 block scales ``[ceil(N/bn), ceil(K/bk)]``, the name DeepSeek and
Hugging Face checkpoints use; despite the name it multiplies, ``w ~= weight * scale``) and
``bias``. The module lays its weights out for its selection's backend (an
:class:`~fp8select.layer.Fp8Linear`) when they become real: after ``load_state_dict`` (also
into a meta-device module with ``assign=True``), after ``model.to(device)`` / ``.cuda()``,
in :meth:`BlockFp8Linear.from_linear`, or when :meth:`BlockFp8Linear.prepare` is called
after weights were written in place. ``forward`` never prepares anything, so it traces into
a single ``fp8select::linear`` node under ``torch.compile`` (:mod:`fp8select.ops`) and
replays under CUDA graphs.

The module is inference-only: its parameters do not require grad and its output never does.
Casting the module's dtype (``.half()``, ``.to(torch.bfloat16)``) casts the bias only; the
fp8 weight and its fp32 scales keep their dtypes (a bf16 scale would lose precision).

The selection (which backend runs) is resolved once per module, lazily, the first time the
module has weights to prepare (``fp8select.resolve()``), unless one is given; pass the same
:class:`~fp8select.selection.Selection` to every module of a large model so that
``resolve()`` runs once. A module runs on the device kind its selection was made for: its
weights must live there (a CUDA selection and weights on the CPU leave it unprepared until
``.to("cuda")``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fp8select.errors import InvalidDtypeError, InvalidInputError, NotPreparedError
from fp8select.inputs import FLOAT8_DTYPES, check_block_size, check_weight
from fp8select.kernels.quant import ACTIVATION_DTYPES
from fp8select.layer import Fp8Linear
from fp8select.moe import Fp8MoE
from fp8select.problem import dtype_name
from fp8select.selection import Selection

__all__ = ["BlockFp8Linear", "BlockFp8MoE"]

WEIGHT_DTYPE = torch.float8_e4m3fn
# The torch device type that a snapshot's device kind runs on (ROCm builds call theirs "cuda").
_DEVICE_TYPE = {"rocm": "cuda"}
_WEIGHT_NAMES = ("weight", "weight_scale_inv")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidDtypeError(f"{name}: expected a positive int, found {type(value).__name__} {value!r}")
    if value <= 0:
        raise InvalidInputError(f"{name}: expected a positive int, found {value}")
    return value


class BlockFp8Linear(torch.nn.Module):
    """``y = x @ (weight * weight_scale_inv).T + bias`` with fp8 weights and per-token-group fp8 activations.

    ``in_features`` (K) and ``out_features`` (N) need not be multiples of the block; the
    chosen backend decides what it accepts (an :class:`~fp8select.errors.UnsupportedProblemError`
    at prepare time otherwise). ``out_dtype=None`` returns the input's dtype. ``selection``
    is a :class:`~fp8select.selection.Selection` (None resolves one lazily, see the module
    docstring). ``device`` is where the (uninitialised) parameters are allocated; ``"meta"``
    allocates nothing, for loading with ``load_state_dict(..., assign=True)``. The bias is
    zeros of the default dtype until loaded (any float dtype works: it is added in fp32).
    """

    weight: torch.nn.Parameter
    weight_scale_inv: torch.nn.Parameter
    bias: torch.nn.Parameter | None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 block_size: Sequence[int] = (128, 128), selection: Selection | None = None,
                 out_dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features = _positive_int("in_features", in_features)
        self.out_features = _positive_int("out_features", out_features)
        self.block_size = check_block_size(block_size)
        if out_dtype is not None and out_dtype not in ACTIVATION_DTYPES:
            allowed = "/".join(dtype_name(d) for d in ACTIVATION_DTYPES)
            raise InvalidDtypeError(f"out_dtype: expected {allowed} or None, found {out_dtype!r}")
        if selection is not None and not isinstance(selection, Selection):
            raise InvalidDtypeError(f"selection: expected an fp8select.Selection or None, found {type(selection).__name__}")
        self.out_dtype = out_dtype
        self.selection = selection
        bn, bk = self.block_size
        self.weight = torch.nn.Parameter(
            torch.empty(out_features, in_features, dtype=WEIGHT_DTYPE, device=device), requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(
            torch.empty(_ceil_div(out_features, bn), _ceil_div(in_features, bk), dtype=torch.float32, device=device),
            requires_grad=False)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._layer: Fp8Linear | None = None
        self._loaded = False  # the parameters hold a checkpoint's values (not torch.empty's)
        self._prepared_from: tuple[Any, ...] | None = None
        self.register_load_state_dict_post_hook(_prepare_after_load)

    # -- construction from an unquantized layer ---------------------------------------------

    @classmethod
    def from_weights(cls, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None = None, *,
                     block_size: Sequence[int] = (128, 128), selection: Selection | None = None,
                     out_dtype: torch.dtype | None = None) -> BlockFp8Linear:
        """A module holding these tensors (no copy), prepared now when they are on its selection's device.

        ``weight`` is float8_e4m3fn ``[N, K]``; ``weight_scale_inv`` its fp32 block scales
        ``[ceil(N/bn), ceil(K/bk)]`` on the same device (typed errors otherwise).
        """
        for name, value in (("weight", weight), ("weight_scale_inv", weight_scale_inv), ("bias", bias)):
            if value is not None and not isinstance(value, torch.Tensor):
                raise InvalidDtypeError(f"{name}: expected a torch.Tensor, found {type(value).__name__}")
        block = check_block_size(block_size)
        check_weight(weight, weight_scale_inv, block)  # early, even when preparing waits for a device move
        n, k = weight.shape
        module = cls(k, n, bias=bias is not None, block_size=block, selection=selection, out_dtype=out_dtype, device="meta")
        module.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        module.weight_scale_inv = torch.nn.Parameter(weight_scale_inv.detach(), requires_grad=False)
        if bias is not None:
            module.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
        module._loaded = True
        module._sync()
        return module

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, block_size: Sequence[int] = (128, 128),
                    selection: Selection | None = None, *, out_dtype: torch.dtype | None = None) -> BlockFp8Linear:
        """Quantize ``linear``'s weight (bf16/fp16/fp32) to fp8 with one scale per block.

        The bias is copied in its dtype; ``linear`` is left unchanged. The module is prepared
        now when ``linear`` is on its selection's device (else at ``.to(device)``).
        """
        if not isinstance(linear, torch.nn.Linear):
            raise InvalidDtypeError(f"linear: expected a torch.nn.Linear, found {type(linear).__name__}")
        block = check_block_size(block_size)
        weight = linear.weight.detach()
        if weight.is_meta:
            raise InvalidInputError("linear.weight: expected a tensor holding data, found one on the meta device")
        w_fp8, scale = _quantize_weight(weight, block)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls.from_weights(w_fp8, scale, bias, block_size=block, selection=selection, out_dtype=out_dtype)

    # -- preparation ------------------------------------------------------------------------

    def prepare(self) -> None:
        """Lay the current weights out for the backend (load-time work, never per call).

        Called for you after ``load_state_dict``, ``.to()`` and in :meth:`from_linear`; call
        it after writing ``weight`` / ``weight_scale_inv`` in place or replacing them (until then a
        replaced one leaves the module unprepared). Raises
        :class:`~fp8select.errors.NotPreparedError` where the weights cannot run (on the meta
        device, or on a device kind other than the selection's), and the layer's typed
        errors for a bad checkpoint (non-finite scales, wrong shapes).
        """
        if not any(getattr(self, name).is_meta for name in _WEIGHT_NAMES):
            self._loaded = True
        selection = self._selection()
        reason = self._cannot_run(selection)
        if reason is not None:
            raise NotPreparedError(f"{self._name()}: cannot prepare: {reason}")
        self._layer = selection.prepare(self.weight, self.weight_scale_inv, self.block_size, out_dtype=self.out_dtype)
        self._prepared_from = self._weights_key()

    def _sync(self) -> None:
        """Prepare if the weights are real, on the selection's device and changed since the last time."""
        if any(getattr(self, name).is_meta for name in _WEIGHT_NAMES):
            self._loaded = False  # whatever comes off the meta device (to_empty) is not a checkpoint
        if not self._loaded:
            self._layer, self._prepared_from = None, None
            return
        if self._layer is not None and self._prepared_from == self._weights_key():
            return
        selection = self._selection()
        if self._cannot_run(selection) is not None:
            self._layer, self._prepared_from = None, None
            return
        self.prepare()

    def _selection(self) -> Selection:
        if self.selection is None:
            from fp8select.resolver import resolve

            self.selection = resolve()
        return self.selection

    def _cannot_run(self, selection: Selection) -> str | None:
        for name in _WEIGHT_NAMES:
            if getattr(self, name).is_meta:
                return f"{name} is on the meta device (load the weights first)"
        kind = selection.capabilities.device_kind
        want = _DEVICE_TYPE.get(kind, kind)
        have = self.weight.device.type
        if have != want:
            return (f"the weights are on {have} but the selection ({selection.backend.name}) runs on {kind}; "
                    f"move the module with .to({want!r}) or pass a selection for {have}")
        return None

    def _weights_key(self) -> tuple[Any, ...]:
        w, s = self.weight, self.weight_scale_inv
        return (w.device, w.dtype, w.data_ptr(), tuple(w.shape), s.device, s.dtype, s.data_ptr(), tuple(s.shape))

    # -- torch.nn.Module hooks ----------------------------------------------------------------

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        _check_quantized(state_dict, prefix, ("weight",))
        errors_before = len(error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if any(prefix + name in state_dict for name in _WEIGHT_NAMES):
            self._prepared_from = None  # new values, maybe in the same storage: prepare again
        if len(error_msgs) == errors_before and all(prefix + name in state_dict for name in _WEIGHT_NAMES):
            self._loaded = True  # prepared by _prepare_after_load once the whole model is loaded

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> BlockFp8Linear:
        protected = (self.weight, self.weight_scale_inv)

        def keep_weight_dtypes(t: torch.Tensor) -> torch.Tensor:
            if not any(t is p for p in protected):
                return fn(t)
            target = fn(t.new_empty(0))  # where, and as what, fn puts a tensor like t
            if target.dtype == t.dtype:
                return fn(t)
            return t.to(device=target.device)  # moves, but never casts, the fp8 weight and its fp32 scales

        super()._apply(keep_weight_dtypes, recurse)
        self._sync()
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        """A ``weight`` or ``weight_scale_inv`` replaced (``m.weight = Parameter(...)``) leaves the module unprepared
        until :meth:`prepare`: it never runs the old weights."""
        super().__setattr__(name, value)
        if name in _WEIGHT_NAMES and self.__dict__.get("_layer") is not None:
            self._layer, self._prepared_from = None, None

    def __getstate__(self) -> dict[str, Any]:
        # The prepared layer is process-local (backend state, a custom-op handle): copies and
        # pickles carry the weights and prepare their own.
        state = dict(self.__dict__)
        state["_layer"], state["_prepared_from"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._sync()

    # -- the forward ------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self._layer
        if layer is None:
            raise NotPreparedError(self._not_prepared_reason())
        return layer(x, self._parameters["bias"])  # (the dict itself: Module.__getattr__ costs a call)

    def _not_prepared_reason(self) -> str:
        if not self._loaded:
            return (f"{self._name()}: no weights loaded: load a state dict, build it with from_linear(), "
                    "or call prepare() after writing weight and weight_scale_inv")
        reason = self._cannot_run(self._selection()) if self.selection is not None else None
        return f"{self._name()}: not prepared: {reason or 'call prepare()'}"

    def _name(self) -> str:
        return f"BlockFp8Linear({self.in_features}, {self.out_features})"

    @property
    def fp8_layer(self) -> Fp8Linear | None:
        """The prepared layer (its plan, prepared weights), None until prepared."""
        return self._layer

    @property
    def backend(self) -> str | None:
        """The plan's backends by M range, e.g. ``M 1-4: triton, M >= 5: deepgemm`` (None until prepared)."""
        return self._layer.main_plan.summary() if self._layer is not None else None

    def extra_repr(self) -> str:
        bn, bk = self.block_size
        parts = [f"in_features={self.in_features}", f"out_features={self.out_features}", f"bias={self.bias is not None}",
                 f"block_size=({bn}, {bk})"]
        if self.out_dtype is not None:
            parts.append(f"out_dtype={dtype_name(self.out_dtype)}")
        if self._layer is None:
            parts.append("backend=None (not prepared)")
        else:
            parts.append(f"plan={self._layer.main_plan.summary()!r}")
        return ", ".join(parts)


_MOE_NAMES = ("w13_weight", "w13_weight_scale_inv", "w2_weight", "w2_weight_scale_inv")


class BlockFp8MoE(torch.nn.Module):
    """The experts of a block-FP8 MoE layer: ``y = moe(x, topk_weights, topk_ids)`` (docs/moe.md).

    Its state dict holds ``w13_weight`` (float8_e4m3fn ``[E, 2I, H]``, gate rows then up rows),
    ``w2_weight`` (``[E, H, I]``) and their fp32 block scales ``w13_weight_scale_inv`` /
    ``w2_weight_scale_inv``. It prepares (:meth:`fp8select.Selection.prepare_moe`) when its weights
    become real on its selection's device kind: after ``load_state_dict`` (also ``assign=True`` into a
    meta module), after ``.to(device)``, or when :meth:`prepare` is called after writing in place.
    ``forward`` prepares nothing, so it is one custom op under ``torch.compile``. Inference only.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 block_size: Sequence[int] = (128, 128), selection: Selection | None = None, top_k: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.num_experts = _positive_int("num_experts", num_experts)
        self.hidden_size = _positive_int("hidden_size", hidden_size)
        self.intermediate_size = _positive_int("intermediate_size", intermediate_size)
        self.block_size = check_block_size(block_size)
        if selection is not None and not isinstance(selection, Selection):
            raise InvalidDtypeError(f"selection: expected an fp8select.Selection or None, found {type(selection).__name__}")
        self.selection, self.top_k = selection, top_k
        e, h, i = num_experts, hidden_size, intermediate_size
        bn, bk = self.block_size
        shapes = {"w13_weight": ((e, 2 * i, h), WEIGHT_DTYPE), "w2_weight": ((e, h, i), WEIGHT_DTYPE),
                  "w13_weight_scale_inv": ((e, _ceil_div(2 * i, bn), _ceil_div(h, bk)), torch.float32),
                  "w2_weight_scale_inv": ((e, _ceil_div(h, bn), _ceil_div(i, bk)), torch.float32)}
        for name, (shape, dtype) in shapes.items():
            self.register_parameter(name, torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device),
                                                             requires_grad=False))
        self._moe: Fp8MoE | None = None
        self._loaded = False
        self.register_load_state_dict_post_hook(_prepare_after_load)

    def prepare(self) -> None:
        """Lay the current weights out for the selection's MoE backends (never per call)."""
        tensors: list[torch.Tensor] = [getattr(self, n) for n in _MOE_NAMES]
        if any(t.is_meta for t in tensors):
            raise NotPreparedError(f"{self._name()}: cannot prepare: its weights are on the meta device (load them first)")
        if self.selection is None:
            from fp8select.resolver import resolve

            self.selection = resolve()
        kind = self.selection.capabilities.device_kind
        want, have = _DEVICE_TYPE.get(kind, kind), tensors[0].device.type
        if have != want:
            raise NotPreparedError(f"{self._name()}: cannot prepare: the weights are on {have} but the selection runs "
                                   f"on {kind}; move the module with .to({want!r})")
        self._loaded = True
        w13, w13_scale, w2, w2_scale = tensors
        self._moe = self.selection.prepare_moe(w13, w13_scale, w2, w2_scale, self.block_size, top_k=self.top_k)

    def _sync(self) -> None:
        try:
            self.prepare()
        except NotPreparedError:
            self._moe = None

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        _check_quantized(state_dict, prefix, ("w13_weight", "w2_weight"))
        errors_before = len(error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if len(error_msgs) == errors_before and any(prefix + name in state_dict for name in _MOE_NAMES):
            # Prepared again by _prepare_after_load: every weight loaded now, or some over weights loaded before.
            self._loaded = self._loaded or all(prefix + name in state_dict for name in _MOE_NAMES)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> BlockFp8MoE:
        def keep_dtypes(t: torch.Tensor) -> torch.Tensor:  # fp8 weights and fp32 scales are moved, never cast
            target = fn(t.new_empty(0))  # where, and as what, fn puts a tensor like t
            return fn(t) if target.dtype == t.dtype else t.to(device=target.device)

        super()._apply(keep_dtypes, recurse)
        if any(getattr(self, name).is_meta for name in _MOE_NAMES):
            self._loaded = False  # whatever comes off the meta device (to_empty) is not a checkpoint
            self._moe = None
        elif self._loaded:
            self._sync()
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        """A weight or scale replaced (``m.w2_weight = Parameter(...)``) leaves the module unprepared until
        :meth:`prepare`: it never runs the old weights."""
        super().__setattr__(name, value)
        if name in _MOE_NAMES and self.__dict__.get("_moe") is not None:
            self._moe = None

    def __getstate__(self) -> dict[str, Any]:
        # The prepared layer is process-local: copies and pickles carry the weights and prepare their own.
        state = dict(self.__dict__)
        state["_moe"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self._loaded:
            self._sync()

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        moe = self._moe
        if moe is None:
            raise NotPreparedError(f"{self._name()}: not prepared: load a state dict or call prepare()")
        return moe(x, topk_weights, topk_ids)

    @property
    def fp8_moe(self) -> Fp8MoE | None:
        """The prepared layer (its plan), None until prepared."""
        return self._moe

    def _name(self) -> str:
        return f"BlockFp8MoE({self.num_experts}, {self.hidden_size}, {self.intermediate_size})"

    def extra_repr(self) -> str:
        plan = "None (not prepared)" if self._moe is None else repr(self._moe.main_plan.summary())
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, plan={plan}")


def _check_quantized(state_dict: Any, prefix: str, names: Sequence[str]) -> None:
    """A typed error for a state dict's unquantized weight: ``copy_`` into the fp8 parameter would cast it, unscaled."""
    for name in names:
        weight = state_dict.get(prefix + name)
        if isinstance(weight, torch.Tensor) and weight.dtype not in FLOAT8_DTYPES:
            allowed = "/".join(dtype_name(d) for d in FLOAT8_DTYPES)
            raise InvalidDtypeError(f"{prefix}{name}: expected dtype {allowed}, found {dtype_name(weight.dtype)}: an "
                                    "unquantized weight (quantize it first: fp8select.quantize_weight)")


def _prepare_after_load(module: torch.nn.Module, incompatible_keys: Any) -> None:
    if isinstance(module, BlockFp8Linear):
        module._sync()
    elif isinstance(module, BlockFp8MoE) and module._loaded:
        module._sync()


def _quantize_weight(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    from fp8select.kernels.weight_quant import quantize_weight

    return quantize_weight(weight, block)
