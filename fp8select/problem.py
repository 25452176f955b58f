"""The problem a layer poses: shapes, block size and dtypes (pure values)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Problem:
    """One block-FP8 linear layer: ``y[M, N] = x[M, K] @ dequant(w[N, K]).T``.

    ``m`` is None for load-time questions (any batch), an int for a particular call.
    ``act_dtype`` is the dtype the caller passes (an fp8 dtype when pre-quantized).
    """

    n: int
    k: int
    block_size: tuple[int, int] = (128, 128)
    m: int | None = None
    weight_dtype: torch.dtype = torch.float8_e4m3fn
    act_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype = torch.bfloat16

    @property
    def pre_quantized(self) -> bool:
        return self.act_dtype.is_floating_point and self.act_dtype.itemsize == 1

    def describe(self) -> str:
        m = "any M" if self.m is None else f"M={self.m}"
        bn, bk = self.block_size
        return (f"N={self.n}, K={self.k}, {m}, block [{bn}, {bk}], weight {_short(self.weight_dtype)}, "
                f"input {_short(self.act_dtype)}, output {_short(self.out_dtype)}")


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return _short(dtype)
