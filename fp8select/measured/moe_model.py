"""How long a MoE experts op would take at a shape no table holds, per route and M bucket.

A MoE route's speed at one point is set by how many tokens each expert gets (``M * k / E`` under
uniform routing: DeepGEMM pads each expert's rows to 128, so few tokens per expert waste its tiles,
many amortise its launches) and by the size of one expert (``3 * H * I`` weights: the bytes each
touched expert costs and the FLOPs per token). Each measured point ``(shape, M)`` therefore sits at
a position in two coordinates, ``log2(M * k / E)`` and ``log2(3 * H * I)``, and a route's estimate
at an unmeasured shape comes from the measured shapes at the same M bucket, nearest first, in the
form :mod:`fp8select.measured.model` uses for the dense layers::

    log(best / ref)  = sum_i w_i log(best_i / ref_i) / sum_i w_i   (every measured shape i at this M)
    log(t / best)    = sum_j w_j log(t_j / best_j)   / sum_j w_j   (the shapes j where this route ran)
    w = 1 / (d + 0.5)**2,   d = Euclidean distance between the positions

A bucket no shape was measured at, between two that some were (a table timed at some M only, as the H100
SXM's), takes the level and the standing that the nearest measured buckets on either side give, interpolated
in ``log2 M``; none beyond the measured range (standings change with M: decode and prefill favour other
routes). Left out one bucket at a time, that picks within 1.005x / 1.064x of the fastest route (geomean,
worst) on the H200's rows and 1.003x / 1.043x on the H100 SXM's (``moe_model_check``'s
``leave_one_bucket_out``).

``best`` is the fastest route's time at a point; ``t / best`` a route's *standing* there, which is
what the plan's choice depends on (the route with the least standing has the least estimate). Where the
rows hold times under skewed routing too, :class:`~fp8select.measured.moe.MoeMeasurements` builds a second
model from those (an estimate's ``skewed_us``), and the plan ranks the two as it ranks measured rows.
``ref`` (:func:`moe_reference_us`) only sets the level of the times shown: the larger of the HBM floor
of the experts a uniform batch touches and the FP8 compute floor, plus :data:`FIXED_US` of launches.

Why so simple: five shapes are measured on the H200, too few to fit anything with more parameters
(the constants are the ones the dense model had then, not refitted; adding ``log2 E`` or ``log2 M`` as coordinates
moved the left-out figures by at most 0.3%, pooling every M bucket made them worse). How its choices
score with each shape left out and planned from the others, against the rule and always running one
route: ``docs/moe.md`` ("Shapes no table holds", from ``python -m benchmarks.moe_model_check``).
Deterministic and explainable: an estimate names the measured shapes its standing came from with
their shares of the weight. Pure Python (the tables are small: no numpy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fp8select.buckets import between
from fp8select.roofline import FP8_PEAK_FLOPS, HBM_BYTES_PER_S, weight_bytes

__all__ = ["FIXED_US", "MoeEstimate", "MoeModel", "moe_reference_us"]

MoeShape = tuple[int, int, int, int]
RouteRows = Mapping[str, Mapping[MoeShape, Mapping[int, float]]]
"""``"backend/layout"`` -> shape ``(E, H, I, k)`` -> M bucket -> measured microseconds."""

_EPS = 0.5
_POWER = 2
_NAMED = 3  # measured shapes an estimate's detail names
FIXED_US = 50.0
"""The whole op's launches around its grouped GEMMs (routing, quantization, permutation, silu*up,
weighted sum: about 15 us on the H200, ``benchmarks/moe.py --anatomy``) and more. It sets only the
level of the times shown (every route of a point shares it), never the choice; chosen when the table
was first measured, where with it the modelled times of the left-out shapes were 1.12x off in
geometric mean and 1.31x without (today's: ``docs/moe.md``)."""


def moe_reference_us(experts: int, hidden: int, intermediate: int, top_k: int, m: int) -> float:
    """The floor of one experts op at ``m`` tokens under uniform routing, plus :data:`FIXED_US`."""
    touched = experts * (1.0 - (1.0 - min(top_k, experts) / experts) ** m)  # experts a uniform batch reads, expected
    nbytes = touched * (weight_bytes(2 * intermediate, hidden) + weight_bytes(hidden, intermediate)) + m * hidden * 4
    flops = 2.0 * m * top_k * 3 * hidden * intermediate
    return max(nbytes / HBM_BYTES_PER_S, flops / FP8_PEAK_FLOPS) * 1e6 + FIXED_US


def _shape_text(shape: MoeShape) -> str:
    return ",".join(str(v) for v in shape)


@dataclass(frozen=True)
class MoeEstimate:
    """A route's modelled time at one shape and M bucket, and the measured shapes it came from; ``skewed_us``
    its modelled time under skewed routing, where measured shapes have that time too."""

    us: float
    detail: str
    sources: tuple[tuple[MoeShape, float], ...]  # measured shapes and their share of the weight, largest first
    skewed_us: float | None = None

    def row(self) -> dict[str, float]:
        """As a measured row reads (``us``, and ``skewed_us`` where modelled), for the plan to rank alike."""
        return {"us": self.us} if self.skewed_us is None else {"us": self.us, "skewed_us": self.skewed_us}


def _position(shape: MoeShape, bucket: int) -> tuple[float, float]:
    experts, hidden, intermediate, top_k = shape
    return math.log2(bucket * top_k / experts), math.log2(3 * hidden * intermediate)


def _interpolate(at: tuple[float, float], points: list[tuple[MoeShape, tuple[float, float], float]]
                 ) -> tuple[float, dict[MoeShape, float]]:
    """Inverse-distance weighted mean of the values at measured positions, and each shape's share."""
    weights = [1.0 / (math.dist(pos, at) + _EPS) ** _POWER for _, pos, _ in points]
    total = sum(weights)
    mean = sum(w * v for w, (_, _, v) in zip(weights, points, strict=True)) / total
    return mean, {shape: w / total for w, (shape, _, _) in zip(weights, points, strict=True)}


class MoeModel:
    """Estimates over one device's MoE rows (immutable once built)."""

    def __init__(self, rows: RouteRows) -> None:
        """``rows``: the measured times per route (:class:`~fp8select.measured.moe.MoeMeasurements` picks
        each route's versions)."""
        self._rows = {route: {shape: dict(buckets) for shape, buckets in shapes.items()} for route, shapes in rows.items()}
        self._best: dict[tuple[MoeShape, int], float] = {}
        for shapes in self._rows.values():
            for shape, buckets in shapes.items():
                for bucket, us in buckets.items():
                    best = self._best.get((shape, bucket))
                    self._best[(shape, bucket)] = us if best is None else min(best, us)
        self._buckets = sorted({bucket for _, bucket in self._best})  # the M buckets some shape was measured at

    def estimate(self, route: str, shape: MoeShape, bucket: int) -> MoeEstimate | None:
        """``route``'s modelled time at ``shape`` and ``bucket``; None where it was measured at no shape there.
        At a bucket no shape was measured at but some were below and above it (a table timed at some M only),
        from the nearest such buckets: the level and the standing each gives, interpolated in ``log2 M``, where
        the route was measured at both (never beyond the measured range: standings change with M)."""
        parts = self._parts(route, shape, bucket)
        if parts is not None:
            level, standing, shares = parts
            return self._estimate(shape, bucket, level, standing, shares, "")
        if bucket in self._buckets:  # measured there, only not for this route
            return None
        around = between(self._buckets, bucket)
        if around is None:
            return None
        low, high, t = around
        below, above = self._parts(route, shape, low), self._parts(route, shape, high)
        if below is None or above is None:
            return None
        level, standing = ((1 - t) * x + t * y for x, y in zip(below[:2], above[:2], strict=True))
        shares = {s: (1 - t) * below[2].get(s, 0.0) + t * above[2].get(s, 0.0) for s in {*below[2], *above[2]}}
        return self._estimate(shape, bucket, level, standing, shares,
                              f" at M {low} and {high} (none measured at M {bucket})")

    def _parts(self, route: str, shape: MoeShape, bucket: int) -> tuple[float, float, dict[MoeShape, float]] | None:
        """The level (``log(best / ref)``) and ``route``'s standing (``log(t / best)``) modelled at ``shape`` from
        the shapes measured at ``bucket``, and each of those shapes' share of the standing's weight."""
        train = [(s, _position(s, bucket), math.log(b[bucket] / self._best[(s, bucket)]))
                 for s, b in sorted(self._rows.get(route, {}).items()) if bucket in b]
        if not train:
            return None
        at = _position(shape, bucket)
        level, _ = _interpolate(at, [(s, _position(s, bucket), math.log(best / moe_reference_us(*s, bucket)))
                                     for (s, b), best in sorted(self._best.items()) if b == bucket])
        standing, shares = _interpolate(at, train)
        return level, standing, shares

    @staticmethod
    def _estimate(shape: MoeShape, bucket: int, level: float, standing: float, shares: Mapping[MoeShape, float],
                  where: str) -> MoeEstimate:
        us = moe_reference_us(*shape, bucket) * math.exp(level + standing)
        sources = tuple(sorted(shares.items(), key=lambda item: (-item[1], item[0])))
        named = ", ".join(f"{_shape_text(s)} {share:.0%}" for s, share in sources[:_NAMED])
        more = ", ..." if len(sources) > _NAMED else ""
        detail = (f"modelled {us:.1f} us, {math.exp(standing):.2f}x the fastest route, from {len(sources)} measured "
                  f"shapes E,H,I,k ({named}{more}){where}")
        return MoeEstimate(us, detail, sources)
