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

The MoE experts' grouped launches (:mod:`.gluon_moe`) run the same K loop (:func:`_tile_acc`) on each row
block's expert weights; 64-row tiles may take 8 warps, a warpgroup to each half of the columns (256 of the
down GEMM, or the gate's and the up's 128 of the fused gate-up).

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

from .triton_config import SCALE_GROUP_K, TritonConfig
from .triton_gemm_kernels import _grouped_tile

# Names that changed between Triton 3.6 and 3.9 (the TMA copies' old names raise in 3.9).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

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
          off_m, off_n, up_off, stride_ask, stride_bsk, nxt, B_SCALE_SCALAR: gl.constexpr, STAGES: gl.constexpr,
          num_warps: gl.constexpr, GATE_UP: gl.constexpr, PERSISTENT: gl.constexpr):
    """K block ``kb``: issue its MMA, then wait for block kb-1's (``prev``), refill that block's
    slot with block kb+STAGES-1 and add ``prev`` scaled by block kb-1's scales (``a_scale``,
    ``b_scale``) into ``acc`` while block kb's MMA runs. Returns block kb's pending result,
    block kb-1's (spent) result, the accumulator and block kb's scales.

    The MMA writes into ``spent``, block kb-2's result, already added (``use_acc=False``: its
    values are not read). Handing it in ties the MMA's registers to it, so block kb-2's scaling
    has to come before this MMA: the two pending results then alternate between two register
    sets, where a fresh accumulator let the compiler sink that scaling past the MMA into a
    third set and copy it back at the loop's end, an accumulator copy that makes ptxas wait
    for the MMA in flight.

    ``PERSISTENT``: ``nxt`` is ``(g0, next_m, next_b, next_ok)``: the ring's count of blocks before this
    tile's first, and the next tile's coordinates; a refill past this tile's last block loads the next
    tile's first blocks (nothing where ``next_ok`` is false)."""
    g = kb
    if PERSISTENT:
        g = nxt[0] + kb
    slot = g % STAGES
    mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
    cur = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), spent, use_acc=False, is_async=True)
    a_scale_next = gl.load(as_ptrs + kb * stride_ask)
    b_scale_next = gl.load(bs_ptrs + kb * stride_bsk)
    prev = warpgroup_mma_wait(num_outstanding=1, deps=(prev, ))
    if num_warps > 4:
        _cta_barrier()  # every warpgroup's MMA kb-1 is done before its slot is overwritten
    refill = kb + STAGES - 1
    if PERSISTENT:
        over = (refill >= k_blocks).to(gl.int32)
        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, (g - 1) % STAGES, refill - over * k_blocks,
                    off_m + over * (nxt[1] - off_m), off_n + over * (nxt[2] - off_n), up_off,
                    (refill < k_blocks) | nxt[3], GATE_UP)
    else:
        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, (kb - 1) % STAGES, refill, off_m, off_n, up_off,
                    refill < k_blocks, GATE_UP)
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
def _ring(a_desc, b_desc, STAGES: gl.constexpr, GATE_UP: gl.constexpr):
    """The operands' ring: ``STAGES`` slots of an A block and a B block (two with ``GATE_UP``) of K, and a
    barrier per slot that its TMA loads arrive on."""
    HALVES: gl.constexpr = 2 if GATE_UP else 1
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)  # noqa: RUF005 - no * in Gluon
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, HALVES * b_desc.block_type.shape[0],
                                                      b_desc.block_type.shape[1]], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    return a_bufs, b_bufs, ready


@gluon.jit
def _release(ready, STAGES: gl.constexpr):
    """The ring's barriers invalidated (its loads all consumed)."""
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))


@gluon.jit
def _tile_acc(a_desc, as_ptr, b_desc, bs_ptr, off_m, off_n, off_b, up_off, M, N, K, stride_asm, stride_ask,
              stride_bsn, stride_bsk, a_bufs, b_bufs, ready, nxt, SCALE_BN: gl.constexpr,
              B_SCALE_SCALAR: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr, GATE_UP: gl.constexpr,
              PERSISTENT: gl.constexpr):
    """The fp32 tile ``dequant(A[off_m:]) @ dequant(B[off_b:]).T``, its scaling under the next block's MMA (the
    module docstring), its operands through the ring of :func:`_ring`; ``off_n``: the tile's first column of
    ``N`` (the weight scales' rows). 64 rows on 8 warps: each warpgroup computes half the tile's columns (128 of
    a 256-column tile, one weight scale each). ``GATE_UP`` (64 rows, 8 warps, checked when it compiles): B's
    tile is two blocks of rows, ``off_b``'s then ``off_b + up_off``'s, the warpgroups' two halves (the
    accumulator ``[64, 2 BLOCK_N]``).

    ``PERSISTENT`` (a program's tiles one after another, at least ``STAGES`` K blocks each): the ring already
    holds (or is loading) this tile's first ``STAGES`` blocks, and its last ``STAGES`` refills load the next
    tile's (``nxt``: :func:`_step`), so they arrive while this tile's result is stored. Else the ring is
    filled here."""
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

    k_blocks = gl.cdiv(K, BLOCK_K)
    g0 = 0
    if PERSISTENT:
        g0 = nxt[0]
    else:
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
    mbarrier.wait(ready.index(g0 % STAGES), (g0 // STAGES) & 1)
    s1 = gl.zeros((BLOCK_M, HALVES * BLOCK_N), dtype=gl.float32, layout=acc_layout)
    x0 = warpgroup_mma(a_bufs.index(g0 % STAGES), b_bufs.index(g0 % STAGES).permute((1, 0)), s1, use_acc=False,
                       is_async=True)
    a_scale = gl.load(as_ptrs)
    b_scale = gl.load(bs_ptrs)
    # Two blocks per iteration: the pending results x0 and x1 swap roles with no copy.
    for kb in range(1, k_blocks - 1, 2):
        x1, s0, acc, a_scale, b_scale = _step(a_desc, b_desc, a_bufs, b_bufs, ready, x0, s1, acc, a_scale, b_scale,
                                              as_ptrs, bs_ptrs, kb, k_blocks, off_m, off_b, up_off, stride_ask,
                                              stride_bsk, nxt, ROW_SCALES, STAGES, num_warps, GATE_UP, PERSISTENT)
        x0, s1, acc, a_scale, b_scale = _step(a_desc, b_desc, a_bufs, b_bufs, ready, x1, s0, acc, a_scale, b_scale,
                                              as_ptrs, bs_ptrs, kb + 1, k_blocks, off_m, off_b, up_off, stride_ask,
                                              stride_bsk, nxt, ROW_SCALES, STAGES, num_warps, GATE_UP, PERSISTENT)
    if k_blocks % 2 == 0:  # one block left after the pairs
        last, s0, acc, a_scale, b_scale = _step(a_desc, b_desc, a_bufs, b_bufs, ready, x0, s1, acc, a_scale, b_scale,
                                                as_ptrs, bs_ptrs, k_blocks - 1, k_blocks, off_m, off_b, up_off,
                                                stride_ask, stride_bsk, nxt, ROW_SCALES, STAGES, num_warps, GATE_UP,
                                                PERSISTENT)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(last, ))
    else:
        done = warpgroup_mma_wait(num_outstanding=0, deps=(x0, ))
    if PERSISTENT:
        # The last block's slot is free: the next tile's block STAGES - 1 goes there.
        if num_warps > 4:
            _cta_barrier()
        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, (g0 + k_blocks - 1) % STAGES, STAGES - 1, nxt[1], nxt[2],
                    up_off, nxt[3], GATE_UP)
    acc = _promote(acc, done, a_scale, b_scale, ROW_SCALES)
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
    a_bufs, b_bufs, ready = _ring(a_desc, b_desc, STAGES, False)
    acc = _tile_acc(a_desc, as_ptr, b_desc, bs_ptr, off_m, off_n, off_b, 0, M, N, K, stride_asm, stride_ask, stride_bsn,
                    stride_bsk, a_bufs, b_bufs, ready, None, SCALE_BN, B_SCALE_SCALAR, STAGES, num_warps, False, False)
    _release(ready, STAGES)

    if HAS_BIAS:
        col_layout: gl.constexpr = gl.SliceLayout(0, acc.type.layout)
        bias_cols = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
        bias = gl.load(bias_ptr + gl.where(bias_cols < N, bias_cols, 0) * stride_bias)
        acc += bias.to(gl.float32)[None, :]
    _store_tile(c_desc, acc.to(c_desc.dtype), off_m, off_n)


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
