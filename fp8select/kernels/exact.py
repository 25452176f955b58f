"""Block-scaled fp8 products computed so that each output row depends only on its input row.

Per K block, the fp8 values' dot products in float64 are exact whatever order a matmul kernel sums
them in (an e4m3 value is a multiple of 2^-9 below 2^9, so a product is a multiple of 2^-18 below
2^18 and a sum of 128 of them fits in 43 of float64's 53 bits; e4m3fnuz: 2^-10, 2^8, 43 bits too),
and the blocks' scaled sums are added in a fixed order by element-wise operations. An fp32 matmul
of the dequantized operands is not: torch's CPU kernels give M=1 and M>1 rows that differ in the
last bits (measured, torch 2.13: 411 of 512 fp32 outputs of a 512 x 1024 layer). The reference
backends (dense and MoE) multiply with it: batch-invariant by construction. Pure torch, slow.
"""

from __future__ import annotations

import torch

__all__ = ["block_scaled_product"]


def block_scaled_product(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                         block_size: tuple[int, int]) -> torch.Tensor:
    """``dequant(x_q) @ dequant(weight).T`` in float64, each row computed independently of the others:
    exact per-block fp8 dot products, scaled and summed over K blocks in order (the module docstring)."""
    n, k = weight.shape
    bn, bk = block_size
    a, w = x_q.to(torch.float64), weight.to(torch.float64)
    a_scale = x_scale.to(torch.float64)
    w_scale = scale.to(torch.float64).repeat_interleave(bn, dim=0)[:n]
    out = torch.zeros((x_q.shape[0], n), dtype=torch.float64, device=x_q.device)
    for j, k0 in enumerate(range(0, k, bk)):
        exact = a[:, k0:k0 + bk] @ w[:, k0:k0 + bk].t()
        out += exact * (a_scale[:, j:j + 1] * w_scale[:, j])
    return out
