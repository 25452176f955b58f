"""NaN output rows for kernels that quantize activations where fp8select cannot see it.

fp8select's own quantizers give a token a NaN output row when its activation holds a NaN or
+-inf (see :mod:`.quant`), as the fp64 reference and a bf16 matmul do. A vendor kernel that
takes bf16 activations and quantizes them inside (FlashInfer's sm90 block-scale GEMM, for
one) may drop NaN in its own amax and return a finite row: silently wrong.
:func:`propagate_nonfinite_rows` repairs its output after the call: every row of ``out`` whose
row of ``x`` holds a NaN or +-inf becomes NaN; every other row is left untouched (not even
rewritten). On a GPU it is one small Triton kernel (:mod:`.triton_nonfinite`: reads ``x``
once, writes only the NaN rows); elsewhere, or without triton, a torch expression. Neither
synchronises with the host or allocates host memory, so both can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

__all__ = ["propagate_nonfinite_rows"]


def propagate_nonfinite_rows(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Set, in place, ``out[i, :]`` to NaN for every row ``i`` of ``x`` holding a NaN or +-inf.

    Args:
        x: ``[M, K]`` floating-point activation (any strides).
        out: ``[M, N]`` floating-point result on the same device (any strides).

    Returns:
        ``out``. Rows of ``x`` without NaN/inf leave their rows of ``out`` bit for bit as they were.
    """
    if x.dim() != 2 or out.dim() != 2 or x.shape[0] != out.shape[0]:
        raise ValueError(f"x must be [M, K] and out [M, N] with the same M, got {tuple(x.shape)} and {tuple(out.shape)}")
    if not (x.is_floating_point() and out.is_floating_point()):
        raise ValueError(f"x and out must be floating point, got {x.dtype} and {out.dtype}")
    if x.device != out.device:
        raise ValueError(f"x and out must be on one device, got {x.device} and {out.device}")
    if x.numel() == 0 or out.numel() == 0:
        return out
    if x.device.type in ("cuda", "xpu"):
        try:
            from fp8select.kernels.triton_nonfinite import propagate_nonfinite_rows_triton
        except ImportError:
            pass
        else:
            return propagate_nonfinite_rows_triton(x, out)
    bad = ~torch.isfinite(x).all(dim=1, keepdim=True)
    return out.masked_fill_(bad, float("nan"))
