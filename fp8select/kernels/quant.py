"""Per-token-group FP8 activation quantization in pure torch: the reference numerics.

DeepSeek-style block FP8 linears quantize activations at run time per token and per group of
``group_size`` (128) consecutive K elements: ``scale = max(amax, eps) / fp8_max`` and
``x_q = round_to_fp8(clamp(x / scale, -fp8_max, fp8_max))``, all in fp32 with IEEE division
and round-to-nearest-even. The Triton kernels in this package reproduce these numerics bit for
bit, so either producer can feed any consumer.

Consumers want the scales in different layouts (row-major for Triton, M-major with TMA
padding for DeepGEMM, M-major for cuBLAS block-wise ``scaled_mm``, power-of-two for UE8M0
recipes); :class:`ScaleLayout` describes which.

Non-finite input: a NaN or +-inf anywhere in a group makes that group's scale NaN and every one
of its fp8 values NaN (e4m3fn 0x7F or 0xFF, e4m3fnuz 0x80), so any GEMM that consumes
``(x_q, scale)`` (cuBLAS, DeepGEMM, CUTLASS, the Triton kernels, the reference) gives that
token a NaN output row, as the fp64 reference and a bf16 matmul give a non-finite one. (An inf
alone would give an infinite scale, its finite neighbours 0 and itself NaN, which some
consumers could turn back into finite numbers.) Groups without NaN/inf are unaffected, bit for
bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

__all__ = [
    "ACTIVATION_DTYPES",
    "DEFAULT_EPS",
    "M_MAJOR",
    "ROW_MAJOR",
    "Fp8Format",
    "ScaleLayout",
    "ceil_pow2",
    "check_activation",
    "check_quant_args",
    "check_quant_params",
    "empty_scale",
    "fp8_format",
    "fp8_max",
    "quantize_per_token_group",
]

DEFAULT_EPS = 1e-10
"""Floor for a group's amax, so that an all-zero group gets a finite, non-zero scale."""

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""Unquantized activation dtypes the quantizers (and the Triton linear) take."""


@dataclass(frozen=True)
class ScaleLayout:
    """Memory layout of the activation scale tensor (logical shape ``[M, G]``, fp32).

    Attributes:
        mn_major: ``False``: ``[M, G]`` row-major contiguous. ``True``: the storage is
            ``[G, M_pad]`` contiguous and the returned tensor is its ``.t()[:M]`` view, i.e.
            shape ``[M, G]`` with strides ``(1, M_pad)`` (what DeepGEMM and cuBLAS read).
        m_align: pad M of the storage up to a multiple of this (4 makes each fp32 column
            16-byte aligned for TMA); only meaningful with ``mn_major``. Padding entries are
            left unspecified.
        ue8m0: round each scale up to a power of two (``2**ceil(log2 s)``) before quantizing
            with it, for recipes whose hardware scales are 8-bit exponents. Values stay fp32.
    """

    mn_major: bool = False
    m_align: int = 1
    ue8m0: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.m_align, int) or self.m_align < 1:
            raise ValueError(f"m_align must be a positive int, got {self.m_align!r}")

    def padded_rows(self, m: int) -> int:
        """Rows (M) of the scale storage for ``m`` tokens: padded only when M-major."""
        if not self.mn_major:
            return m
        return -(-m // self.m_align) * self.m_align


ROW_MAJOR = ScaleLayout()
M_MAJOR = ScaleLayout(mn_major=True)


@dataclass(frozen=True)
class Fp8Format:
    """What the quantizer needs to know about an fp8 dtype.

    Attributes:
        max: largest finite value (the saturation bound).
        mantissa_bits: explicit mantissa bits (3 for e4m3, 2 for e5m2).
        min_normal_exp: unbiased exponent of the smallest normal number; below it the
            format is subnormal with a fixed quantum of ``2**(min_normal_exp - mantissa_bits)``.
        nan_bits: the bit pattern of its (positive) NaN: 0x7F, or 0x80 for the fnuz formats
            (which have no negative zero and one NaN). None of them has an infinity.
    """

    max: float
    mantissa_bits: int
    min_normal_exp: int
    nan_bits: int


def _known_fp8_formats() -> Mapping[torch.dtype, Fp8Format]:
    """The fp8 dtypes this torch build has, with their formats (read-only).

    A table, not ``torch.finfo``: finfo of ``float8_e5m2fnuz`` reports a wrong ``eps``.
    """
    known = {
        "float8_e4m3fn": Fp8Format(448.0, 3, -6, 0x7F),
        "float8_e4m3fnuz": Fp8Format(240.0, 3, -7, 0x80),
        "float8_e5m2": Fp8Format(57344.0, 2, -14, 0x7F),
        "float8_e5m2fnuz": Fp8Format(57344.0, 2, -15, 0x80),
    }
    return MappingProxyType({getattr(torch, name): fmt for name, fmt in known.items() if hasattr(torch, name)})


_FP8_FORMATS = _known_fp8_formats()


def fp8_format(dtype: torch.dtype) -> Fp8Format:
    """The :class:`Fp8Format` of an fp8 ``dtype``; ``ValueError`` for anything else."""
    fmt = _FP8_FORMATS.get(dtype)
    if fmt is None:
        raise ValueError(f"dtype must be a float8 type, got {dtype}")
    return fmt


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype: 448 for e4m3fn, 240 for e4m3fnuz."""
    return fp8_format(dtype).max


def ceil_pow2(scale: torch.Tensor) -> torch.Tensor:
    """Round positive normal fp32 values up to the next power of two, exactly; NaN and inf are
    kept as they are.

    Integer arithmetic on the bit pattern (carry the mantissa into the exponent), so it is
    exact where ``exp2(ceil(log2(s)))`` may be off by one at the boundaries, and the Triton
    kernels can do the same operation bit for bit.
    """
    bits = scale.contiguous().view(torch.int32)
    rounded = (bits + 0x7FFFFF) & 0x7F800000
    return torch.where((bits & 0x7F800000) == 0x7F800000, bits, rounded).view(torch.float32)


def empty_scale(m: int, groups: int, layout: ScaleLayout, device: torch.device | str) -> torch.Tensor:
    """Allocate an uninitialised fp32 scale tensor ``[m, groups]`` in ``layout``."""
    if not layout.mn_major:
        return torch.empty(m, groups, dtype=torch.float32, device=device)
    rows = layout.padded_rows(m)
    if rows == m:  # the [groups, m] storage seen as [m, groups]: one allocation, no view
        return torch.empty_strided((m, groups), (1, m), dtype=torch.float32, device=device)
    return torch.empty((groups, rows), dtype=torch.float32, device=device).t()[:m]


def check_activation(x: torch.Tensor) -> None:
    """``ValueError`` unless ``x`` is a 2-D ``[M, K]`` activation of one of :data:`ACTIVATION_DTYPES`."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")


def check_quant_args(x: torch.Tensor, group_size: int, dtype: torch.dtype, eps: float) -> None:
    """Validate the arguments shared by the torch and Triton quantizers."""
    check_activation(x)
    check_quant_params(group_size, dtype, eps)


def check_quant_params(group_size: int, dtype: torch.dtype, eps: float) -> None:
    """Validate a quantizer's group size, fp8 dtype and eps (what does not depend on the activation)."""
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    fp8_format(dtype)
    if not eps > 0.0:
        raise ValueError(f"eps must be > 0 so all-zero groups get a finite scale, got {eps!r}")


def quantize_per_token_group(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    dtype: torch.dtype = torch.float8_e4m3fn,
    layout: ScaleLayout = ROW_MAJOR,
    eps: float = DEFAULT_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each token's groups of ``group_size`` K elements to fp8 with one fp32 scale.

    Args:
        x: ``[M, K]`` bf16/fp16/fp32, any strides. K need not be a multiple of
            ``group_size``: the last group is partial, ``G = ceil(K / group_size)``.
        group_size: K elements per scale (128 for DeepSeek recipes).
        dtype: fp8 output dtype.
        layout: layout of the returned scale (see :class:`ScaleLayout`).
        eps: floor on each group's amax.

    Returns:
        ``(x_q, scale)``: ``x_q`` ``[M, K]`` contiguous in ``dtype`` and ``scale`` ``[M, G]``
        fp32 in ``layout``, with ``x ≈ x_q * scale`` per group. A group holding a NaN or
        +-inf has a NaN scale and NaN values (see the module docstring).
    """
    check_quant_args(x, group_size, dtype, eps)
    fmax = fp8_max(dtype)
    m, k = x.shape
    groups = -(-k // group_size)
    xf = x.to(torch.float32)
    pad = groups * group_size - k
    if pad:
        # Zeros do not change a group's amax and are sliced off again below.
        xf = torch.nn.functional.pad(xf, (0, pad))
    xg = xf.reshape(m, groups, group_size)
    # torch's max reductions and clamp propagate NaN.
    amax = xg.abs().amax(dim=-1) if groups else xg.new_zeros((m, 0))
    # Divide by a tensor, not a Python float: torch's CUDA kernels turn division by a scalar
    # into multiplication by its reciprocal, which is not IEEE division and made the torch and
    # Triton quantizers differ in the last bit of some scales on the H200.
    scale = amax.clamp(min=eps) / torch.full_like(amax, fmax)
    if layout.ue8m0:
        scale = ceil_pow2(scale)
    # A group with an inf (or NaN) gets a NaN scale: its values then all become NaN.
    scale = torch.where(amax < math.inf, scale, math.nan)
    q = (xg / scale.unsqueeze(-1)).clamp(-fmax, fmax).reshape(m, groups * group_size)
    x_q = q.to(dtype)[:, :k].contiguous()
    if not layout.mn_major:
        return x_q, scale
    out = empty_scale(m, groups, layout, x.device)
    out.copy_(scale)
    return x_q, out
