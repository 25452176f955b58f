"""Typed checks of what users hand a layer: the block size, the checkpoint weight and its scales (at
load time), and a call's input, input scales and bias (on the checked path: the fast path of
:meth:`fp8select.layer.Fp8Linear.forward` takes only inputs these would accept). Each raises an
:class:`~fp8select.errors.InvalidDtypeError` or :class:`~fp8select.errors.InvalidInputError` naming the
argument and what was found."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.kernels.quant import ACTIVATION_DTYPES
from fp8select.problem import dtype_name

__all__ = ["FLOAT8_DTYPES", "check_bias", "check_block_size", "check_input", "check_max_weight_copies", "check_weight"]

FLOAT8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_block_size(block_size: object) -> tuple[int, int]:
    """``block_size`` as a pair of positive ints, or a typed error naming it."""
    if isinstance(block_size, torch.Tensor) or not isinstance(block_size, Sequence) or isinstance(block_size, str):
        raise InvalidDtypeError(f"block_size: expected two positive integers [block_n, block_k], found {block_size!r}")
    values = list(block_size)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidDtypeError(f"block_size: expected two positive integers [block_n, block_k], found {block_size!r}")
    if not all(v > 0 for v in values):
        raise InvalidInputError(f"block_size: expected two positive integers [block_n, block_k], found {block_size!r}")
    return values[0], values[1]


def _dense(name: str, t: torch.Tensor) -> None:
    if t.layout != torch.strided:
        raise InvalidInputError(f"{name}: expected a dense (strided) tensor, found layout {t.layout}")


def check_max_weight_copies(value: object) -> None:
    """``max_weight_copies`` is a non-negative integer or None, else a typed error naming it."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidInputError(f"max_weight_copies: expected a non-negative integer or None, found {value!r}")


def check_weight(weight: object, weight_scale: object, block: tuple[int, int]) -> None:
    """Validate the checkpoint weight and its block scales (at load time, never per call)."""
    if not isinstance(weight, torch.Tensor):
        raise InvalidDtypeError(f"weight: expected a torch.Tensor, found {type(weight).__name__}")
    if not isinstance(weight_scale, torch.Tensor):
        raise InvalidDtypeError(f"weight_scale: expected a torch.Tensor, found {type(weight_scale).__name__}")
    _dense("weight", weight)
    _dense("weight_scale", weight_scale)
    if weight.dtype not in FLOAT8_DTYPES:
        allowed = "/".join(dtype_name(d) for d in FLOAT8_DTYPES)
        raise InvalidDtypeError(f"weight: expected dtype {allowed}, found {dtype_name(weight.dtype)}")
    if weight.dim() != 2:
        raise InvalidInputError(f"weight: expected a 2-D [N, K] tensor, found shape {tuple(weight.shape)}")
    if weight.device.type == "meta":
        raise InvalidInputError("weight: expected a tensor holding data, found one on the meta device (load the weights first)")
    n, k = weight.shape
    if n == 0 or k == 0:
        raise InvalidInputError(f"weight: expected N > 0 and K > 0, found shape {tuple(weight.shape)}")
    if weight_scale.dtype != torch.float32:
        raise InvalidDtypeError(f"weight_scale: expected dtype float32, found {dtype_name(weight_scale.dtype)}")
    bn, bk = block
    expected = (_ceil_div(n, bn), _ceil_div(k, bk))
    if tuple(weight_scale.shape) != expected:
        raise InvalidInputError(
            f"weight_scale: expected shape [ceil(N/{bn}), ceil(K/{bk})] = {list(expected)} for weight {list(weight.shape)} "
            f"and block_size [{bn}, {bk}], found {list(weight_scale.shape)}")
    if weight_scale.device != weight.device:
        raise InvalidInputError(f"weight_scale: expected device {weight.device} (the weight's), found {weight_scale.device}")
    if not bool(torch.isfinite(weight_scale).all()):
        bad = int((~torch.isfinite(weight_scale)).sum())
        raise InvalidInputError(f"weight_scale: expected finite values, found {bad} NaN/inf entries")


def check_input(x: object, input_scale: object, *, k: int, group: int, device: torch.device,
                out_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    """A layer call's input (and its scales, for an fp8 input) checked against the layer's K, scale group,
    device and fixed output dtype: ``(x as [M, K] with unit K stride, scales as [M, groups] or None,
    the leading shape)``, or a typed error naming what is wrong."""
    if not isinstance(x, torch.Tensor):
        raise InvalidDtypeError(f"input: expected a torch.Tensor, found {type(x).__name__}")
    _dense("input", x)
    if x.dim() < 1 or x.shape[-1] != k:
        raise InvalidInputError(f"input: expected shape [..., K={k}], found {list(x.shape)}")
    if x.device != device:
        raise InvalidInputError(f"input: expected device {device} (the weight's), found {x.device}")
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, k)
    if x2.shape[0] and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x.dtype in FLOAT8_DTYPES:
        if input_scale is None:
            raise InvalidInputError("input_scale: a pre-quantized fp8 input needs its per-token group scales, found None")
        if out_dtype is None:
            raise InvalidDtypeError(
                "out_dtype: a pre-quantized fp8 input needs an output dtype; pass out_dtype=torch.bfloat16 "
                "(or float16/float32) to prepare() or linear()")
        if not isinstance(input_scale, torch.Tensor):
            raise InvalidDtypeError(f"input_scale: expected a torch.Tensor, found {type(input_scale).__name__}")
        _dense("input_scale", input_scale)
        groups = _ceil_div(k, group)
        if tuple(input_scale.shape) != (*lead, groups) or input_scale.dtype != torch.float32:
            raise InvalidInputError(
                f"input_scale: expected float32 of shape {[*lead, groups]} (one scale per 1x{group} group), "
                f"found {dtype_name(input_scale.dtype)} {list(input_scale.shape)}")
        if input_scale.device != device:
            raise InvalidInputError(f"input_scale: expected device {device}, found {input_scale.device}")
        return x2, input_scale.reshape(-1, groups), lead
    if x.dtype not in ACTIVATION_DTYPES:
        allowed = "/".join(dtype_name(d) for d in (*ACTIVATION_DTYPES, *FLOAT8_DTYPES))
        raise InvalidDtypeError(f"input: expected dtype {allowed}, found {dtype_name(x.dtype)}")
    if input_scale is not None:
        raise InvalidInputError(f"input_scale: only meaningful with an fp8 input, found input dtype {dtype_name(x.dtype)}")
    return x2, None, lead


def check_bias(bias: object, *, n: int, device: torch.device) -> None:
    """A layer call's bias: None, or a dense float [N] tensor on the layer's device; else a typed error."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise InvalidDtypeError(f"bias: expected a torch.Tensor or None, found {type(bias).__name__}")
    _dense("bias", bias)
    if tuple(bias.shape) != (n,):
        raise InvalidInputError(f"bias: expected shape [N={n}], found {list(bias.shape)}")
    if bias.device != device:
        raise InvalidInputError(f"bias: expected device {device}, found {bias.device}")
    if not bias.dtype.is_floating_point or bias.dtype.itemsize == 1:
        raise InvalidDtypeError(f"bias: expected a bf16/fp16/fp32 tensor, found {dtype_name(bias.dtype)}")
