"""M buckets: the one rule that groups calls by their number of rows.

A bucket is a power of two ``b`` in 1..8192 and holds every M with ``b/2 < M <= b`` (M above
8192 shares the last bucket). Measurements are taken at ``M = b`` and plans hold one route per
bucket. Pure Python: no torch, no triton.
"""

from __future__ import annotations

import math
from collections.abc import Collection

__all__ = ["BUCKET_INDEX", "M_BUCKETS", "M_BUCKET_MAX", "between", "bucket_ends", "bucket_index", "bucket_range",
           "m_bucket", "span"]

M_BUCKET_MAX = 8192
"""Largest bucket; larger M shares it."""

M_BUCKETS: tuple[int, ...] = tuple(2**i for i in range(M_BUCKET_MAX.bit_length()))
"""Every bucket, smallest first: 1, 2, 4, ..., 8192."""


def bucket_index(m: int) -> int:
    """Position of ``m``'s bucket in :data:`M_BUCKETS` (0 for M <= 1)."""
    if m <= 1:
        return 0
    return min((m - 1).bit_length(), len(M_BUCKETS) - 1)


BUCKET_INDEX: tuple[int, ...] = tuple(bucket_index(m) for m in range(M_BUCKET_MAX + 1))
"""``bucket_index(m)`` for m in 0..M_BUCKET_MAX as a table (M beyond it: the last bucket), for
call paths where a function call per lookup shows."""


def m_bucket(m: int) -> int:
    """The bucket of ``m``: the next power of two >= ``m``, at least 1, at most 8192."""
    return M_BUCKETS[bucket_index(m)]


def bucket_range(bucket: int) -> tuple[int, int | None]:
    """The M a bucket holds, ``(lo, hi)`` inclusive; ``hi`` is None for the last (unbounded) one."""
    lo = bucket // 2 + 1 if bucket > 1 else 1
    return lo, None if bucket == M_BUCKET_MAX else bucket


def bucket_ends(bucket: int) -> tuple[int, ...]:
    """The M at both ends of ``bucket`` (one where it holds one M, or has no upper end): where a gate is asked."""
    lo, hi = bucket_range(bucket)
    return (lo,) if hi is None or hi == lo else (lo, hi)


def span(lo: int, hi: int | None) -> str:
    """An M range as plans print it: ``M 3-4``, ``M 1``, ``M >= 4097``, ``any M``."""
    if hi is None:
        return "any M" if lo == 1 else f"M >= {lo}"
    return f"M {lo}" if lo == hi else f"M {lo}-{hi}"


def between(measured: Collection[int], bucket: int) -> tuple[int, int, float] | None:
    """The nearest buckets of ``measured`` below and above ``bucket``, and how far ``bucket`` lies from the lower
    toward the upper in ``log2 M`` (0 to 1): where the models interpolate a bucket no shape was measured at.
    None where ``measured`` has none on one side."""
    low = max((b for b in measured if b < bucket), default=None)
    high = min((b for b in measured if b > bucket), default=None)
    if low is None or high is None:
        return None
    return low, high, math.log2(bucket / low) / math.log2(high / low)
