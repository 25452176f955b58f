"""Summary statistics the benchmark tools report alike."""

from __future__ import annotations

import math
from collections.abc import Iterable


def geomean(values: Iterable[float]) -> float:
    """The geometric mean of positive ``values`` (at least one), rounded to four decimals as the reports print it."""
    logs = [math.log(v) for v in values]
    return round(math.exp(sum(logs) / len(logs)), 4)
