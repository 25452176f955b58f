"""Triton kernel of :func:`fp8select.kernels.nonfinite.propagate_nonfinite_rows` (imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["propagate_nonfinite_rows_triton"]


@triton.jit(do_not_specialize=["M", "N", "K", "stride_xm", "stride_xk", "stride_om", "stride_on"])
def _nan_rows_kernel(
    x_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_om,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program checks a ``[BLOCK_M, BLOCK_K]`` tile of ``x``; if a row holds NaN/inf it
    writes NaN over that row of ``out`` (programs of the other K tiles may write it too: the
    same values). Rows without NaN/inf are never written."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    rows64 = rows.to(tl.int64)
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask, other=0.0)
    x = x.to(tl.float32)
    # x - x is 0 for finite values and NaN for NaN and +-inf; a NaN in the sum marks the row.
    flag = tl.sum(x - x, axis=1)
    bad = flag != flag
    if tl.max(bad.to(tl.int32), axis=0) > 0:
        nan = tl.full((BLOCK_M, BLOCK_N), float("nan"), tl.float32).to(out_ptr.dtype.element_ty)
        for n0 in range(0, N, BLOCK_N):
            ncols = n0 + tl.arange(0, BLOCK_N)
            tl.store(out_ptr + rows64[:, None] * stride_om + ncols[None, :] * stride_on, nan,
                     mask=bad[:, None] & (ncols < N)[None, :])


def propagate_nonfinite_rows_triton(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """:func:`fp8select.kernels.nonfinite.propagate_nonfinite_rows` as one Triton launch
    (arguments checked by the caller): reads ``x`` once, writes only the NaN rows of ``out``."""
    m, k = x.shape
    n = out.shape[1]
    block_k = min(triton.next_power_of_2(k), 1024)
    block_m = min(triton.next_power_of_2(m), max(1, 4096 // block_k))
    block_n = min(triton.next_power_of_2(n), 1024)
    grid = (triton.cdiv(m, block_m), triton.cdiv(k, block_k))
    _nan_rows_kernel[grid](x, out, m, n, k, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                           BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_N=block_n, num_warps=4)
    return out
