"""Triton per-token-group FP8 activation quantization (numerics of :mod:`.quant`, bit for bit).

The ``@triton.jit`` helper :func:`fp8_group_quantize` (with :func:`fp8_group_scale` and
:func:`fp8_quantize`) is shared with the GEMM kernels that quantize in their K loop
(:mod:`.triton_gemm_kernels`), so the separate and the fused paths quantize alike.

Bitwise equality with torch needs: IEEE division (``tl.math.div_rn``; ``/`` on fp32 is
approximate on NVIDIA GPUs), the UE8M0 power-of-two rounding done on the bit pattern
(``log2``/``exp2`` are approximate), and a round-to-nearest-even fp32->fp8 conversion. On
NVIDIA GPUs Triton's cast is the hardware ``cvt.rn.satfinite`` (RNE, NaN kept), used as is
(``HW_RNE=True``). The Triton CPU interpreter's cast does not carry a rounded-up mantissa
into the exponent and turns NaN into a finite value, so there (and on ROCm/XPU, whose casts
were not checked) the value is first rounded onto the fp8 grid in fp32
(:func:`_round_to_fp8_grid`, ~10 integer/float ops per element), after which the cast is
exact, and NaN lanes get the format's NaN bits explicitly. :func:`hw_rne` picks the mode per
launch.

Non-finite input (the semantics of :mod:`.quant`): a NaN or +-inf anywhere in a group makes the
group's scale NaN and all its fp8 values NaN (e4m3fn 0x7F, e4m3fnuz 0x80), so any GEMM
consuming them gives that token a NaN output row. NaN counts as inf in the amax (one ``min``
per element), an infinite amax gives a NaN scale (one select per group), and NaN values stay
NaN through the saturation: on NVIDIA ``cvt.rn.satfinite`` saturates and keeps NaN by itself,
so the explicit clamp is gone there and the kernels run as many instructions per element as
before; elsewhere NaN lanes are patched after the cast. Nothing is read twice, and groups
without NaN/inf are bit for bit what they were.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .quant import (
    DEFAULT_EPS,
    ROW_MAJOR,
    ScaleLayout,
    check_quant_args,
    check_quant_params,
    empty_scale,
    fp8_format,
)
from .triton_launch import BoundKernel, Recorded, Replay, Replays, int_class
from .triton_pdl import PDL_MAX_M, pdl_enter, pdl_possible

__all__ = [
    "fp8_constexprs",
    "fp8_group_quantize",
    "fp8_group_scale",
    "fp8_quantize",
    "hw_rne",
    "TritonQuantizer",
    "quantize_per_token_group_triton",
]


def hw_rne(kernel: object, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``kernel`` launched on ``device`` may rely on the fp32->``dtype`` cast rounding to
    nearest even: compiled (not interpreted) for an NVIDIA GPU, where Triton emits
    ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` for e4m3fn and e5m2. Everywhere else (and for the
    fnuz types) the kernels round in fp32 first.
    """
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    native = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return native and device.type == "cuda" and torch.version.hip is None and not interpreted


def fp8_constexprs(dtype: torch.dtype) -> dict[str, float | int]:
    """Kernel constexprs describing ``dtype``'s grid and NaN (see :func:`fp8_quantize`)."""
    fmt = fp8_format(dtype)
    return {
        "FP8_MAX": fmt.max,
        "FP8_MANT_BITS": fmt.mantissa_bits,
        "FP8_MIN_EXP_BIASED": fmt.min_normal_exp + 127,
        "FP8_NAN_BITS": fmt.nan_bits,
    }


@triton.jit
def fp8_group_scale(amax, eps, FP8_MAX: tl.constexpr, UE8M0: tl.constexpr):
    """``max(amax, eps) / FP8_MAX`` with IEEE division, optionally rounded up to 2**n; NaN where
    ``amax`` is inf or NaN (a group with a non-finite value)."""
    scale = tl.math.div_rn(tl.maximum(amax, eps), FP8_MAX)
    if UE8M0:
        bits = scale.to(tl.int32, bitcast=True)
        scale = ((bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.where(amax < float("inf"), scale, float("nan"))


@triton.jit
def _round_to_fp8_grid(y, FP8_MANT_BITS: tl.constexpr, FP8_MIN_EXP_BIASED: tl.constexpr):
    """Round fp32 ``y`` (already within +-FP8_MAX) to the nearest fp8 value, ties to even.

    Adding ``2**(e + 23 - mantissa_bits)`` (``e`` = the exponent of ``|y|``, floored at the
    format's smallest normal exponent, which covers subnormals) makes the fp32 adder round
    ``|y|`` to exactly the fp8 quantum; subtracting it back is exact. NaN stays NaN.
    """
    bits = y.to(tl.int32, bitcast=True)
    mag_bits = bits & 0x7FFFFFFF
    exp_biased = tl.maximum(mag_bits >> 23, FP8_MIN_EXP_BIASED)
    magic = ((exp_biased + (23 - FP8_MANT_BITS)) << 23).to(tl.float32, bitcast=True)
    rounded = (mag_bits.to(tl.float32, bitcast=True) + magic) - magic
    sign = bits & -2147483648
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def fp8_quantize(
    x,
    scale,
    FP8_DTYPE: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr,
    FP8_MIN_EXP_BIASED: tl.constexpr,
    FP8_NAN_BITS: tl.constexpr,
    HW_RNE: tl.constexpr,
):
    """``x / scale`` saturated to +-FP8_MAX and rounded to nearest even, as ``FP8_DTYPE``; NaN
    (from a NaN ``x`` or ``scale``) becomes the format's NaN.

    With ``HW_RNE`` the cast is ``cvt.rn.satfinite``: it rounds to nearest even, saturates to
    +-FP8_MAX and keeps NaN, all in the one instruction. Otherwise the value is clamped and
    rounded onto the fp8 grid here in fp32, so the cast is exact, and NaN lanes get the
    format's NaN bits explicitly (the interpreter's cast maps NaN to a finite value, and no
    other cast was checked).
    """
    y = tl.math.div_rn(x, scale)
    if HW_RNE:
        q = y.to(FP8_DTYPE)
    else:
        rounded = _round_to_fp8_grid(tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX), FP8_MANT_BITS, FP8_MIN_EXP_BIASED)
        bits = rounded.to(FP8_DTYPE).to(tl.uint8, bitcast=True)
        q = tl.where(y != y, FP8_NAN_BITS, bits).to(tl.uint8).to(FP8_DTYPE, bitcast=True)
    return q


@triton.jit
def fp8_group_quantize(
    x,
    eps,
    FP8_DTYPE: tl.constexpr,
    UE8M0: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr,
    FP8_MIN_EXP_BIASED: tl.constexpr,
    FP8_NAN_BITS: tl.constexpr,
    HW_RNE: tl.constexpr,
):
    """Quantize a ``[rows, group]`` tile, one scale group per row: ``(q, scale)``, ``q`` in
    ``FP8_DTYPE`` and ``scale`` the ``[rows]`` fp32 scales. The quantization kernel and the
    GEMMs that quantize in their K loop all call this, so they quantize alike. Padding lanes
    must be loaded as 0."""
    xf = x.to(tl.float32)
    # NaN counts as inf in the amax (min(NaN, inf) is inf: min.f32 returns the non-NaN operand),
    # so a group with either gets a NaN scale. A NaN-propagating reduction (max.NaN.f32) would
    # do it too, but runs element by element under the interpreter.
    amax = tl.max(tl.minimum(tl.abs(xf), float("inf")), axis=1)
    scale = fp8_group_scale(amax, eps, FP8_MAX, UE8M0)
    q = fp8_quantize(xf, scale[:, None], FP8_DTYPE, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED, FP8_NAN_BITS, HW_RNE)
    return q, scale


@triton.jit(do_not_specialize=["M", "stride_sm", "stride_sg", "eps"])
def _quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    K,
    stride_xm,
    stride_xk,
    stride_qm,
    stride_sm,
    stride_sg,
    eps,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    UE8M0: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr,
    FP8_MIN_EXP_BIASED: tl.constexpr,
    FP8_NAN_BITS: tl.constexpr,
    HW_RNE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program quantizes a ``[BLOCK_M, GROUP]`` tile: BLOCK_M tokens, one K group."""
    pdl_enter(PDL)
    pid_m = tl.program_id(0)
    group = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    lane = tl.arange(0, GROUP_P2)
    cols = group * GROUP + lane
    row_ok = rows < M
    mask = row_ok[:, None] & ((lane < GROUP) & (cols < K))[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(
        x_ptr + rows64[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask, other=0.0
    )
    q, scale = fp8_group_quantize(x, eps, q_ptr.dtype.element_ty, UE8M0, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED,
                                  FP8_NAN_BITS, HW_RNE)
    tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :], q, mask=mask)
    tl.store(s_ptr + rows64 * stride_sm + group * stride_sg, scale, mask=row_ok)


class TritonQuantizer:
    """The quantization kernel bound for one activation width ``k``, fp8 dtype and scale layout.

    ``quantize(x)`` allocates the outputs and launches, nothing else: the checks, constants and
    PDL flag are worked out once, here (a layer makes one per route when it is prepared).
    ``x`` must be ``[M, k]`` in an activation dtype on ``device``: the caller checked it.
    ``rows`` (at least M) allocates outputs of that many rows and quantizes the first M, for a
    GEMM that needs M padded (the other rows are left unwritten; a GEMM's rows are independent).
    """

    __slots__ = (
        "_constexprs",
        "_device",
        "_dtype",
        "_eps",
        "_group_p2",
        "_group_size",
        "_groups",
        "_k",
        "_kernels",
        "_layout",
        "_pdl",
        "_replays",
    )

    def __init__(self, k: int, *, dtype: torch.dtype, layout: ScaleLayout, device: torch.device,
                 group_size: int = 128, eps: float = DEFAULT_EPS) -> None:
        check_quant_params(group_size, dtype, eps)
        group_p2 = triton.next_power_of_2(group_size)
        self._k, self._dtype, self._layout, self._device, self._eps, self._group_size = k, dtype, layout, device, eps, group_size
        self._groups = -(-k // group_size)
        self._group_p2 = group_p2
        self._pdl = pdl_possible(_quant_kernel, device)
        self._constexprs = {"GROUP": group_size, "GROUP_P2": group_p2, "UE8M0": layout.ue8m0,
                            "HW_RNE": hw_rne(_quant_kernel, device, dtype), **fp8_constexprs(dtype)}
        self._kernels: dict[tuple[int, bool], BoundKernel] = {}
        self._replays: Replays[Replay] = Replays(device)

    def __call__(self, x: torch.Tensor, rows: int | None = None,
                 record: list[Recorded] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_q, scale)``. The first call at an M (and ``rows``, activation dtype) launches through the
        bound kernel and, unless the caller records it (``record``), is replayed by later ones on a
        contiguous 16-byte-aligned ``x`` (:class:`~fp8select.kernels.triton_launch.Replay`)."""
        m = x.shape[0]
        rows = m if rows is None else rows
        k, groups, layout = self._k, self._groups, self._layout
        x_q = torch.empty(rows, k, dtype=self._dtype, device=self._device)  # (sizes as arguments: parsed faster)
        scale = empty_scale(rows, groups, layout, self._device)
        if m == 0 or groups == 0:
            return x_q, scale
        replays = self._replays
        replayable = record is None and replays.takes(x)
        if replayable:
            replay = replays.get((m, rows, x.dtype))
            if replay is not None:
                replay.run((x.data_ptr(), x_q.data_ptr(), scale.data_ptr()), replays.stream(replay.device))
                return x_q, scale
            record = replays.recording()
        block_m, num_warps = _program_shape(m, self._group_p2)
        pdl = self._pdl and m <= PDL_MAX_M
        kernel = self._kernels.get((block_m, pdl))
        if kernel is None:
            kernel = self._kernels[(block_m, pdl)] = BoundKernel(
                _quant_kernel, {**self._constexprs, "BLOCK_M": block_m, **({"PDL": True} if pdl else {})},
                {"num_warps": num_warps, **({"launch_pdl": True} if pdl else {})})
        stride_xm, stride_xk = x.stride()
        stride_sm, stride_sg = scale.stride()
        kernel((-(-m // block_m), groups, 1), (x, x_q, scale, m, k, stride_xm, stride_xk, k, stride_sm, stride_sg, self._eps),
               (x.dtype, x.data_ptr() % 16 == 0, int_class(stride_xm), int_class(stride_xk)), record)  # as tensor_class(x)
        if replayable and record is not None:
            replays.keep((m, rows, x.dtype), record, per_call=(x, x_q, scale), scratch=(), static=())
        return x_q, scale


def quantize_per_token_group_triton(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    dtype: torch.dtype = torch.float8_e4m3fn,
    layout: ScaleLayout = ROW_MAJOR,
    eps: float = DEFAULT_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`fp8select.kernels.quant.quantize_per_token_group`.

    Same arguments, results and numerics; the scale is written straight into ``layout``'s
    storage through its strides (no transpose pass), and ``x`` is read through its strides
    (no contiguous copy). Binds a :class:`TritonQuantizer` for this call only.
    """
    check_quant_args(x, group_size, dtype, eps)
    return TritonQuantizer(x.shape[1], dtype=dtype, layout=layout, device=x.device, group_size=group_size, eps=eps)(x)


def _program_shape(m: int, group_p2: int) -> tuple[int, int]:
    """(rows per program, warps) of the quantization kernel: ~2K elements per program (enough
    bytes in flight; a small M stays one program), four warps."""
    return min(1 << (m - 1).bit_length(), max(1, 2048 // group_p2)), 4  # (M >= 1: its next power of two)
