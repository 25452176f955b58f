"""``reference``: pure torch, any device. Slow, the yardstick for the others.

It quantizes activations exactly as the fast backends do (1x128 groups, e4m3), so its result
is the function every backend must compute, not an unquantized approximation of it. It
multiplies so that an output row depends only on its input row (batch-invariant by
construction, :attr:`ReferenceBackend.invariant`): exact fp8 block products in float64, scaled
and added per block in a fixed order (:func:`fp8select.kernels.exact.block_scaled_product` says why).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from fp8select.backends.base import Backend, PreparedWeight
from fp8select.capabilities import Capabilities
from fp8select.kernels.exact import block_scaled_product
from fp8select.probes import Float8Dtype, Probe


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int],
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight`` [N, K] fp8 times its block scales, as ``dtype``."""
    n, k = weight.shape
    bn, bk = block_size
    expanded = scale.to(dtype).repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return weight.to(dtype) * expanded


def dequantize_activation(x_q: torch.Tensor, scale: torch.Tensor, group: int = 128,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x_q`` [M, K] fp8 times its per-token group scales [M, ceil(K/group)], as ``dtype``."""
    k = x_q.shape[1]
    return x_q.to(dtype) * scale.to(dtype).repeat_interleave(group, dim=1)[:, :k]


class ReferenceBackend(Backend):
    name = "reference"
    summary = "pure torch (exact fp8 block products in fp64, scaled per block); any device, slow"
    invariant: ClassVar[str | None] = ("exact fp8 block sums in float64, scaled and added per block in a fixed order "
                 "(fp8select/kernels/exact.py)")
    requires: ClassVar[tuple[Probe, ...]] = (Float8Dtype("float8_e4m3fn"),)
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    activation_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def weight_dtype(self, caps: Capabilities) -> torch.dtype:
        return torch.float8_e4m3fnuz if caps.gfx_arch == "gfx942" else torch.float8_e4m3fn

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        from fp8select.kernels.quant import quantize_per_token_group

        if input_scale is None:
            x_q, input_scale = quantize_per_token_group(x, prepared.block_size[1], dtype=prepared.weight.dtype)
        else:
            x_q = x
        out = block_scaled_product(x_q, input_scale, prepared.weight, prepared.scale, prepared.block_size)
        if bias is not None:
            out = out + bias.to(torch.float64)
        return out.to(out_dtype)
