"""Triton block-FP8 GEMM for DeepSeek-style linears: separate or fused activation quant, swap-AB
decode kernel, split-K.

``C[M, N] = dequant(A) @ dequant(B).T (+ bias)`` where A is fp8 ``[M, K]`` with one fp32 scale
per token per 128 K elements and B is the checkpoint's fp8 ``[N, K]`` with one fp32 scale per
128x128 (or 1x128) block. BLOCK_K is fixed to the 128-element scale group, so every K step
is one ``tl.dot`` on fp8 operands, rescaled into an fp32 accumulator by
``a_scale[m, kb] * b_scale[n // bn, kb]``.

Two kernels:

* ``_w8a8_block_kernel``: ``[BLOCK_M, BLOCK_N]`` output tiles (paths ``gemm`` and ``fused``).
* ``_w8a8_swap_kernel``: swap-AB for small M (paths ``decode`` and ``swap``). It computes the
  transposed tile ``[BLOCK_N, BLOCK_M] = W_tile @ Xq_tile^T``: the weight rows fill the MMA's
  64-row side (wgmma on Hopper needs M >= 64 per warpgroup; a 16-token tile in the normal
  orientation runs on the older mma.sync path) and the tokens its narrow side. With
  ``QUANT`` it quantizes the activation in its K loop, only ``next_pow2(M)`` rows, which are
  then repeated to the 16-row MMA tile: quantization work stops scaling with the padding.

Split-K: each (tile, split) program stores its fp32 partial into a ``[SPLIT_K, M, N]``
workspace. Then either (``FIXUP=0``) a second small kernel sums the splits, adds the bias and
casts, or (``FIXUP=1``) the last program of the tile to arrive (an atomic counter per tile)
does that itself, saving a launch (~1.5-2 us inside a CUDA graph, measured as the cost of
the quant launch in run 1). Both sum in split order, so they are bitwise equal and
run-to-run reproducible (fp32 atomics into the output would be neither, and need a
zero-fill launch). The counters live in a small cached int32 buffer per device and stream;
the last program resets its counter, so the buffer stays zero between launches (CUDA-graph
safe).

Launch configurations (schema, defaults, tuning search: :mod:`.triton_search`) come from
``triton_configs.json`` (package data, written by ``benchmarks/sweep_triton.py``), keyed by
section (``gemm``, ``fused``, ``decode``, ``swap``: per-path bests; ``linear``: the fastest
whole-op config with its ``path``), ``"N,K"`` and power-of-two M bucket; the table is read
lazily on first use and shapes missing from it get a heuristic config. :func:`linear` is the
single entry point for unquantized activations.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (triton >= 3.4); without them the TMA configs use pointer loads
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None  # type: ignore[assignment,misc]

from .quant import DEFAULT_EPS, M_MAJOR, check_activation, fp8_format
from .triton_quant import fp8_constexprs, fp8_group_scale, fp8_quantize, hw_rne, quantize_per_token_group_triton
from .triton_search import (
    CONFIG_KEYS,
    M_BUCKET_MAX,
    PATHS,
    PREQUANT_PATHS,
    SCALE_GROUP_K,
    SWAP_PATHS,
    heuristic_config,
    m_bucket,
    validate_config,
)

__all__ = [
    "CONFIG_KEYS",
    "M_BUCKET_MAX",
    "PATHS",
    "format_config_table",
    "get_config",
    "linear",
    "linear_config",
    "load_config_table",
    "m_bucket",
    "path_config",
    "validate_config",
    "w8a8_block_gemm",
    "w8a8_block_linear_fused",
]

SUPPORTED_BLOCK_SIZES = ((128, 128), (1, 128))
"""Weight scale blocks ``(bn, bk)`` the kernels handle."""

_TABLE_SECTIONS = ("gemm", "fused", "decode", "swap", "linear")
"""Per-path sections (configs of that path) and ``linear`` (best whole-op config, with path)."""


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _store_tile(
    acc,
    offs_m,
    offs_n,
    pid_k,
    tile,
    M,
    N,
    SPLIT_K,
    c_ptr,
    stride_cm,
    stride_cn,
    ws_ptr,
    cnt_ptr,
    bias_ptr,
    stride_bias,
    IS_SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Write the fp32 ``[BLOCK_M, BLOCK_N]`` tile ``acc`` (rows ``offs_m``, columns ``offs_n``).

    Unsplit: bias, cast, store into ``c``. Split: store the partial into split ``pid_k`` of the
    contiguous ``[SPLIT_K, M, N]`` workspace; with ``FIXUP`` the last of the tile's programs
    to arrive sums the partials in split order (as ``_splitk_reduce_kernel`` does), adds the
    bias, stores into ``c`` and resets the tile's counter.
    """
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    if IS_SPLIT:
        mn = M.to(tl.int64) * N
        ws_ptrs = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ws_ptrs + pid_k.to(tl.int64) * mn, acc, mask=mask)
        if FIXUP:
            # Every thread's partial store happens before the (single-thread) counter bump;
            # the acq_rel atomic publishes them at GPU scope and, for the last arrival,
            # makes the other programs' partials visible. ".cg" reads bypass L1.
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                total = tl.load(ws_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
                for s in range(1, SPLIT_K):
                    total += tl.load(ws_ptrs + s * mn, mask=mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(bias_ptr + (offs_n % N) * stride_bias).to(tl.float32)[None, :]
                tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + (offs_n % N) * stride_bias).to(tl.float32)[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_k_range(K, SPLIT_K, pid_k, BLOCK_K: tl.constexpr):
    """K blocks ``[kb_start, kb_end)`` of split ``pid_k``: its share of the ``cdiv(K, BLOCK_K)``."""
    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    kb_start = pid_k * per_split
    kb_end = tl.minimum(kb_start + per_split, k_blocks)
    return kb_start, kb_end


@triton.jit
def _weight_scale_base(bs_ptr, pid_n, cols, stride_bsn, SCALE_BN: tl.constexpr, BLOCK_N: tl.constexpr,
                       B_SCALE_SCALAR: tl.constexpr):
    """Weight-scale pointers of N tile ``pid_n`` at K block 0: one for the whole tile when
    ``B_SCALE_SCALAR``, else one per column ``cols``."""
    if B_SCALE_SCALAR:
        base = bs_ptr + (pid_n * BLOCK_N // SCALE_BN) * stride_bsn
    else:
        base = bs_ptr + (cols // SCALE_BN) * stride_bsn
    return base


@triton.jit
def _quantize_groups(x, eps, FP8_MAX: tl.constexpr, FP8_MANT_BITS: tl.constexpr, FP8_MIN_EXP_BIASED: tl.constexpr,
                     HW_RNE: tl.constexpr):
    """Quantize a ``[rows, 128]`` activation tile, one scale group per row (numerics of
    :func:`fp8_quantize`): the fp32 values ready for the cast to fp8, and the ``[rows]`` scales."""
    xf = x.to(tl.float32)
    scale = fp8_group_scale(tl.max(tl.abs(xf), axis=1), eps, FP8_MAX, False)
    q = fp8_quantize(xf, scale[:, None], FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED, HW_RNE)
    return q, scale


# Runtime values that change between calls of one layer (M, split count) or between scale
# layouts (scale strides) are not specialized on, so one compiled kernel serves them all.
_NOT_SPECIALIZED = ["M", "SPLIT_K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "stride_bias", "eps"]


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _w8a8_block_kernel(
    a_ptr,
    as_ptr,
    b_ptr,
    bs_ptr,
    bias_ptr,
    c_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    SPLIT_K,
    stride_am,
    stride_ak,
    stride_asm,
    stride_ask,
    stride_bn,
    stride_bk,
    stride_bsn,
    stride_bsk,
    stride_bias,
    stride_cm,
    stride_cn,
    eps,
    SCALE_BN: tl.constexpr,
    B_SCALE_SCALAR: tl.constexpr,
    USE_TMA: tl.constexpr,
    FUSED_QUANT: tl.constexpr,
    HW_RNE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr,
    FP8_MIN_EXP_BIASED: tl.constexpr,
):
    """One program computes a ``[BLOCK_M, BLOCK_N]`` tile over its split's share of K.

    With ``FUSED_QUANT`` ``a_ptr`` is the bf16/fp16 activation and each ``[BLOCK_M, 128]``
    tile is quantized in registers (the whole scale group is in the tile); otherwise ``a_ptr``
    is fp8 and ``as_ptr`` its scales. ``B_SCALE_SCALAR``: the tile's columns share one weight
    scale per K block (``SCALE_BN % BLOCK_N == 0``). ``USE_TMA``: ``a_ptr``/``b_ptr`` are host
    tensor descriptors (blocks ``[BLOCK_M, BLOCK_K]`` / ``[BLOCK_N, BLOCK_K]``) and the tiles
    come by the Hopper copy engine, zero-filled out of bounds (fp8 ``a`` only).
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped tile order: GROUP_M row-tiles share each B column-tile while it is in L2.
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Wrap out-of-range rows/columns onto valid ones: loads need no M/N masks, and the
    # duplicated results are dropped by the masked store.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)

    kb_start, kb_end = _split_k_range(K, SPLIT_K, pid_k, BLOCK_K)

    if not USE_TMA:
        a_ptrs = a_ptr + rows[:, None] * stride_am + (kb_start * BLOCK_K + offs_k)[None, :] * stride_ak
        b_ptrs = b_ptr + cols[None, :] * stride_bn + (kb_start * BLOCK_K + offs_k)[:, None] * stride_bk
    as_base = as_ptr + rows * stride_asm
    bs_base = _weight_scale_base(bs_ptr, pid_n, cols, stride_bsn, SCALE_BN, BLOCK_N, B_SCALE_SCALAR)

    # The scale loads feed the multiply after the dot, not the dot's operands, so Triton's
    # pipeliner leaves them alone: prefetch them one K step ahead by hand so their latency
    # overlaps a whole iteration. Index clamped, so no mask is needed.
    b_scale_next = tl.load(bs_base + kb_start * stride_bsk)
    if not FUSED_QUANT:
        a_scale_next = tl.load(as_base + kb_start * stride_ask)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        kb_next = tl.minimum(kb + 1, kb_end - 1)
        b_scale = b_scale_next
        b_scale_next = tl.load(bs_base + kb_next * stride_bsk)
        if USE_TMA:
            # One bulk copy per tile instead of 16-byte cp.async per thread: frees the issue
            # slots and address registers the promotion FMAs compete for at large M.
            a = a_ptr.load([pid_m * BLOCK_M, kb * BLOCK_K])
            b = tl.trans(b_ptr.load([pid_n * BLOCK_N, kb * BLOCK_K]))
        elif EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - kb * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if FUSED_QUANT:
            a, a_scale = _quantize_groups(a, eps, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED, HW_RNE)
            a = a.to(b.dtype)
        else:
            a_scale = a_scale_next
            a_scale_next = tl.load(as_base + kb_next * stride_ask)
        if B_SCALE_SCALAR:
            # One multiply-add per accumulator element per K step instead of two (the
            # [BLOCK_M] x scalar product is formed once): the promotion of each K block's
            # MMA result is what the tensor cores wait on at large M.
            acc += tl.dot(a, b) * (a_scale * b_scale)[:, None]
        else:
            acc += tl.dot(a, b) * (a_scale[:, None] * b_scale[None, :])
        if not USE_TMA:
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk

    _store_tile(acc, offs_m, offs_n, pid_k, pid, M, N, SPLIT_K, c_ptr, stride_cm, stride_cn, ws_ptr, cnt_ptr,
                bias_ptr, stride_bias, IS_SPLIT, FIXUP, HAS_BIAS)


@triton.jit
def _repeat_rows(t, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    """``[ROWS, C] -> [BLOCK_M, C]`` with row ``j`` = ``t[j % ROWS]`` (ROWS divides BLOCK_M)."""
    if ROWS == BLOCK_M:
        out = t
    elif ROWS == 1:
        out = tl.broadcast_to(t, (BLOCK_M, t.shape[1]))
    else:
        out = tl.reshape(tl.broadcast_to(t[None, :, :], (BLOCK_M // ROWS, ROWS, t.shape[1])), (BLOCK_M, t.shape[1]))
    return out


@triton.jit
def _repeat_vec(v, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    """``[ROWS] -> [BLOCK_M]`` with element ``j`` = ``v[j % ROWS]``."""
    if ROWS == BLOCK_M:
        out = v
    elif ROWS == 1:
        out = tl.broadcast_to(v, (BLOCK_M,))
    else:
        out = tl.reshape(tl.broadcast_to(v[None, :], (BLOCK_M // ROWS, ROWS)), (BLOCK_M,))
    return out


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _w8a8_swap_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_scale_ptr,
    bias_ptr,
    c_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    SPLIT_K,
    stride_xm,
    stride_xk,
    stride_asm,
    stride_ask,
    stride_wn,
    stride_wk,
    stride_bsn,
    stride_bsk,
    stride_bias,
    stride_cm,
    stride_cn,
    eps,
    SCALE_BN: tl.constexpr,
    B_SCALE_SCALAR: tl.constexpr,
    USE_TMA: tl.constexpr,
    QUANT: tl.constexpr,
    QUANT_ROWS: tl.constexpr,
    HW_RNE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr,
    FP8_MIN_EXP_BIASED: tl.constexpr,
):
    """Swap-AB: one program computes ``acc[BLOCK_N, BLOCK_M] = W[n-tile] @ Xq[m-tile]^T`` over
    its split's share of K, then stores ``acc^T`` (``BLOCK_N`` weight rows on the MMA's wide
    side, ``BLOCK_M`` tokens on its narrow side).

    Only ``QUANT_ROWS`` activation rows (``next_pow2(M)`` when M fits one tile, else
    ``BLOCK_M``) are loaded and, with ``QUANT``, quantized (bf16/fp16/fp32 ``x``, numerics of
    :func:`fp8_quantize`); they are repeated to ``BLOCK_M`` rows for the dot and the extra
    columns are dropped by the store. Without ``QUANT`` ``x_ptr`` is fp8 with scales
    ``xs_ptr``. The weight scale of the tile is one scalar per K block when
    ``B_SCALE_SCALAR`` (``SCALE_BN % BLOCK_N == 0``). ``USE_TMA``: ``w_ptr`` is a host tensor
    descriptor with ``[BLOCK_N, BLOCK_K]`` blocks (zero-filled out of bounds).
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_n = pid % num_pid_n
    pid_m = pid // num_pid_n

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    cols = (offs_n % N).to(tl.int64)
    # Rows beyond M wrap onto valid rows (no masks); their results are never stored.
    xrows = ((pid_m * BLOCK_M + tl.arange(0, QUANT_ROWS)) % M).to(tl.int64)

    kb_start, kb_end = _split_k_range(K, SPLIT_K, pid_k, BLOCK_K)

    x_ptrs = x_ptr + xrows[:, None] * stride_xm + (kb_start * BLOCK_K + offs_k)[None, :] * stride_xk
    if not USE_TMA:
        w_ptrs = w_ptr + cols[:, None] * stride_wn + (kb_start * BLOCK_K + offs_k)[None, :] * stride_wk
    as_base = xs_ptr + xrows * stride_asm
    bs_base = _weight_scale_base(ws_scale_ptr, pid_n, cols, stride_bsn, SCALE_BN, BLOCK_N, B_SCALE_SCALAR)

    # Scale loads prefetched one K step ahead (the pipeliner only prefetches dot operands);
    # at decode each step is short, so an exposed L2 round trip per step would be a large
    # share of it.
    b_scale_next = tl.load(bs_base + kb_start * stride_bsk)
    if not QUANT:
        a_scale_next = tl.load(as_base + kb_start * stride_ask)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        kb_next = tl.minimum(kb + 1, kb_end - 1)
        b_scale = b_scale_next
        b_scale_next = tl.load(bs_base + kb_next * stride_bsk)
        # At decode (one M tile) each weight byte is read by one program only: let it leave
        # L2 first; the activation is re-read by every N tile, keep it.
        if EVEN_K:
            xa = tl.load(x_ptrs, eviction_policy="evict_last")
        else:
            xa = tl.load(x_ptrs, mask=offs_k[None, :] < K - kb * BLOCK_K, other=0.0, eviction_policy="evict_last")
        if USE_TMA:
            w = w_ptr.load([pid_n * BLOCK_N, kb * BLOCK_K])
        elif EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            w = tl.load(w_ptrs, mask=offs_k[None, :] < K - kb * BLOCK_K, other=0.0, eviction_policy="evict_first")
        if QUANT:
            q, a_scale = _quantize_groups(xa, eps, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED, HW_RNE)
            q = q.to(w.dtype)
        else:
            q = xa
            a_scale = a_scale_next
            a_scale_next = tl.load(as_base + kb_next * stride_ask)
        q = _repeat_rows(q, QUANT_ROWS, BLOCK_M)
        a_scale = _repeat_vec(a_scale, QUANT_ROWS, BLOCK_M)
        d = tl.dot(w, tl.trans(q))
        if B_SCALE_SCALAR:
            acc += d * (a_scale * b_scale)[None, :]
        else:
            acc += d * (b_scale[:, None] * a_scale[None, :])
        if not USE_TMA:
            w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K * stride_xk

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    _store_tile(tl.trans(acc), offs_m, offs_n, pid_k, pid, M, N, SPLIT_K, c_ptr, stride_cm, stride_cn, ws_ptr,
                cnt_ptr, bias_ptr, stride_bias, IS_SPLIT, FIXUP, HAS_BIAS)


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr,
    bias_ptr,
    c_ptr,
    MN,
    N,
    stride_bias,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Sum the ``[SPLIT_K, M, N]`` fp32 partials, add bias, cast into contiguous ``[M, N]``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    ws_ptrs = ws_ptr + offs
    acc = tl.load(ws_ptrs, mask=mask, other=0.0)
    for _ in tl.static_range(1, SPLIT_K):
        ws_ptrs += MN  # pointer steps stay 64-bit even when SPLIT_K * M * N >= 2**31
        acc += tl.load(ws_ptrs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + (offs % N) * stride_bias, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def _heuristic_config(n: int, k: int, m: int) -> dict[str, int]:
    """Launch keys of the gemm path's default config (see :func:`.triton_search.heuristic_config`)."""
    cfg = heuristic_config(n, k, m, "gemm")
    return {key: cfg[key] for key in CONFIG_KEYS}


def _validate_table(table: Any, origin: str) -> dict[str, Any]:
    """Check the table's shape (sections -> "N,K" -> bucket -> config); return it.

    A per-path section's configs may name their path (it must be the section's); every
    ``linear`` config must name one.
    """
    if not isinstance(table, dict):
        raise ValueError(f"config table {origin} must be a JSON object, got {type(table).__name__}")
    for section in _TABLE_SECTIONS:
        shapes = table.get(section, {})
        if not isinstance(shapes, dict):
            raise ValueError(f"config table {origin}: {section!r} must map 'N,K' to buckets")
        for shape, buckets in shapes.items():
            parts = shape.split(",")
            if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
                raise ValueError(f"config table {origin}: key {shape!r} in {section!r} is not 'N,K'")
            if not isinstance(buckets, dict):
                raise ValueError(f"config table {origin}: {section}[{shape!r}] must map M buckets")
            for bucket, cfg in buckets.items():
                where = f"config table {origin}: {section}[{shape!r}][{bucket!r}]"
                if not bucket.isdigit() or m_bucket(int(bucket)) != int(bucket):
                    raise ValueError(
                        f"config table {origin}: bucket {bucket!r} of {section}[{shape!r}] "
                        "is not a power of two <= 8192"
                    )
                try:
                    valid = validate_config(cfg)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from exc
                if section == "linear" and "path" not in valid:
                    raise ValueError(f"{where}: a 'linear' config must name its 'path' (one of {PATHS})")
                if section != "linear" and valid.get("path", section) != section:
                    raise ValueError(f"{where}: path {valid['path']!r} in section {section!r}")
    return table


@functools.lru_cache(maxsize=8)
def _cached_table(path: str | None) -> dict[str, Any]:
    """Parse and validate a table once per path (``None``: the packaged table)."""
    if path is None:
        text = resources.files(__package__).joinpath("triton_configs.json").read_text(encoding="utf-8")
        origin = "triton_configs.json (package data)"
    else:
        text = Path(path).read_text(encoding="utf-8")
        origin = path
    return _validate_table(json.loads(text), origin)


def load_config_table(path: str | Path | None = None) -> dict[str, Any]:
    """Load a config table (default: the packaged ``triton_configs.json``).

    Parsed once per path and cached; each call returns a private copy. Format:
    ``{"gemm": {"N,K": {"<m bucket>": config}}, "fused": ..., "decode": ..., "swap": ...,
    "linear": ..., ...metadata}``; every section is optional.
    """
    key = None if path is None else str(Path(path).resolve())
    return copy.deepcopy(_cached_table(key))


def _nearest_bucket(buckets: dict[str, Any], m: int) -> str:
    """Key of the bucket nearest to ``m_bucket(m)`` in log2 distance (ties: the smaller)."""
    target = math.log2(m_bucket(m))
    return min(buckets, key=lambda b: (abs(math.log2(int(b)) - target), int(b)))


def _lookup(table: dict[str, Any], section: str, n: int, k: int, m: int) -> dict[str, Any] | None:
    buckets = table.get(section, {}).get(f"{n},{k}")
    if not buckets:
        return None
    return validate_config(buckets[_nearest_bucket(buckets, m)])


def get_config(n: int, k: int, m: int, *, fused: bool, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """Launch config of the ``[BLOCK_M, BLOCK_N]`` kernel for an ``[m, k] x [n, k]^T`` problem.

    Looks up ``table`` (default: the packaged table) under ``"fused"`` or ``"gemm"``, then
    ``"N,K"``, then the nearest measured M bucket, so a sweep over a few buckets covers
    all M. A fused lookup falls back to the ``"gemm"`` entry of the same shape (same tile
    trade-offs), and a shape in neither gets the heuristic. Returns a new dict.
    """
    if table is None:
        table = _cached_table(None)
    for section in ("fused", "gemm") if fused else ("gemm",):
        found = _lookup(table, section, n, k, m)
        if found is not None:
            found.pop("path", None)
            return found
    return _heuristic_config(n, k, m)


def _complete(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """``cfg`` with ``path`` and the path's default ``FIXUP`` filled in."""
    out = {**cfg, "path": path}
    out.setdefault("FIXUP", 1 if path in SWAP_PATHS else 0)
    return validate_config(out)


def path_config(n: int, k: int, m: int, path: str, *, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """Full config (with ``path`` and ``FIXUP``) of one path: its table section (gemm/fused as in
    :func:`get_config`), else the heuristic."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if table is None:
        table = _cached_table(None)
    if path in ("gemm", "fused"):
        return _complete(get_config(n, k, m, fused=path == "fused", table=table), path)
    found = _lookup(table, path, n, k, m)
    return _complete(found, path) if found is not None else heuristic_config(n, k, m, path)


def linear_config(n: int, k: int, m: int, *, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The default whole-op config of :func:`linear`: the table's ``linear`` entry (the path
    measured fastest for this shape and the nearest M bucket), else the gemm path's config."""
    if table is None:
        table = _cached_table(None)
    found = _lookup(table, "linear", n, k, m)
    if found is not None:
        return _complete(found, found["path"])
    return path_config(n, k, m, "gemm", table=table)


def _resolve(config: dict[str, Any] | None, n: int, k: int, m: int, default_path: str | None) -> dict[str, Any]:
    """The default config (``linear_config`` when ``default_path`` is None, else that path's),
    or the path named in ``config``, overridden key by key by ``config`` (which may be partial)."""
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"config must be a dict or None, got {type(config).__name__}")
    path = (config or {}).get("path", default_path)
    if path is not None and path not in PATHS:
        raise ValueError(f"config['path'] must be one of {PATHS}, got {path!r}")
    base = linear_config(n, k, m) if path is None else path_config(n, k, m, path)
    if not config:
        return base
    merged = {**base, **config}
    return _complete(validate_config(merged), merged["path"])


# --------------------------------------------------------------------------------------------
# Host wrappers
# --------------------------------------------------------------------------------------------

_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_weight(b: torch.Tensor, b_scale: torch.Tensor, block_size: tuple[int, int], k: int) -> int:
    """Validate weight, weight scale and block size against K; return the scale's row block."""
    block = tuple(block_size)
    if block not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {block}")
    if b.dim() != 2 or b.shape[1] != k:
        raise ValueError(f"b must be [N, K] with K={k}, got shape {tuple(b.shape)}")
    fp8_format(b.dtype)
    scale_bn = block[0]
    want = (triton.cdiv(b.shape[0], scale_bn), triton.cdiv(k, SCALE_GROUP_K))
    if tuple(b_scale.shape) != want or b_scale.dtype != torch.float32:
        raise ValueError(
            f"b_scale must be float32 of shape {want} for block {block}, "
            f"got {b_scale.dtype} {tuple(b_scale.shape)}"
        )
    return scale_bn


def _check_common(a: torch.Tensor, b: torch.Tensor, tensors: dict[str, torch.Tensor | None],
                  out_dtype: torch.dtype, bias: torch.Tensor | None) -> None:
    """Checks shared by the entry points: output dtype, bias shape, one device."""
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    n = b.shape[0]
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must be [N] with N={n}, got shape {tuple(bias.shape)}")
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}


def _fixup_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters (at least ``count``) for ``FIXUP`` split-K on ``device``.

    One buffer per device and stream, so launches that may run concurrently never share
    counters; launches on one stream run in order, and each leaves its counters at zero. A
    first call inside CUDA-graph capture allocates (and zero-fills) inside the graph, which
    is correct, merely a memset node more.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(1024, triton.next_power_of_2(count)), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def _tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D fp8 tensor can back a TMA descriptor: contiguous rows, 16-byte aligned
    base and row stride, at least one row and column (else the pointer loads are used)."""
    return (
        TensorDescriptor is not None
        and t.stride(1) == 1
        and t.data_ptr() % 16 == 0
        and (t.stride(0) * t.element_size()) % 16 == 0
        and min(t.shape) > 0
    )


_REPEAT_RESHAPE_OK = [True]
"""Cleared when the swap kernel's row repetition for 1 < QUANT_ROWS < BLOCK_M failed to compile."""


def _split_count(cfg: dict[str, Any], k: int) -> int:
    """SPLIT_K actually launched: at most the K-block count, re-balanced so no split is empty."""
    k_blocks = triton.cdiv(k, SCALE_GROUP_K)
    split = min(cfg["SPLIT_K"], k_blocks)
    if split > 1:
        split = triton.cdiv(k_blocks, triton.cdiv(k_blocks, split))
    return split


def _launch(
    a: torch.Tensor,
    a_scale: torch.Tensor | None,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    scale_bn: int,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: dict[str, Any],
) -> None:
    """Launch the kernel of ``cfg["path"]`` (plus the split-K reduction when ``SPLIT_K > 1``
    and not ``FIXUP``) writing ``out``. ``a_scale`` is None when the kernel quantizes ``a``."""
    m, k = a.shape
    n = b.shape[0]
    path = cfg.get("path", "gemm")
    swap = path in SWAP_PATHS
    quant = a_scale is None
    split = _split_count(cfg, k)
    fixup = bool(cfg.get("FIXUP", 0)) and split > 1
    grid0 = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
    ws = torch.empty((split, m, n), dtype=torch.float32, device=out.device) if split > 1 else out
    counters = _fixup_counters(out.device, grid0) if fixup else out
    scale = a_scale if a_scale is not None else b_scale  # unused placeholder when quantizing
    use_tma = bool(cfg.get("TMA", 0)) and _tma_ok(b) and (swap or (not quant and _tma_ok(a)))
    a_arg: Any = a
    b_arg: Any = b
    if use_tma:
        b_arg = TensorDescriptor(b, list(b.shape), [b.stride(0), 1], [cfg["BLOCK_N"], SCALE_GROUP_K])
        if not swap:
            a_arg = TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [cfg["BLOCK_M"], SCALE_GROUP_K])
    common = dict(
        SCALE_BN=scale_bn,
        B_SCALE_SCALAR=scale_bn % cfg["BLOCK_N"] == 0,
        USE_TMA=use_tma,
        HW_RNE=hw_rne(_w8a8_swap_kernel if swap else _w8a8_block_kernel, out.device, b.dtype),
        IS_SPLIT=split > 1,
        FIXUP=fixup,
        HAS_BIAS=bias is not None,
        EVEN_K=k % SCALE_GROUP_K == 0,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=SCALE_GROUP_K,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **fp8_constexprs(b.dtype),
    )
    args = (
        a_arg,
        scale,
        b_arg,
        b_scale,
        bias if bias is not None else b_scale,
        out,
        ws,
        counters,
        m,
        n,
        k,
        split,
        a.stride(0),
        a.stride(1),
        scale.stride(0) if a_scale is not None else 0,
        scale.stride(1) if a_scale is not None else 0,
        b.stride(0),
        b.stride(1),
        b_scale.stride(0),
        b_scale.stride(1),
        bias.stride(0) if bias is not None else 0,
        out.stride(0),
        out.stride(1),
        DEFAULT_EPS,
    )
    if swap:
        # Activation rows the kernel loads per tile: all of M, rounded up to a power of two,
        # when M fits one tile (decode), else the whole tile.
        quant_rows = min(triton.next_power_of_2(m), cfg["BLOCK_M"])
        if quant_rows not in (1, cfg["BLOCK_M"]) and not _REPEAT_RESHAPE_OK[0]:
            quant_rows = cfg["BLOCK_M"]
        try:
            _w8a8_swap_kernel[(grid0, split)](*args, QUANT=quant, QUANT_ROWS=quant_rows, **common)
        except Exception:
            # 1 < QUANT_ROWS < BLOCK_M repeats rows with a 3-D broadcast + reshape; should a
            # Triton version fail to compile that, quantize the whole (wrapped) tile instead:
            # same results, more quantization work. Compilation fails before any launch.
            if quant_rows in (1, cfg["BLOCK_M"]):
                raise
            _REPEAT_RESHAPE_OK[0] = False
            _w8a8_swap_kernel[(grid0, split)](*args, QUANT=quant, QUANT_ROWS=cfg["BLOCK_M"], **common)
    else:
        _w8a8_block_kernel[(grid0, split)](*args, FUSED_QUANT=quant, GROUP_M=cfg["GROUP_M"], **common)
    if split > 1 and not fixup:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](
            ws,
            bias if bias is not None else ws,
            out,
            m * n,
            n,
            bias.stride(0) if bias is not None else 0,
            SPLIT_K=split,
            HAS_BIAS=bias is not None,
            BLOCK=block,
            num_warps=4,
        )


def _empty_k(m: int, n: int, bias: torch.Tensor | None, out_dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Result for K == 0: the bias (or zeros) broadcast over M."""
    out = torch.zeros((m, n), dtype=torch.float32, device=device)
    if bias is not None:
        out += bias.to(torch.float32)
    return out.to(out_dtype)


def w8a8_block_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: tuple[int, int],
    *,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Block-scaled FP8 GEMM ``dequant(a) @ dequant(b).T + bias`` in ``out_dtype``.

    Args:
        a: ``[M, K]`` fp8 activation (same fp8 dtype as ``b``).
        a_scale: ``[M, ceil(K/128)]`` fp32 per-token-group scales, any strides (row-major
            and M-major both work; M-major reads coalesced).
        b: ``[N, K]`` fp8 weight in checkpoint layout.
        b_scale: ``[ceil(N/bn), ceil(K/128)]`` fp32 weight scales, any strides.
        block_size: weight scale block ``(bn, bk)``: ``(128, 128)`` or ``(1, 128)``.
        out_dtype: bf16, fp16 or fp32.
        bias: optional ``[N]``, added in fp32 before the cast.
        config: launch config (keys :data:`CONFIG_KEYS`, optional ``path``/``FIXUP``; may be
            partial: missing keys come from the path's default). Paths ``decode``/``swap`` run
            the swap-AB kernel, ``gemm``/``fused`` the tile kernel (the activation is already
            quantized either way); ``None`` looks up the gemm path's config.

    Returns:
        ``[M, N]`` contiguous ``out_dtype``. M = 0 returns an empty tensor without a launch.
    """
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D [M, K], got shape {tuple(a.shape)}")
    m, k = a.shape
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same fp8 dtype, got {a.dtype} and {b.dtype}")
    scale_bn = _check_weight(b, b_scale, block_size, k)
    want = (m, triton.cdiv(k, SCALE_GROUP_K))
    if tuple(a_scale.shape) != want or a_scale.dtype != torch.float32:
        raise ValueError(f"a_scale must be float32 of shape {want}, got {a_scale.dtype} {tuple(a_scale.shape)}")
    _check_common(a, b, {"a": a, "a_scale": a_scale, "b": b, "b_scale": b_scale, "bias": bias}, out_dtype, bias)
    n = b.shape[0]
    cfg = _resolve(config, n, k, m, "gemm")
    if cfg["path"] == "fused":
        cfg["path"] = "gemm"  # same kernel, activation already quantized
    elif cfg["path"] == "decode":
        cfg["path"] = "swap"
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=a.device)
    if k == 0:
        return _empty_k(m, n, bias, out_dtype, a.device)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    _launch(a, a_scale, b, b_scale, scale_bn, bias, out, cfg)
    return out


def linear(
    x: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: tuple[int, int],
    *,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Block FP8 linear ``x @ dequant(b).T + bias`` on an unquantized activation.

    ``x`` is quantized per token and 128-element group with the numerics of
    :func:`fp8select.kernels.quant.quantize_per_token_group` (default eps, fp8 dtype of ``b``)
    by the path ``config["path"]`` names (see :mod:`.triton_search`): ``gemm`` (quantization
    kernel + tile GEMM), ``fused`` (tile GEMM quantizing in its K loop), ``decode`` (swap-AB
    GEMM quantizing in its K loop, one launch) or ``swap`` (quantization kernel + swap-AB
    GEMM). The fused paths quantize exactly as the separate kernel does, so every path
    computes the same product up to fp32 summation order.

    Args:
        x: ``[M, K]`` bf16/fp16/fp32, any strides.
        b, b_scale, block_size, out_dtype, bias: as in :func:`w8a8_block_gemm`.
        config: a config (optionally partial; ``path`` picks the kernel, the other keys
            override that path's defaults). ``None``: :func:`linear_config` (the table's
            fastest measured path for this shape and M, else ``gemm``).

    Returns:
        ``[M, N]`` contiguous ``out_dtype``.
    """
    check_activation(x)
    m, k = x.shape
    scale_bn = _check_weight(b, b_scale, block_size, k)
    _check_common(x, b, {"x": x, "b": b, "b_scale": b_scale, "bias": bias}, out_dtype, bias)
    n = b.shape[0]
    cfg = _resolve(config, n, k, m, None)
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=x.device)
    if k == 0:
        return _empty_k(m, n, bias, out_dtype, x.device)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if cfg["path"] in PREQUANT_PATHS:
        # M-major scales: the GEMM reads one K block's scales of consecutive tokens as one
        # contiguous run instead of BLOCK_M scattered words.
        xq, xs = quantize_per_token_group_triton(x, SCALE_GROUP_K, dtype=b.dtype, layout=M_MAJOR)
        _launch(xq, xs, b, b_scale, scale_bn, bias, out, cfg)
    else:
        _launch(x, None, b, b_scale, scale_bn, bias, out, cfg)
    return out


def w8a8_block_linear_fused(
    x: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: tuple[int, int],
    *,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Block FP8 linear quantizing the activation inside the GEMM (the ``fused`` path, or
    ``decode`` when ``config`` names it); see :func:`linear`.

    Each ``[BLOCK_M, 128]`` tile of ``x`` is quantized in registers with the numerics of
    :func:`fp8select.kernels.quant.quantize_per_token_group`, so the result equals
    quantize-then-:func:`w8a8_block_gemm` with the same config bit for bit.
    """
    check_activation(x)
    path = (config or {}).get("path", "fused")
    if path not in ("fused", "decode"):
        raise ValueError(f"w8a8_block_linear_fused runs the fused or decode path, got {path!r}")
    return linear(x, b, b_scale, block_size, out_dtype=out_dtype, bias=bias, config={**(config or {}), "path": path})


def format_config_table(table: dict[str, Any]) -> str:
    """Serialize a config table as JSON with one config per line (diff-friendly)."""
    _validate_table(table, "to format")
    lines = ["{"]
    meta = [key for key in table if key not in _TABLE_SECTIONS]
    items: list[str] = [f"  {json.dumps(key)}: {json.dumps(table[key])}" for key in meta]
    for section in _TABLE_SECTIONS:
        if section not in table:
            continue
        shapes = table[section]
        body = []
        for shape in sorted(shapes, key=lambda s: tuple(int(p) for p in s.split(","))):
            buckets = shapes[shape]
            rows = [
                f"      {json.dumps(b)}: {json.dumps(validate_config(buckets[b]))}"
                for b in sorted(buckets, key=int)
            ]
            body.append(f"    {json.dumps(shape)}: {{\n" + ",\n".join(rows) + "\n    }")
        items.append(f"  {json.dumps(section)}: " + ("{\n" + ",\n".join(body) + "\n  }" if body else "{}"))
    lines.append(",\n".join(items))
    lines.append("}")
    return "\n".join(lines) + "\n"
