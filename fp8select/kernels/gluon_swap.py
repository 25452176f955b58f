"""A Hopper swap-AB block-FP8 GEMM in Gluon for decode, whose weight stream starts before the
quantizer that feeds it has finished.

``C[M, N] = dequant(A) @ dequant(B).T (+ bias)`` on the quantized activation (fp8 ``A`` with one
fp32 scale per token per 128 K elements) and the checkpoint's fp8 weight ``B`` with one scale per
128x128 (or 1x128) block: the operands of :func:`.triton_gemm.w8a8_block_gemm`. Each program
computes the transposed tile ``[BLOCK_N, BLOCK_M] = B_tile @ A_tile^T`` over its split's share of
K: the weight rows on the ``wgmma``'s 64-row side, the few tokens on its narrow side (8 to 256
columns).

At decode a GEMM only streams its weight from HBM; what keeps it from that speed is the time
before the stream is running (the launch, the quantizer ahead of it, the first DRAM round trip)
and after it. Launched with programmatic dependent launch (PDL), this kernel's programs become
resident while the quantization kernel still runs and fill their ring of ``STAGES`` shared-memory
slots with weight blocks by TMA; only then do they wait for the quantizer
(``griddepcontrol.wait``) and load the activation's blocks and scales. The weight is safe to read
early: the quantizer lets this kernel launch only after its own wait, when every kernel before
the quantizer has finished, and it writes only the activation. Each slot is refilled as soon as
the MMA that read it is done.

Split-K as the Triton kernels do it (:mod:`.triton_gemm_kernels`): each split stores its fp32
partial into a ``[SPLIT_K, M, N]`` workspace, then the last program of the tile to arrive sums
them in split order (``FIXUP``), or ``_splitk_reduce_kernel`` does.

Hopper only, CUDA only, no interpreter: the ``wgmma-swap`` path of :mod:`.triton_gemm` launches
it where :func:`.triton_gemm.wgmma_runs`, and the ``swap`` path's kernel with the same tiles
elsewhere.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .gluon_gemm import _cta_barrier, _descriptor, _tma_load
from .triton_config import SCALE_GROUP_K, TritonConfig


@gluon.jit
def _grid_dependency(WAIT: gl.constexpr):
    """``griddepcontrol.wait`` (``WAIT``) or ``.launch_dependents``; no-ops without PDL."""
    if WAIT:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


# Values that change between calls of one layer (M, split count) or between scale layouts are not
# specialized on, so one compiled kernel serves them all (M = 1 would otherwise be a constant).
@gluon.jit(do_not_specialize=["M", "SPLIT_K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "stride_bias",
                              "stride_cm"])
def _swap_kernel(
    a_desc,
    as_ptr,
    b_desc,
    bs_ptr,
    bias_ptr,
    c_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    SPLIT_K,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    stride_bias,
    stride_cm,
    stride_cn,
    SCALE_BN: gl.constexpr,
    B_SCALE_SCALAR: gl.constexpr,
    IS_SPLIT: gl.constexpr,
    FIXUP: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    PDL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)  # weight rows (output columns n)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)  # tokens (output rows m)

    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    off_n = (pid % num_pid_n) * BLOCK_N
    off_m = (pid // num_pid_n) * BLOCK_M
    k_blocks = gl.cdiv(K, BLOCK_K)
    per_split = gl.cdiv(k_blocks, SPLIT_K)
    kb_start = pid_k * per_split
    blocks = gl.minimum(kb_start + per_split, k_blocks) - kb_start

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)  # noqa: RUF005 - no * in Gluon
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)  # noqa: RUF005
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    # The weight's first blocks, before the wait for the quantizer (the module docstring says why
    # that is safe); each slot's barrier expects the activation block too.
    for i in gl.static_range(STAGES):
        mbarrier.expect(ready.index(i), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=i < blocks)
        _tma_load(b_desc, [off_n, (kb_start + i) * BLOCK_K], ready.index(i), b_bufs.index(i), i < blocks)
    if PDL:
        _grid_dependency(True)
        _grid_dependency(False)
    for i in gl.static_range(STAGES):
        _tma_load(a_desc, [off_m, (kb_start + i) * BLOCK_K], ready.index(i), a_bufs.index(i), i < blocks)

    offs_n = off_n + gl.arange(0, BLOCK_N, layout=row_layout)
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=col_layout)
    # Tokens and weight rows past the ends read row 0's scales; their results are never stored.
    as_ptrs = as_ptr + gl.where(offs_m < M, offs_m, 0).to(gl.int64) * stride_asm + kb_start * stride_ask
    if B_SCALE_SCALAR:
        bs_ptrs = bs_ptr + (off_n // SCALE_BN) * stride_bsn + kb_start * stride_bsk
    else:
        bs_ptrs = bs_ptr + (gl.where(offs_n < N, offs_n, 0) // SCALE_BN).to(gl.int64) * stride_bsn + kb_start * stride_bsk

    acc = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    # Scales one block ahead of their use (the index clamped to the split's last block).
    a_scale = gl.load(as_ptrs)
    b_scale = gl.load(bs_ptrs)
    for i in range(blocks):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        d = warpgroup_mma(b_bufs.index(slot), a_bufs.index(slot).permute((1, 0)),
                          gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout), use_acc=False,
                          is_async=True)
        nxt = gl.minimum(i + 1, blocks - 1)
        a_scale_next = gl.load(as_ptrs + nxt * stride_ask)
        b_scale_next = gl.load(bs_ptrs + nxt * stride_bsk)
        d = warpgroup_mma_wait(num_outstanding=0, deps=(d, ))
        if num_warps > 4:
            _cta_barrier()  # every warpgroup's MMA on the slot is done before it is overwritten
        refill = i + STAGES
        mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=refill < blocks)
        _tma_load(b_desc, [off_n, (kb_start + refill) * BLOCK_K], ready.index(slot), b_bufs.index(slot),
                  refill < blocks)
        _tma_load(a_desc, [off_m, (kb_start + refill) * BLOCK_K], ready.index(slot), a_bufs.index(slot),
                  refill < blocks)
        if B_SCALE_SCALAR:
            acc += d * (a_scale * b_scale)[None, :]
        else:
            acc += d * (b_scale[:, None] * a_scale[None, :])
        a_scale = a_scale_next
        b_scale = b_scale_next
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    mask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
    c_ptrs = c_ptr + offs_m[None, :].to(gl.int64) * stride_cm + offs_n[:, None] * stride_cn
    if IS_SPLIT:
        mn = M.to(gl.int64) * N
        ws_ptrs = ws_ptr + offs_m[None, :].to(gl.int64) * N + offs_n[:, None]
        gl.store(ws_ptrs + pid_k.to(gl.int64) * mn, acc, mask=mask)
        if FIXUP:
            # As _store_tile: every partial stored before the counter bump, the acq_rel atomic
            # publishes them; the last to arrive sums the splits in order and resets the counter.
            _cta_barrier()
            arrived = gl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                total = gl.load(ws_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
                for s in range(1, SPLIT_K):
                    total += gl.load(ws_ptrs + s * mn, mask=mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += gl.load(bias_ptr + gl.where(offs_n < N, offs_n, 0) * stride_bias).to(gl.float32)[:, None]
                gl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
                gl.atomic_xchg(cnt_ptr + pid, 0)
    else:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + gl.where(offs_n < N, offs_n, 0) * stride_bias).to(gl.float32)[:, None]
        gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def launch(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, scale_bn: int,
           bias: torch.Tensor | None, out: torch.Tensor, ws: torch.Tensor, counters: torch.Tensor, split: int,
           fixup: bool, pdl: bool, cfg: TritonConfig) -> None:
    """Launch the kernel with ``cfg``'s tiles (a ``wgmma-swap`` configuration) on checked operands:
    ``a`` and ``b`` able to back TMA descriptors, scales and ``out`` of any strides; ``ws`` the
    ``[split, M, N]`` fp32 workspace and ``counters`` the tiles' zeroed counters when ``split > 1``
    (``fixup``: summed by the last program; otherwise the caller launches the reduction); ``pdl``:
    launched with programmatic dependent launch."""
    m, k = a.shape
    n = b.shape[0]
    grid = (triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(n, cfg.BLOCK_N), split)
    _swap_kernel[grid](
        _descriptor(a, [cfg.BLOCK_M, SCALE_GROUP_K]), a_scale, _descriptor(b, [cfg.BLOCK_N, SCALE_GROUP_K]), b_scale,
        bias if bias is not None else b_scale, out, ws, counters, m, n, k, split,
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        bias.stride(0) if bias is not None else 0, out.stride(0), out.stride(1),
        SCALE_BN=scale_bn, B_SCALE_SCALAR=scale_bn % cfg.BLOCK_N == 0, IS_SPLIT=split > 1, FIXUP=fixup,
        HAS_BIAS=bias is not None, PDL=pdl, STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        **({"launch_pdl": True} if pdl else {}))
