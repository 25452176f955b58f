"""A Hopper block-FP8 GEMM in Gluon (Triton's explicit-layout language) whose per-block scaling
overlaps the tensor cores.

``C[M, N] = dequant(A) @ dequant(B).T (+ bias)``, A fp8 ``[M, K]`` with one fp32 scale per token
per 128 K elements, B fp8 ``[N, K]`` with one scale per 128x128 (or 1x128) block: the operands
of :func:`.triton_gemm.w8a8_block_gemm`, same products in the same order per output element.

Why a second kernel: each K block's MMA result has to be scaled before it is added to the
accumulator, and the ``tl.dot`` kernels wait for every ``wgmma`` before that scaling (the sm90
PTX has ``wgmma.wait_group 0`` after each block), so the tensor cores idle while the CUDA cores
scale. Here each K block's ``wgmma`` is issued into a fresh register accumulator and left in
flight while the previous block's result is waited for (``wait_group 1``), scaled and added:
the scaling of block k-1 runs under the MMA of block k. Operands come by TMA into a ring of
``STAGES`` shared-memory slots; the slot of block k-1 is refilled (block k+STAGES-1) as soon as
its MMA is known complete. The output tile leaves through shared memory by a TMA store.

The MoE experts' grouped launches (:func:`launch_grouped`, :func:`launch_gate_up`) run the same K loop
(:func:`_tile_acc`) on each row block's expert weights; 64-row tiles may take 8 warps, a warpgroup to each
half of the columns (256 of the down GEMM, or the gate's and the up's 128 of the fused gate-up, whose
epilogue quantizes ``silu(gate) * up``).

Hopper only (``wgmma``), CUDA only, no interpreter: the ``wgmma`` path of :mod:`.triton_gemm` launches
it where :func:`.triton_device.wgmma_runs`, and the tile kernel with the same tiles elsewhere.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .moe_triton_kernels import silu_mul
from .triton_config import SCALE_GROUP_K, TritonConfig
from .triton_gemm_kernels import _grouped_tile
from .triton_quant import fp8_group_quantize

# Names that changed between Triton 3.6 and 3.9 (the TMA copies' old names raise in 3.9).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

GATE_UP_WARPS = 8
"""Warps of a fused gate-up program: a warpgroup to the gate's and one to the up's 128 columns of its 64 rows."""

_GL_DTYPES = {
    torch.float8_e4m3fn: gl.float8e4nv,
    torch.float8_e5m2: gl.float8e5,
    torch.bfloat16: gl.bfloat16,
    torch.float16: gl.float16,
    torch.float32: gl.float32,
}


@gluon.jit
def _promote(acc, d, a_scale, b_scale, B_SCALE_SCALAR: gl.constexpr):
    """``acc + d * a_scale[m] * b_scale``: ``B_SCALE_SCALAR``, one weight scale for the tile or one per row
    (a thread's warpgroup's); else one per column."""
    if B_SCALE_SCALAR:
        acc += d * (a_scale * b_scale)[:, None]
    else:
        acc += d * (a_scale[:, None] * b_scale[None, :])
    return acc


@gluon.jit
def _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, slot, kb, off_m, off_n, up_off, pred, GATE_UP: gl.constexpr):
    """K block ``kb`` of the tile's A and B rows into ring slot ``slot`` by TMA, arriving on its barrier
    (nothing when ``pred`` is false: past the last block). ``GATE_UP``: the slot's B holds two blocks of
    rows, ``off_n``'s (gate) then ``off_n + up_off``'s (up)."""
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    B_BLOCKS: gl.constexpr = 2 if GATE_UP else 1
    mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + B_BLOCKS * b_desc.block_type.nbytes, pred=pred)
    _tma_load(a_desc, [off_m, kb * BLOCK_K], ready.index(slot), a_bufs.index(slot), pred)
    if GATE_UP:
        _tma_load(b_desc, [off_n, kb * BLOCK_K], ready.index(slot), b_bufs.index(slot).slice(0, BLOCK_N), pred)
        _tma_load(b_desc, [off_n + up_off, kb * BLOCK_K], ready.index(slot),
                  b_bufs.index(slot).slice(BLOCK_N, BLOCK_N), pred)
    else:
        _tma_load(b_desc, [off_n, kb * BLOCK_K], ready.index(slot), b_bufs.index(slot), pred)


@gluon.jit
def _step(a_desc, b_desc, a_bufs, b_bufs, ready, prev, spent, acc, a_scale, b_scale, as_ptrs, bs_ptrs, kb, k_blocks,
          off_m, off_n, up_off, stride_ask, stride_bsk, B_SCALE_SCALAR: gl.constexpr, STAGES: gl.constexpr,
          num_warps: gl.constexpr, GATE_UP: gl.constexpr):
    """K block ``kb``: issue its MMA, then wait for block kb-1's (``prev``), refill that block's
    slot with block kb+STAGES-1 and add ``prev`` scaled by block kb-1's scales (``a_scale``,
    ``b_scale``) into ``acc`` while block kb's MMA runs. Returns block kb's pending result,
    block kb-1's (spent) result, the accumulator and block kb's scales.

    The MMA writes into ``spent``, block kb-2's result, already added (``use_acc=False``: its
    values are not read). Handing it in ties the MMA's registers to it, so block kb-2's scaling
    has to come before this MMA: the two pending results then alternate between two register
    sets, where a fresh accumulator let the compiler sink that scaling past the MMA into a
    third set and copy it back at the loop's end, an accumulator copy that makes ptxas wait
    for the MMA in flight."""
    slot = kb % STAGES
    mbarrier.wait(ready.index(slot), (kb // STAGES) & 1)
    cur = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), spent, use_acc=False, is_async=True)
    a_scale_next = gl.load(as_ptrs + kb * stride_ask)
    b_scale_next = gl.load(bs_ptrs + kb * stride_bsk)
    prev = warpgroup_mma_wait(num_outstanding=1, deps=(prev, ))
    if num_warps > 4:
        _cta_barrier()  # every warpgroup's MMA kb-1 is done before its slot is overwritten
    refill = kb + STAGES - 1
    _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, (kb - 1) % STAGES, refill, off_m, off_n, up_off, refill < k_blocks,
                GATE_UP)
    acc = _promote(acc, prev, a_scale, b_scale, B_SCALE_SCALAR)
    # Pin the scaling here: without an ordered use, LLVM sinks it below the next MMA's issue,
    # which then needs a third register set and copies back (and ptxas waits on those).
    acc = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=gl.float32, is_pure=False, pack=1)
    return cur, prev, acc, a_scale_next, b_scale_next


@gluon.jit
def _store_tile(desc, tile, off_m, off_n):
    """``tile`` (in ``desc``'s type) to ``desc`` at (``off_m``, ``off_n``) by TMA, through shared memory."""
    smem = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    smem.store(tile)
    fence_async_shared()
    _tma_store(desc, [off_m, off_n], smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _half(rows):
    """Per element of ``rows`` (a vector in the rows' layout of a 64-row accumulator of 8 warps), which half of
    the tile's columns the thread holding it computes: 0 in threads 0-127, 1 in threads 128-255. The MMA
    layout's warps ``[4, 2]`` put them there: a warpgroup, four consecutive warps, runs one 64-row MMA, so the
    first takes the first half of the columns and the second the other."""
    return gl.inline_asm_elementwise("{ .reg .u32 t; mov.u32 t, %tid.x; shr.u32 $0, t, 7; }", "=r,r", [rows],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _tile_acc(a_desc, as_ptr, b_desc, bs_ptr, off_m, off_n, off_b, up_off, M, N, K, stride_asm, stride_ask,
              stride_bsn, stride_bsk, SCALE_BN: gl.constexpr, B_SCALE_SCALAR: gl.constexpr, STAGES: gl.constexpr,
              num_warps: gl.constexpr, GATE_UP: gl.constexpr):
    """The fp32 tile ``dequant(A[off_m:]) @ dequant(B[off_b:]).T``, its scaling under the next block's MMA (the
    module docstring); ``off_n``: the tile's first column of ``N`` (the weight scales' rows). 64 rows on 8
    warps: each warpgroup computes half the tile's columns (128 of a 256-column tile, one weight scale each).
    ``GATE_UP`` (64 rows, 8 warps, checked when it compiles): B's tile is two blocks of rows, ``off_b``'s then
    ``off_b + up_off``'s, the warpgroups' two halves (the accumulator ``[64, 2 BLOCK_N]``)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    HALVES: gl.constexpr = 2 if GATE_UP else 1
    WARPS_N: gl.constexpr = 2 if num_warps * 16 > BLOCK_M else 1  # warpgroups side by side along N
    gl.static_assert(not GATE_UP or (BLOCK_M == 64 and num_warps == 8), "GATE_UP: 64 rows on 8 warps")
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps // WARPS_N, WARPS_N],
        instr_shape=[16, HALVES * BLOCK_N // WARPS_N, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    ROW_SCALES: gl.constexpr = B_SCALE_SCALAR or WARPS_N == 2  # one weight scale a thread: (a * b)[:, None]

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)  # noqa: RUF005 - no * in Gluon
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, HALVES * BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    k_blocks = gl.cdiv(K, BLOCK_K)
    # Fill every slot; from block 1 on, each step refills the slot of the block before it.
    for i in gl.static_range(STAGES):
        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, i, i, off_m, off_b, up_off, i < k_blocks, GATE_UP)

    rows = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
    as_ptrs = as_ptr + gl.where(rows < M, rows, 0).to(gl.int64) * stride_asm
    if WARPS_N == 2:
        # One weight scale per half, per thread one: its rows' vector holds the scale of its warpgroup's half
        # (past the last column of N, the last scale: those columns are not stored).
        if GATE_UP:
            b_rows = off_n + _half(rows) * up_off
        else:
            b_rows = gl.minimum(off_n + _half(rows) * (BLOCK_N // 2), N - 1)
        bs_ptrs = bs_ptr + (b_rows // SCALE_BN).to(gl.int64) * stride_bsn
    elif B_SCALE_SCALAR:
        bs_ptrs = bs_ptr + (off_n // SCALE_BN) * stride_bsn
    else:
        cols = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
        bs_ptrs = bs_ptr + (gl.where(cols < N, cols, 0) // SCALE_BN).to(gl.int64) * stride_bsn

    acc = gl.zeros((BLOCK_M, HALVES * BLOCK_N), dtype=gl.float32, layout=acc_layout)
    # Block 0: issue its MMA; its scales are loaded while it runs.
    mbarrier.wait(ready.index(0), 0)
    s1 = gl.zeros((BLOCK_M, HALVES * BLOCK_N), dtype=gl.float32, layout=acc_layout)
    x0 = warpgroup_mma(a_bufs.index(0), b_bufs.index(0).permute((1, 0)), s1, use_acc=False, is_async=True)
    a_scale = gl.load(as_ptrs)
    b_scale = gl.load(bs_ptrs)
    # Two blocks per iteration: the pending results x0 and x1 swap roles with no copy.
    for kb in range(1, k_blocks - 1, 2):
        x1, s0, acc, a_scale, b_scale = _step(a_desc, b_desc, a_bufs, b_bufs, ready, x0, s1, acc, a_scale, b_scale,
                                              as_ptrs, bs_ptrs, kb, k_blocks, off_m, off_b, up_off, stride_ask,
                                              stride_bsk, ROW_SCALES, STAGES, num_warps, GATE_UP)
        x0, s1, acc, a_scale, b_scale = _step(a_desc, b_desc, a_bufs, b_bufs, ready, x1, s0, acc, a_scale, b_scale,
                                              as_ptrs, bs_ptrs, kb + 1, k_blocks, off_m, off_b, up_off, stride_ask,
                                              stride_bsk, ROW_SCALES, STAGES, num_warps, GATE_UP)
    if k_blocks % 2 == 0:  # one block left after the pairs
        last, s0, acc, a_scale, b_scale = _step(a_desc, b_desc, a_bufs, b_bufs, ready, x0, s1, acc, a_scale, b_scale,
                                                as_ptrs, bs_ptrs, k_blocks - 1, k_blocks, off_m, off_b, up_off,
                                                stride_ask, stride_bsk, ROW_SCALES, STAGES, num_warps, GATE_UP)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(last, ))
    else:
        done = warpgroup_mma_wait(num_outstanding=0, deps=(x0, ))
    acc = _promote(acc, done, a_scale, b_scale, ROW_SCALES)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    return acc


@gluon.jit
def _wgmma_block_kernel(
    a_desc,
    as_ptr,
    b_desc,
    bs_ptr,
    bias_ptr,
    c_desc,
    M,
    N,
    K,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    stride_bias,
    be_ptr,
    stride_bse,
    SCALE_BN: gl.constexpr,
    B_SCALE_SCALAR: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    GROUPED: gl.constexpr = False,
):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    pid_m, pid_n = _grouped_tile(gl.program_id(0), gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    off_b = off_n  # the tile's first row of ``b_desc``
    if GROUPED:
        # Row block pid_m belongs to expert be[pid_m] (-1: no rows); B is the experts' [E * N, K] weights.
        expert = gl.load(be_ptr + pid_m)
        if expert < 0:
            return
        off_b = expert * N + off_n
        bs_ptr = bs_ptr + expert.to(gl.int64) * stride_bse
    acc = _tile_acc(a_desc, as_ptr, b_desc, bs_ptr, off_m, off_n, off_b, 0, M, N, K, stride_asm, stride_ask, stride_bsn,
                    stride_bsk, SCALE_BN, B_SCALE_SCALAR, STAGES, num_warps, False)

    if HAS_BIAS:
        col_layout: gl.constexpr = gl.SliceLayout(0, acc.type.layout)
        bias_cols = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
        bias = gl.load(bias_ptr + gl.where(bias_cols < N, bias_cols, 0) * stride_bias)
        acc += bias.to(gl.float32)[None, :]
    _store_tile(c_desc, acc.to(c_desc.dtype), off_m, off_n)


@gluon.jit
def _wgmma_gate_up_kernel(
    a_desc, as_ptr, b_desc, bs_ptr, q_desc, qs_ptr, be_ptr, M, INTER, K, stride_asm, stride_ask, stride_bse, stride_bsn,
    stride_bsk, stride_qsm, eps,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr, FP8_MAX: gl.constexpr,
    FP8_MANT_BITS: gl.constexpr, FP8_MIN_EXP_BIASED: gl.constexpr, FP8_NAN_BITS: gl.constexpr, HW_RNE: gl.constexpr,
):
    """The MoE experts' fused gate-up: ``q[r, n], qs[r, n // 128] = quant(silu(a_r @ W_gate.T) * (a_r @ W_up.T))``
    for the row block of ``r`` (its expert ``be[r // BLOCK_M]``, -1: none) and 128 columns ``n``, as
    :func:`.moe_triton.silu_mul_quant` computes it from the plain gate-up's fp32 output. The two halves of the
    warps take the gate's and the up's 128 columns of one ``[BLOCK_M, 256]`` MMA tile; the epilogue meets them
    in shared memory. ``b_desc``: the experts' ``[E * 2I, K]`` weights (gate rows, then up rows) in blocks of
    128 rows (one weight scale's, and one quantization group of the output); ``INTER`` a multiple of 128."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    pid_m, pid_n = _grouped_tile(gl.program_id(0), gl.cdiv(M, BLOCK_M), gl.cdiv(INTER, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    expert = gl.load(be_ptr + pid_m)
    if expert < 0:
        return
    acc = _tile_acc(a_desc, as_ptr, b_desc, bs_ptr + expert.to(gl.int64) * stride_bse, off_m, off_n,
                    expert * 2 * INTER + off_n, INTER, M, INTER, K, stride_asm, stride_ask, stride_bsn, stride_bsk,
                    BLOCK_N, False, STAGES, num_warps, True)

    # Gate and up meet in shared memory (the ring's, no longer read), in the layout the quantizer's rows take.
    both = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 2 * BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    both.store(acc)
    _cta_barrier()
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [num_warps, 1], [1, 0])
    gate = both.slice(0, BLOCK_N, dim=1).load(layout)
    up = both.slice(BLOCK_N, BLOCK_N, dim=1).load(layout)
    act = silu_mul(gate, up)
    q, q_scale = fp8_group_quantize(act, eps, q_desc.dtype, False, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED,
                                    FP8_NAN_BITS, HW_RNE)
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    gl.store(qs_ptr + rows.to(gl.int64) * stride_qsm + pid_n, q_scale, mask=rows < M)
    _store_tile(q_desc, q, off_m, off_n)


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block, layout)


def launch(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, scale_bn: int,
           bias: torch.Tensor | None, out: torch.Tensor, cfg: TritonConfig) -> None:
    """Launch the kernel with ``cfg``'s tiles (a ``wgmma`` path configuration) on checked operands:
    ``a``, ``b`` and ``out`` able to back TMA descriptors (unit column stride, 16-byte aligned base
    and row stride), scales of any strides.

    The kernel loads a K block's activation scales one block before it uses them, less than the L2
    latency. Row-major, a token's next 32 blocks' scales arrive with the first (one 128-byte line).
    Any other layout (a caller's M-major scales) is copied row-major first: M x K/128 words against
    a GEMM 7-19% slower on M-major scales (H200 run 32)."""
    if a_scale.stride(1) != 1:
        a_scale = a_scale.contiguous()
    m, k = a.shape
    n = b.shape[0]
    grid = (triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(n, cfg.BLOCK_N),)
    _wgmma_block_kernel[grid](
        _descriptor(a, [cfg.BLOCK_M, SCALE_GROUP_K]), a_scale, _descriptor(b, [cfg.BLOCK_N, SCALE_GROUP_K]), b_scale,
        bias if bias is not None else b_scale, _descriptor(out, [cfg.BLOCK_M, cfg.BLOCK_N]), m, n, k,
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        bias.stride(0) if bias is not None else 0, b_scale, 0, SCALE_BN=scale_bn,
        B_SCALE_SCALAR=scale_bn % cfg.BLOCK_N == 0, HAS_BIAS=bias is not None, GROUP_M=cfg.GROUP_M,
        STAGES=cfg.num_stages, num_warps=cfg.num_warps)


def launch_grouped(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                   block_expert: torch.Tensor, out: torch.Tensor, *, block_m: int, block_n: int, group_m: int,
                   stages: int, num_warps: int) -> None:
    """The grouped GEMM of the MoE experts: ``out[r] = dequant(a[r]) @ dequant(w[e]).T`` for every row
    ``r`` of a row block whose expert ``e = block_expert[r // block_m]`` is not -1 (the rows of the
    other blocks are left as they are). ``block_n`` 256 (with ``block_m`` 64 and 4 warps): each tile on
    twice the warps, a warpgroup to each 128 columns.

    ``a`` fp8 ``[R, K]`` (rows sorted by expert in blocks of ``block_m``) with row-major scales
    ``[R, ceil(K/128)]``, ``w`` fp8 ``[E, N, K]`` contiguous with 128x128 block scales
    ``[E, ceil(N/128), ceil(K/128)]``, ``out`` ``[R, N]``; all able to back TMA descriptors
    (:func:`.triton_device._tma_ok`). A column tile past an expert's N reads the next expert's
    rows (or TMA's zeros after the last) into columns the output's descriptor does not store."""
    rows, k = a.shape
    experts, n, _ = w.shape
    grid = (triton.cdiv(rows, block_m) * triton.cdiv(n, block_n),)
    warps = 2 * num_warps if block_n == 256 else num_warps  # 256 columns: two warpgroups side by side
    _wgmma_block_kernel[grid](
        _descriptor(a, [block_m, SCALE_GROUP_K]), a_scale, _descriptor(w.view(experts * n, k), [block_n, SCALE_GROUP_K]),
        w_scale, w_scale, _descriptor(out, [block_m, block_n]), rows, n, k, a_scale.stride(0), a_scale.stride(1),
        w_scale.stride(1), w_scale.stride(2), 0, block_expert, w_scale.stride(0), SCALE_BN=SCALE_GROUP_K,
        B_SCALE_SCALAR=SCALE_GROUP_K % block_n == 0, HAS_BIAS=False, GROUP_M=group_m, STAGES=stages,
        num_warps=warps, GROUPED=True)


def launch_gate_up(a: torch.Tensor, a_scale: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                   block_expert: torch.Tensor, q: torch.Tensor, q_scale: torch.Tensor, eps: float, *, block_m: int,
                   group_m: int, stages: int, hw_rne: bool, fp8: dict[str, float | int]) -> None:
    """The MoE experts' fused gate-up on the rows of ``a`` (as :func:`launch_grouped`'s): ``q [R, I]`` (an fp8
    type) with row-major scales ``q_scale [R, I/128]``, the quantized ``silu(gate) * up`` of
    every row block whose expert is not -1 (``fp8``, ``hw_rne``: :func:`.triton_quant.fp8_constexprs`, and
    whether the cast rounds to nearest even). ``w13`` ``[E, 2I, K]`` with ``I`` a multiple of 128 and its
    128x128 block scales ``[E, 2I/128, K/128]``; ``block_m`` 64, on :data:`GATE_UP_WARPS` warps."""
    rows, k = a.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    grid = (triton.cdiv(rows, block_m) * (inter // SCALE_GROUP_K),)
    _wgmma_gate_up_kernel[grid](
        _descriptor(a, [block_m, SCALE_GROUP_K]), a_scale,
        _descriptor(w13.view(experts * two_i, k), [SCALE_GROUP_K, SCALE_GROUP_K]), w13_scale,
        _descriptor(q, [block_m, SCALE_GROUP_K]), q_scale, block_expert, rows, inter, k, a_scale.stride(0),
        a_scale.stride(1), w13_scale.stride(0), w13_scale.stride(1), w13_scale.stride(2), q_scale.stride(0), eps,
        GROUP_M=group_m, STAGES=stages, num_warps=GATE_UP_WARPS, HW_RNE=hw_rne, **fp8)
