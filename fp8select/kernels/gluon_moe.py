"""The MoE experts' grouped GEMMs on the Hopper ``wgmma`` kernels of :mod:`.gluon_gemm` (its K loop,
:func:`.gluon_gemm._tile_acc`, on each row block's expert weights).

* :func:`launch_grouped`: ``out[r] = dequant(a[r]) @ dequant(w[e]).T`` over rows sorted by expert in blocks
  (the gate-up of the plain structure, and the down GEMM);
* :func:`launch_gate_up`: the fused gate-up, two warpgroups computing the gate's and the up's 128 columns of
  64 rows, whose epilogue quantizes ``silu(gate) * up`` per 1x128 group.

Either launches one program per tile or, ``persistent``, one per SM taking tile after tile
(:func:`_persistent_kernel`): its ring loads the next tile's first K blocks while a tile's result is stored.
Hopper only, CUDA only, no interpreter: :class:`.moe_triton.TritonExperts` launches them where
:func:`.triton_device.wgmma_runs`.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from .gluon_gemm import (
    _cta_barrier,
    _descriptor,
    _load_block,
    _release,
    _ring,
    _store_tile,
    _tile_acc,
    _tma_store,
    _wgmma_block_kernel,
)
from .moe_triton_kernels import silu_mul
from .triton_config import SCALE_GROUP_K
from .triton_device import sm_count
from .triton_gemm_kernels import _grouped_tile
from .triton_quant import fp8_group_quantize

GATE_UP_WARPS = 8
"""Warps of a fused gate-up program: a warpgroup to the gate's and one to the up's 128 columns of its 64 rows."""


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
    a_bufs, b_bufs, ready = _ring(a_desc, b_desc, STAGES, True)
    acc = _tile_acc(a_desc, as_ptr, b_desc, bs_ptr + expert.to(gl.int64) * stride_bse, off_m, off_n,
                    expert * 2 * INTER + off_n, INTER, M, INTER, K, stride_asm, stride_ask, stride_bsn, stride_bsk,
                    a_bufs, b_bufs, ready, None, BLOCK_N, False, STAGES, num_warps, True, False)
    _release(ready, STAGES)
    # Gate and up meet in shared memory (the ring's, no longer read), in the layout the quantizer's rows take.
    both = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 2 * BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    q, q_scale, rows = _silu_mul_quant(acc, both, off_m, eps, q_desc.dtype, num_warps, FP8_MAX, FP8_MANT_BITS,
                                       FP8_MIN_EXP_BIASED, FP8_NAN_BITS, HW_RNE)
    gl.store(qs_ptr + rows.to(gl.int64) * stride_qsm + pid_n, q_scale, mask=rows < M)
    _store_tile(q_desc, q, off_m, off_n)


@gluon.jit
def _silu_mul_quant(acc, both, off_m, eps, dtype: gl.constexpr, num_warps: gl.constexpr, FP8_MAX: gl.constexpr,
                    FP8_MANT_BITS: gl.constexpr, FP8_MIN_EXP_BIASED: gl.constexpr, FP8_NAN_BITS: gl.constexpr,
                    HW_RNE: gl.constexpr):
    """The fused gate-up's epilogue: ``quant(silu(gate) * up)`` of a ``[BLOCK_M, 2 * 128]`` accumulator (gate's
    columns, then up's), met in ``both`` (fp32 shared memory of its shape) in the layout the quantizer's rows
    take; with its per-row scales and the rows' indices (from ``off_m``) in the scales' layout."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1] // 2
    both.store(acc)
    _cta_barrier()
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [num_warps, 1], [1, 0])
    gate = both.slice(0, BLOCK_N, dim=1).load(layout)
    up = both.slice(BLOCK_N, BLOCK_N, dim=1).load(layout)
    act = silu_mul(gate, up)
    q, q_scale = fp8_group_quantize(act, eps, dtype, False, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED, FP8_NAN_BITS,
                                    HW_RNE)
    return q, q_scale, off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))


@gluon.jit
def _used_blocks(be_ptr, blocks, num_warps: gl.constexpr):
    """How many of the ``blocks`` row blocks have an expert: the unused ones (-1) come last
    (:mod:`.moe_routing`)."""
    CHUNK: gl.constexpr = 32 * num_warps
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    used = gl.to_tensor(0)
    for start in range(0, blocks, CHUNK):
        offs = start + gl.arange(0, CHUNK, layout=layout)
        expert = gl.load(be_ptr + offs, mask=offs < blocks, other=-1)
        used += gl.sum((expert >= 0).to(gl.int32), axis=0)
    return used


@gluon.jit
def _expert_tile(tile, tiles, used, tiles_n, be_ptr, b_rows, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 GROUP_M: gl.constexpr):
    """``(off_m, off_n, off_b, expert, ok)`` of a persistent program's tile ``tile`` of ``tiles`` (``used`` row
    blocks by ``tiles_n`` column tiles, grouped order): its first row, column, row of the experts' weights
    (``b_rows`` rows an expert), its expert, and whether it is one (past the last, the last's coordinates)."""
    pid_m, pid_n = _grouped_tile(gl.minimum(tile, tiles - 1), used, tiles_n, GROUP_M)
    expert = gl.load(be_ptr + pid_m)
    return pid_m * BLOCK_M, pid_n * BLOCK_N, expert * b_rows + pid_n * BLOCK_N, expert, tile < tiles


@gluon.jit
def _persistent_kernel(
    a_desc, as_ptr, b_desc, bs_ptr, c_desc, qs_ptr, be_ptr, M, N, K, stride_asm, stride_ask, stride_bse, stride_bsn,
    stride_bsk, stride_qsm, eps,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr, GATE_UP: gl.constexpr,
    FP8_MAX: gl.constexpr = 0.0, FP8_MANT_BITS: gl.constexpr = 0, FP8_MIN_EXP_BIASED: gl.constexpr = 0,
    FP8_NAN_BITS: gl.constexpr = 0, HW_RNE: gl.constexpr = False,
):
    """The MoE experts' grouped GEMM (:func:`launch_grouped`'s) or, with ``GATE_UP``, fused gate-up
    (:func:`_wgmma_gate_up_kernel`'s, ``N`` the intermediate size ``I``, ``c_desc`` its quantized output and
    ``qs_ptr`` its scales) in persistent programs: each takes the tiles ``pid, pid + programs, ...`` of the used
    row blocks (grouped order) one after another, its ring loading the next tile's first ``STAGES`` K blocks
    (at least that many) while the last tile's result is stored, which is then written by a TMA store left in
    flight under the next tile's MMAs."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    used = _used_blocks(be_ptr, gl.cdiv(M, BLOCK_M), num_warps)
    tiles_n = gl.cdiv(N, BLOCK_N)
    tiles = used * tiles_n
    pid = gl.program_id(0)
    if pid >= tiles:
        return
    programs = gl.num_programs(0)
    b_rows = 2 * N if GATE_UP else N
    up_off = N if GATE_UP else 0
    k_blocks = gl.cdiv(K, a_desc.block_type.shape[1])
    a_bufs, b_bufs, ready = _ring(a_desc, b_desc, STAGES, GATE_UP)
    out = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    if GATE_UP:
        both = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 2 * BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    off_m, off_n, off_b, expert, _ = _expert_tile(pid, tiles, used, tiles_n, be_ptr, b_rows, BLOCK_M, BLOCK_N,
                                                  GROUP_M)
    for i in gl.static_range(STAGES):
        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, i, i, off_m, off_b, up_off, True, GATE_UP)
    g0 = pid * 0
    for tile in range(pid, tiles, programs):
        n_m, n_n, n_b, n_expert, n_ok = _expert_tile(tile + programs, tiles, used, tiles_n, be_ptr, b_rows, BLOCK_M,
                                                     BLOCK_N, GROUP_M)
        acc = _tile_acc(a_desc, as_ptr, b_desc, bs_ptr + expert.to(gl.int64) * stride_bse, off_m, off_n, off_b,
                        up_off, M, N, K, stride_asm, stride_ask, stride_bsn, stride_bsk, a_bufs, b_bufs, ready,
                        (g0, n_m, n_b, n_ok), 128, 128 % BLOCK_N == 0 and not GATE_UP, STAGES,
                        num_warps, GATE_UP, True)
        if GATE_UP:
            tile_out, q_scale, rows = _silu_mul_quant(acc, both, off_m, eps, c_desc.dtype, num_warps, FP8_MAX,
                                                      FP8_MANT_BITS, FP8_MIN_EXP_BIASED, FP8_NAN_BITS, HW_RNE)
            gl.store(qs_ptr + rows.to(gl.int64) * stride_qsm + off_n // BLOCK_N, q_scale, mask=rows < M)
        else:
            tile_out = acc.to(c_desc.dtype)
        tma.store_wait(pendings=0)  # the last tile's store has read ``out``
        _cta_barrier()
        out.store(tile_out)
        fence_async_shared()
        _tma_store(c_desc, [off_m, off_n], out)
        g0 += k_blocks
        off_m, off_n, off_b, expert = n_m, n_n, n_b, n_expert
    tma.store_wait(pendings=0)
    _release(ready, STAGES)


def launch_grouped(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                   block_expert: torch.Tensor, out: torch.Tensor, *, block_m: int, block_n: int, group_m: int,
                   stages: int, num_warps: int, persistent: bool = False) -> None:
    """The grouped GEMM of the MoE experts: ``out[r] = dequant(a[r]) @ dequant(w[e]).T`` for every row
    ``r`` of a row block whose expert ``e = block_expert[r // block_m]`` is not -1 (the rows of the
    other blocks are left as they are; those blocks come after the others, as :mod:`.moe_routing` lays them
    out). ``block_n`` 256 (with ``block_m`` 64 and 4 warps): each tile on twice the warps, a warpgroup to each
    128 columns. ``persistent``: one program per SM taking tile after tile (:func:`_persistent_kernel`), where
    K holds at least ``stages`` blocks.

    ``a`` fp8 ``[R, K]`` (rows sorted by expert in blocks of ``block_m``) with row-major scales
    ``[R, ceil(K/128)]``, ``w`` fp8 ``[E, N, K]`` contiguous with 128x128 block scales
    ``[E, ceil(N/128), ceil(K/128)]``, ``out`` ``[R, N]``; all able to back TMA descriptors
    (:func:`.triton_device._tma_ok`). A column tile past an expert's N reads the next expert's
    rows (or TMA's zeros after the last) into columns the output's descriptor does not store."""
    rows, k = a.shape
    experts, n, _ = w.shape
    tiles = triton.cdiv(rows, block_m) * triton.cdiv(n, block_n)
    warps = 2 * num_warps if block_n == 256 else num_warps  # 256 columns: two warpgroups side by side
    a_desc = _descriptor(a, [block_m, SCALE_GROUP_K])
    w_desc = _descriptor(w.view(experts * n, k), [block_n, SCALE_GROUP_K])
    out_desc = _descriptor(out, [block_m, block_n])
    if _runs_persistent(persistent, k, stages):
        _persistent_kernel[(min(tiles, sm_count(a.device)),)](
            a_desc, a_scale, w_desc, w_scale, out_desc, w_scale, block_expert, rows, n, k, a_scale.stride(0),
            a_scale.stride(1), w_scale.stride(0), w_scale.stride(1), w_scale.stride(2), 0, 0.0, GROUP_M=group_m,
            STAGES=stages, num_warps=warps, GATE_UP=False)
        return
    _wgmma_block_kernel[(tiles,)](
        a_desc, a_scale, w_desc, w_scale, w_scale, out_desc, rows, n, k, a_scale.stride(0), a_scale.stride(1),
        w_scale.stride(1), w_scale.stride(2), 0, block_expert, w_scale.stride(0), SCALE_BN=SCALE_GROUP_K,
        B_SCALE_SCALAR=SCALE_GROUP_K % block_n == 0, HAS_BIAS=False, GROUP_M=group_m, STAGES=stages,
        num_warps=warps, GROUPED=True)


def launch_gate_up(a: torch.Tensor, a_scale: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                   block_expert: torch.Tensor, q: torch.Tensor, q_scale: torch.Tensor, eps: float, *, block_m: int,
                   group_m: int, stages: int, hw_rne: bool, fp8: dict[str, float | int],
                   persistent: bool = False) -> None:
    """The MoE experts' fused gate-up on the rows of ``a`` (as :func:`launch_grouped`'s, ``persistent``
    too): ``q [R, I]`` (an fp8 type) with row-major scales ``q_scale [R, I/128]``, the quantized
    ``silu(gate) * up`` of every row block whose expert is not -1 (``fp8``, ``hw_rne``:
    :func:`.triton_quant.fp8_constexprs`, and whether the cast rounds to nearest even). ``w13`` ``[E, 2I, K]``
    with ``I`` a multiple of 128 and its 128x128 block scales ``[E, 2I/128, K/128]``; ``block_m`` 64, on
    :data:`GATE_UP_WARPS` warps."""
    rows, k = a.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    tiles = triton.cdiv(rows, block_m) * (inter // SCALE_GROUP_K)
    # Both kernels take the same arguments (the persistent one's N is I here).
    args = (_descriptor(a, [block_m, SCALE_GROUP_K]), a_scale,
            _descriptor(w13.view(experts * two_i, k), [SCALE_GROUP_K, SCALE_GROUP_K]), w13_scale,
            _descriptor(q, [block_m, SCALE_GROUP_K]), q_scale, block_expert, rows, inter, k, a_scale.stride(0),
            a_scale.stride(1), w13_scale.stride(0), w13_scale.stride(1), w13_scale.stride(2), q_scale.stride(0), eps)
    constexprs = {"GROUP_M": group_m, "STAGES": stages, "num_warps": GATE_UP_WARPS, "HW_RNE": hw_rne, **fp8}
    if _runs_persistent(persistent, k, stages):
        _persistent_kernel[(min(tiles, sm_count(a.device)),)](*args, GATE_UP=True, **constexprs)
    else:
        _wgmma_gate_up_kernel[(tiles,)](*args, **constexprs)


def _runs_persistent(persistent: bool, k: int, stages: int) -> bool:
    """Whether a launch asked for persistent programs gets them: K of at least ``stages`` blocks (a tile's
    refills reach one tile ahead, no further)."""
    return persistent and triton.cdiv(k, SCALE_GROUP_K) >= stages
