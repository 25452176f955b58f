"""The ``@triton.jit`` kernels of fp8select's Triton block-FP8 linear (launched by :mod:`.triton_gemm`).

``C[M, N] = dequant(A) @ dequant(B).T (+ bias)`` where A is fp8 ``[M, K]`` with one fp32 scale
per token per 128 K elements (or the bf16/fp16/fp32 activation, quantized in the kernel) and B
is the checkpoint's fp8 ``[N, K]`` with one fp32 scale per 128x128 (or 1x128) block. BLOCK_K
is fixed to the 128-element scale group, so every K step is one ``tl.dot`` on fp8 operands,
rescaled into an fp32 accumulator by ``a_scale[m, kb] * b_scale[n // bn, kb]``.

* ``_w8a8_block_kernel``: ``[BLOCK_M, BLOCK_N]`` output tiles (paths ``gemm`` and ``fused``).
* ``_w8a8_swap_kernel``: swap-AB for small M (paths ``decode`` and ``swap``). It computes the
  transposed tile ``[BLOCK_N, BLOCK_M] = W_tile @ Xq_tile^T``: the weight rows fill the MMA's
  64-row side (wgmma on Hopper needs M >= 64 per warpgroup; a 16-token tile in the normal
  orientation runs on the older mma.sync path) and the tokens its narrow side. With
  ``QUANT`` it quantizes the activation in its K loop, only ``next_pow2(M)`` rows, which are
  then repeated to the 16-row MMA tile: quantization work stops scaling with the padding.
* ``_w8a8_persistent_kernel``: the ``gemm`` path's tiles at large M, a few programs per SM each
  looping over tiles (no split-K, TMA only).
* ``_splitk_reduce_kernel``: the second pass of a two-pass split-K.

Split-K: each (tile, split) program stores its fp32 partial into a ``[SPLIT_K, M, N]``
workspace. Then either (``FIXUP=0``) ``_splitk_reduce_kernel`` sums the splits, adds the bias
and casts, or (``FIXUP=1``) the last program of the tile to arrive (an atomic counter per
tile) does that itself, saving a launch (~1.5-2 us inside a CUDA graph). Both sum in split
order, so they are bitwise equal and run-to-run reproducible (fp32 atomics into the output
would be neither, and need a zero-fill launch). The last program resets its counter, so the
counter buffer stays zero between launches (CUDA-graph safe).

Non-finite activations: the in-kernel quantization is :func:`.triton_quant.fp8_group_quantize`'s,
so a NaN or +-inf in a token's 128-element group makes that group's scale and values NaN, and
the token's output row NaN (as the quantization kernel feeding the prequantized paths does).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_pdl import pdl_enter
from .triton_quant import fp8_group_quantize


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
                last = SPLIT_K - 1
                for s in range(1, SPLIT_K, 4):
                    # Four partials' loads in flight at once (one per iteration waits out an L2 round
                    # trip per split, at the kernel's tail), added in split order all the same. Past
                    # the last split they re-read it (clamped: no mask) and are not added.
                    p1 = tl.load(ws_ptrs + s * mn, mask=mask, other=0.0, cache_modifier=".cg")
                    p2 = tl.load(ws_ptrs + tl.minimum(s + 1, last) * mn, mask=mask, other=0.0, cache_modifier=".cg")
                    p3 = tl.load(ws_ptrs + tl.minimum(s + 2, last) * mn, mask=mask, other=0.0, cache_modifier=".cg")
                    p4 = tl.load(ws_ptrs + tl.minimum(s + 3, last) * mn, mask=mask, other=0.0, cache_modifier=".cg")
                    total += p1
                    if s + 1 <= last:
                        total += p2
                    if s + 2 <= last:
                        total += p3
                    if s + 3 <= last:
                        total += p4
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
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of output tile ``tile`` in grouped order: GROUP_M row-tiles share each
    weight column-tile while it is in L2."""
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    return first_pid_m + (tile % pids_per_group) % group_rows, (tile % pids_per_group) // group_rows


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
    FP8_NAN_BITS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program computes a ``[BLOCK_M, BLOCK_N]`` tile over its split's share of K.

    With ``FUSED_QUANT`` ``a_ptr`` is the bf16/fp16 activation and each ``[BLOCK_M, 128]``
    tile is quantized in registers (the whole scale group is in the tile); otherwise ``a_ptr``
    is fp8 and ``as_ptr`` its scales. ``B_SCALE_SCALAR``: the tile's columns share one weight
    scale per K block (``SCALE_BN % BLOCK_N == 0``). ``USE_TMA``: ``a_ptr``/``b_ptr`` are host
    tensor descriptors (blocks ``[BLOCK_M, BLOCK_K]`` / ``[BLOCK_N, BLOCK_K]``) and the tiles
    come by the Hopper copy engine, zero-filled out of bounds (fp8 ``a`` only).
    """
    pdl_enter(PDL)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

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
            a, a_scale = fp8_group_quantize(a, eps, b.dtype, False, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED,
                                            FP8_NAN_BITS, HW_RNE)
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


@triton.jit(do_not_specialize=["M", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "stride_bias"])
def _w8a8_persistent_kernel(
    a_desc,
    as_ptr,
    b_desc,
    bs_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    PROGRAMS,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    stride_bias,
    stride_cm,
    stride_cn,
    SCALE_BN: tl.constexpr,
    B_SCALE_SCALAR: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,
):
    """The ``gemm`` path's tiles, persistent: ``PROGRAMS`` programs (a few per SM) take the output
    tiles in turn, in grouped order. The tile and K loops are flattened into one software-pipelined
    loop, so the next tile's first TMA loads are in flight during a tile's epilogue, where
    :func:`_w8a8_block_kernel` (one tile per program) refills its pipeline for every tile: a large
    share of the time when K has 4-16 blocks. fp8 activation and weight come through TMA
    descriptors (zero-filled out of bounds); no split-K. Each K step is the tile kernel's
    (same products, same order: bitwise equal results).
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, PROGRAMS, flatten=True, num_stages=STAGES):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        as_base = as_ptr + (offs_m % M).to(tl.int64) * stride_asm
        bs_base = _weight_scale_base(bs_ptr, pid_n, (offs_n % N).to(tl.int64), stride_bsn, SCALE_BN, BLOCK_N,
                                     B_SCALE_SCALAR)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, kb * BLOCK_K])
            b = tl.trans(b_desc.load([pid_n * BLOCK_N, kb * BLOCK_K]))
            a_scale = tl.load(as_base + kb * stride_ask)
            b_scale = tl.load(bs_base + kb * stride_bsk)
            if B_SCALE_SCALAR:
                acc += tl.dot(a, b) * (a_scale * b_scale)[:, None]
            else:
                acc += tl.dot(a, b) * (a_scale[:, None] * b_scale[None, :])
        _store_tile(acc, offs_m, offs_n, 0, tile, M, N, 1, c_ptr, stride_cm, stride_cn, c_ptr, c_ptr, bias_ptr,
                    stride_bias, False, False, HAS_BIAS)


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
    FP8_NAN_BITS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Swap-AB: one program computes ``acc[BLOCK_N, BLOCK_M] = W[n-tile] @ Xq[m-tile]^T`` over
    its split's share of K, then stores ``acc^T`` (``BLOCK_N`` weight rows on the MMA's wide
    side, ``BLOCK_M`` tokens on its narrow side).

    Only ``QUANT_ROWS`` activation rows (``next_pow2(M)`` when M fits one tile, else
    ``BLOCK_M``) are loaded and, with ``QUANT``, quantized (bf16/fp16/fp32 ``x``, numerics of
    :func:`.triton_quant.fp8_group_quantize`); they are repeated to ``BLOCK_M`` rows for the dot and the extra
    columns are dropped by the store. Without ``QUANT`` ``x_ptr`` is fp8 with scales
    ``xs_ptr``. The weight scale of the tile is one scalar per K block when
    ``B_SCALE_SCALAR`` (``SCALE_BN % BLOCK_N == 0``). ``USE_TMA``: ``w_ptr`` is a host tensor
    descriptor with ``[BLOCK_N, BLOCK_K]`` blocks (zero-filled out of bounds).
    """
    pdl_enter(PDL)
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
            q, a_scale = fp8_group_quantize(xa, eps, w.dtype, False, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED,
                                            FP8_NAN_BITS, HW_RNE)
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
    PDL: tl.constexpr = False,
):
    """Sum the ``[SPLIT_K, M, N]`` fp32 partials, add bias, cast into contiguous ``[M, N]``."""
    pdl_enter(PDL)
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


