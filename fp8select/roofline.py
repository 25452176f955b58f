"""The least time a block-FP8 linear can take: bytes over memory bandwidth, FLOPs over peak.

``bench`` reports measured times against these floors, and the plan's model
(:mod:`fp8select.measured.model`) expresses measured times as multiples of them, so that a
measurement of one shape says something about another. The ceilings are the lent H200's
(copy bandwidth measured there, FP8 peak from the datasheet); on another device the floors
are off by a constant factor, which cancels in the model's comparisons. Pure Python.
"""

from __future__ import annotations

import math

__all__ = ["FP8_PEAK_FLOPS", "HBM_BYTES_PER_S", "floor_us", "floors_us", "min_bytes", "quant_bytes", "weight_bytes"]

HBM_BYTES_PER_S = 4.3e12
"""Device-to-device copy rate measured on the lent H200 (reads plus writes)."""

FP8_PEAK_FLOPS = 1979e12
"""H100/H200 SXM dense FP8 rate, datasheet."""


def weight_bytes(n: int, k: int) -> int:
    """The fp8 weight and its fp32 128x128 block scales: what every call reads, whatever M."""
    return n * k + math.ceil(n / 128) * math.ceil(k / 128) * 4


def min_bytes(n: int, k: int, m: int) -> int:
    """The fewest bytes one call must move: fp8 weight, its 128x128 scales, bf16 input and output."""
    return weight_bytes(n, k) + m * k * 2 + m * n * 2


def quant_bytes(m: int, k: int, group: int = 128) -> int:
    """What a separate activation quantizer moves: the bf16 input read, fp8 values and fp32 group scales
    written (a GEMM that quantizes in its prologue moves none of it)."""
    return m * k * 2 + m * k + m * math.ceil(k / group) * 4


def floors_us(n: int, k: int, m: int) -> tuple[float, float]:
    """(memory floor, FP8 compute floor) of one ``[m, k] x [n, k]^T`` call, in microseconds."""
    return min_bytes(n, k, m) / HBM_BYTES_PER_S * 1e6, 2 * m * n * k / FP8_PEAK_FLOPS * 1e6


def floor_us(n: int, k: int, m: int) -> float:
    """The larger of the two floors: no kernel can be faster."""
    return max(floors_us(n, k, m))
