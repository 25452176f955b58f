"""Block-wise FP8 quantization of a weight, in the convention of DeepSeek-style checkpoints.

:func:`quantize_weight` turns a bf16/fp16/fp32 ``[N, K]`` weight into the fp8 weight and the
fp32 block scales a checkpoint stores (Hugging Face and DeepSeek call the scales
``weight_scale_inv``): per ``(bn, bk)`` block ``scale = amax / fp8_max`` and
``w_fp8 = round_to_nearest_even(w / scale)``, so ``w ≈ w_fp8 * scale`` is how every backend
(and :func:`fp8select.backends.reference.dequantize_weight`) reads it back. Pure torch, any
device; the arithmetic is fp32 with IEEE division, like the activation quantizer in
:mod:`.quant`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.kernels.quant import DEFAULT_EPS, fp8_max

__all__ = ["WEIGHT_DTYPES", "quantize_weight"]

WEIGHT_DTYPES: tuple[torch.dtype, ...] = tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, name)
)
"""fp8 dtypes a weight can be quantized to: e4m3fn (checkpoints), e4m3fnuz (AMD gfx942)."""

_CHUNK_ELEMENTS = 1 << 26
"""Weight elements quantized per step (whole row blocks): bounds the fp32 temporaries to a few
hundred MB for the largest layers instead of several copies of the whole weight."""


def _block_pair(block_size: object) -> tuple[int, int]:
    if (not isinstance(block_size, Sequence) or isinstance(block_size, str) or len(block_size) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block_size)):
        raise InvalidInputError(f"quantize_weight: block_size must be two positive ints (bn, bk), found {block_size!r}")
    return block_size[0], block_size[1]


def quantize_weight(
    weight: torch.Tensor,
    block_size: Sequence[int] = (128, 128),
    *,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight to fp8 with one fp32 scale per ``block_size`` block.

    Args:
        weight: ``[N, K]`` bf16, fp16, fp32 or fp64, finite, on any device. Not modified.
        block_size: ``(bn, bk)``: ``(128, 128)`` for DeepSeek-style checkpoints, ``(1, 128)``
            for one scale per output row and 128 K elements. Ragged N and K are fine: the last
            blocks are partial.
        dtype: ``torch.float8_e4m3fn`` (default) or ``torch.float8_e4m3fnuz``.

    Returns:
        ``(w_fp8, scale)``: ``w_fp8`` ``[N, K]`` contiguous in ``dtype``; ``scale``
        ``[ceil(N/bn), ceil(K/bk)]`` fp32, ``amax / fp8_max`` of each block (448 for e4m3fn,
        240 for e4m3fnuz), so each block's largest magnitude maps to ``fp8_max``. An all-zero
        block gets the positive scale ``1e-10 / fp8_max`` (never 0 or NaN) and zero values.
        Dequantize as ``w_fp8.float() * scale`` expanded over the blocks.

    Raises:
        InvalidInputError: ``weight`` is not 2-D, is empty, holds NaN or +-inf, is not dense or
            is on the meta device; ``block_size`` is not two positive ints.
        InvalidDtypeError: ``weight`` is not a floating-point tensor or is fp8 already;
            ``dtype`` is not an e4m3 fp8 dtype.

    On a GPU it synchronises once (to check that every value is finite). No autograd is recorded (a
    parameter that requires grad gives outputs that do not).
    """
    if not isinstance(weight, torch.Tensor):
        raise InvalidDtypeError(f"quantize_weight: weight must be a torch.Tensor, found {type(weight).__name__}")
    if weight.dim() != 2:
        raise InvalidInputError(f"quantize_weight: weight must be 2-D [N, K], found shape {list(weight.shape)}")
    if not weight.is_floating_point() or weight.element_size() == 1:
        what = "already fp8 (pass it and its scales to prepare)" if weight.is_floating_point() else "not floating point"
        raise InvalidDtypeError(f"quantize_weight: weight must be bfloat16, float16, float32 or float64, "
                                f"found {weight.dtype}: {what}")
    bn, bk = _block_pair(block_size)
    if dtype not in WEIGHT_DTYPES:
        allowed = ", ".join(str(d) for d in WEIGHT_DTYPES)
        raise InvalidDtypeError(f"quantize_weight: dtype must be one of {allowed}, found {dtype}")
    if weight.layout != torch.strided or weight.is_meta:
        where = "on the meta device (load its values first)" if weight.is_meta else f"of layout {weight.layout}"
        raise InvalidInputError(f"quantize_weight: weight must be a dense tensor with values, found one {where}")
    n, k = weight.shape
    if n == 0 or k == 0:
        raise InvalidInputError(f"quantize_weight: weight is empty, shape {list(weight.shape)}")
    with torch.no_grad():  # a parameter's weight: its outputs hold no autograd graph (nor its fp32 temporaries)
        return _quantized(weight, min(bn, n), min(bk, k), dtype)  # a block wider than the weight is one block


def _quantized(weight: torch.Tensor, bn: int, bk: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_weight` of a checked weight."""
    n, k = weight.shape
    fmax = fp8_max(dtype)
    nb, kb = -(-n // bn), -(-k // bk)
    w_q = torch.empty((n, k), dtype=dtype, device=weight.device)
    scale = torch.empty((nb, kb), dtype=torch.float32, device=weight.device)
    finite = torch.ones((), dtype=torch.bool, device=weight.device)
    rows_per_chunk = max(bn, _CHUNK_ELEMENTS // max(1, kb * bk) // bn * bn)
    for r0 in range(0, n, rows_per_chunk):
        r1 = min(n, r0 + rows_per_chunk)
        chunk_blocks = -(-(r1 - r0) // bn)
        padded = torch.zeros((chunk_blocks * bn, kb * bk), dtype=torch.float32, device=weight.device)
        padded[: r1 - r0, :k] = weight[r0:r1]
        blocks = padded.view(chunk_blocks, bn, kb, bk)
        amax = blocks.abs().amax(dim=(1, 3))  # NaN and inf propagate: checked once at the end
        finite &= torch.isfinite(amax).all()
        # Divide by a tensor (IEEE division, not a reciprocal multiply; see quant.py).
        block_scale = amax.clamp(min=DEFAULT_EPS) / torch.full_like(amax, fmax)
        q = (blocks / block_scale[:, None, :, None]).clamp(-fmax, fmax)
        w_q[r0:r1] = q.view(chunk_blocks * bn, kb * bk)[: r1 - r0, :k].to(dtype)
        scale[r0 // bn : r0 // bn + chunk_blocks] = block_scale
    if not bool(finite):
        bad = int((~torch.isfinite(weight.to(torch.float32))).sum())
        raise InvalidInputError(f"quantize_weight: weight must be finite (in float32), found {bad} NaN or infinite values")
    return w_q, scale
