"""How long each backend takes for a layer and M bucket: measured, or estimated from other shapes.

:class:`Measurements` indexes the tuning tables of one device (read once per resolution, then
immutable). For a backend it uses the rows measured at the versions installed here; when
there are none, the rows of another version of that backend on this device (its speed rarely
changes much between releases, and any data beats none), and says so.

:meth:`Measurements.estimate` answers per (backend, N, K, bucket):

* **measured**: the table has this shape at this bucket (at decode, a vendor kernel's row a little
  below both neighbouring buckets' counts as the median of the three: :func:`_lucky_dip`). A row with a
  launch configuration (Triton's) gives way to a larger bucket's that ran more rows in less time, by more
  than :data:`FEWER_ROWS`: that configuration and time stand in (:func:`fewer_rows`; the search tried other
  paths there, so a table holds such rows: on the H200's, Triton's ``wgmma`` path at M 128 of 5120x1280 took
  8.0 us where M 64's own configuration took 10.6; at its 73 such rows, the two configurations timed together
  by ``benchmarks/fewer_rows.py`` on an H100 SXM, the one taken was faster at 72, 0.89x the time in geomean);
* **model**: the shape was never measured. The estimate is the time of the fastest backend at
  this shape and bucket, times this backend's standing relative to the fastest, each the weighted
  median of its values at the measured shapes (in order of value, the first at which the weight
  reaches half the total)::

      log(best / floor):  the weighted median of log(best_i / floor_i) over the shapes i measured at this bucket
      log(t / best):      the weighted median of log(t_j / best_j) over the shapes j where this backend ran
      w = 1 / (d + 0.5)**4 * (0.1 where DeepGEMM's output tile differs),
      d = sqrt((2 log2(N'/N))**2 + (log2(K'/K))**2)

  ``floor`` is the roofline floor (:func:`fp8select.roofline.floor_us`). N counts twice: it sets how
  many output tiles a shape has, so its waves over the SMs, what moves a backend's standing most; K
  only the length of each tile's loop. A shape where DeepGEMM picks another tile width at this M than at
  the layer's (:func:`fp8select.measured.deepgemm_tiles.deepgemm_block_n`) counts a tenth
  (:data:`TILE_PENALTY`; on the devices whose DeepGEMM choice that restates,
  :data:`~fp8select.measured.deepgemm_tiles.DEVICES`): where DeepGEMM's pick is slow, the fastest is
  another backend, and every standing is another. The distance's constants were chosen among 48 (eps
  0.25-1, power 1-4, N counted 0.5-3 times), the tile's weight among 0.05-0.3 (any of them improved
  every geomean), on the table's folds, and checked on other runs' shapes the table lacks
  (docs/performance-measurements.md, "The model for shapes in no table"). A shape with rows of its own
  at some buckets (measured at load time within a budget, or a backend its measurement left out) is
  modelled from the other shapes only, then scaled to its own speed: times ``best_measured / best_modelled``
  at its measured buckets (the fastest row there over the least modelled estimate), interpolated in
  log M between the nearest two, the nearest one's beyond them. The model's absolute level can be 2-3x
  off on small shapes (launch-bound at 5-7 us where the floor says 2); its standings are what it
  knows, and a measured row must not be compared with an estimate of another level. A median, not a mean: a
  backend's standing jumps irregularly between neighbouring shapes (Triton against cuBLAS at M 256:
  1.56x at 5120x5120, 0.94x at 12288x4096), and one such neighbour moves a mean across a near tie but
  not a median. ``benchmarks/model_check.py`` scores it from measurements alone, each shape of the table
  left out in turn; its figures: docs/performance.md, "Shapes in no table"; what else was tried:
  docs/performance-measurements.md.
  A modelled estimate names the measured shapes its backend's standing came from, with their shares
  of the weight (``sources``; the three largest in ``detail``, which ``explain --layer`` shows, with
  the standing and the nearest shape where it was measured). Where that matters, measure: ``fp8select tune``,
  or load-time measurement (the default where the cache directory can be written: :mod:`fp8select.measure.loadtime`).
  ``fp8select tune --shapes N,K`` measures a shape exactly; a launch configuration (Triton's) is
  borrowed from the measured shape of the largest weight (the estimate says which: ``config_shape``), and the
  backend fits it to this one (:meth:`fp8select.backends.base.Backend.fit_config`).

* **model, between buckets**: no shape was measured at this bucket with this backend (a table timed at some
  M only: ``tune --m``, or rows that load-time measurement took at the closest contests first), but some were
  below and above it: the backend's estimates at (N, K) at the nearest such buckets, interpolated in log time
  over ``log2 M``, and the upper one's launch configuration. Nothing beyond the measured range. Each bucket of
  the H200 table left out of every shape at once (``benchmarks/model_check.py``'s ``leave_one_bucket_out``)
  is planned within 1.021 / 1.309 of the fastest backend with the vendors and 1.006 / 1.194 without (geomean
  / worst), where the priority order, which ran there before, scores 1.067 / 1.808 and 1.218 / 3.140.

A backend with no row on this device at all, or none at the bucket and none on one side of it, has no estimate;
where no backend has one, the plan falls back to the priority order (:mod:`fp8select.plan`). Pure Python.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fp8select.buckets import M_BUCKETS, between, bucket_index
from fp8select.measured.deepgemm_tiles import DEVICES, deepgemm_block_n
from fp8select.measured.table import used_versions, versions_text
from fp8select.roofline import floor_us

__all__ = ["FEWER_ROWS", "Estimate", "Measurements", "Row", "fewer_rows"]

MEASURED, MODEL = "measured", "model"
_EPS = 0.5
_POWER = 4
_N_WEIGHT = 2.0
TILE_PENALTY = 0.1
"""The weight of a measured shape, relative to its distance's, where DeepGEMM picks another output tile width
at the bucket than at the layer's shape."""
_NAMED = 3  # measured shapes a modelled estimate's detail names
FEWER_ROWS = 1.05
"""How much faster a larger bucket's launch configuration must have run than a bucket's own for it to stand in
there (:func:`fewer_rows`): beyond the spread of two timings of one kernel (up to 3% between runs), so that a row
is not traded for a luckier timing of another."""
DECODE_MAX = 16
"""Largest decode bucket: up to it a vendor kernel's row below both its neighbours counts as their median."""
LUCKY = 1.15
"""How far below that median such a row may lie and still count as a lucky timing (a time moves up to
1.15x between runs at decode); further below, the kernel there is another."""


class Row(NamedTuple):
    """One measurement: whole-op median time, the launch configuration it was taken with, and how many runs'
    timings the time is the geometric mean of (made from a table's row where a plan reads it); ``taken``: where a
    larger bucket's configuration stands in (:func:`fewer_rows`), that bucket and this bucket's own time."""

    us: float
    config: Mapping[str, Any] | None = None
    runs: int = 1
    taken: tuple[int, float] | None = None


@dataclass(frozen=True)
class Estimate:
    """A backend's expected time at one (N, K, bucket), and where the number comes from."""

    us: float
    source: str  # MEASURED or MODEL
    detail: str
    config: Mapping[str, Any] | None = None
    config_shape: tuple[int, int] | None = None  # the (N, K) ``config`` was measured at (MODEL: the nearest shape)
    sources: tuple[tuple[tuple[int, int], float], ...] = ()  # MODEL: the measured shapes and their share, largest first


class _Modelled(NamedTuple):
    """A backend's estimate at a shape from the other shapes: log time, standing, the shapes' shares of the
    weight, and the nearest shape with that standing."""

    log_us: float
    standing: float
    shares: dict[tuple[int, int], float]
    at: tuple[int, int]


@dataclass(frozen=True)
class _BackendRows:
    """One backend's rows at the versions used: per shape, its buckets' rows as the table holds them
    (``{"16": {"us": ..., "config": ...}}``), made into :class:`Row` where read (a table has thousands of
    rows, read at every resolution; a plan reads a few). A shape's rows as estimates read them
    (:meth:`buckets`: a larger bucket's launch configuration standing in where it ran faster) are made at
    their first read and remembered."""

    versions: Mapping[str, str]
    exact: bool  # measured at the versions installed here
    shapes: Mapping[tuple[int, int], Mapping[str, Mapping[str, Any]]]
    _read: dict[tuple[int, int], Mapping[str, Mapping[str, Any]]] = field(default_factory=dict, compare=False,
                                                                           repr=False)

    def buckets(self, shape: tuple[int, int]) -> Mapping[str, Mapping[str, Any]]:
        """``shape``'s rows per bucket as estimates read them (:func:`fewer_rows`); none where it has none."""
        if shape not in self._read:
            self._read[shape] = fewer_rows(self.shapes.get(shape, {}))
        return self._read[shape]

    def row(self, shape: tuple[int, int], bucket: int) -> Row | None:
        found = self.buckets(shape).get(str(bucket))
        if found is None:
            return None
        taken = (found["taken_m"], found["own_us"]) if "taken_m" in found else None
        return Row(_us(found), found.get("config"), found.get("runs", 1), taken)


class Measurements:
    """The usable rows of one device's tables, per backend (immutable once built; estimates are remembered)."""

    def __init__(self, device_name: str, tables: Iterable[Mapping[str, Any]],
                 installed: Mapping[str, Mapping[str, str]]) -> None:
        """``tables``: valid tables of this device, later ones winning on equal keys;
        ``installed``: per backend name, the versions found here (:func:`~.table.backend_versions`)."""
        self.device_name = device_name
        self._tiled = device_name in DEVICES  # weigh shapes by DeepGEMM's tile too (_weights_at)
        groups: dict[str, dict[tuple[tuple[str, str], ...], dict[tuple[int, int], dict[str, Any]]]] = {}
        for table in tables:
            for group in table["groups"]:
                key = tuple(sorted(group["versions"].items()))
                shapes = groups.setdefault(group["backend"], {}).setdefault(key, {})
                for shape, buckets in group["shapes"].items():
                    n, k = shape.split(",")
                    shapes.setdefault((int(n), int(k)), {}).update(buckets)
        self._rows: dict[str, _BackendRows] = {}
        for backend, by_versions in groups.items():
            key, exact = used_versions(by_versions, installed.get(backend, {}))
            self._rows[backend] = _BackendRows(dict(key), exact, by_versions[key])
        self._memo: dict[tuple[str, int, int, int], Estimate | None] = {}  # estimate(), remembered
        # Remembered too, each a function of the rows and made at the first modelled estimate (a plan whose
        # shapes the tables hold needs none): per (backend or None for the fastest, bucket) the values the
        # model's medians take, in order; per layer shape and bucket every measured shape's weight; per backend and
        # bucket the shapes measured; the fastest backend's time per (shape, bucket), which standings are
        # relative to.
        self._ordered: dict[tuple[str | None, int], list[tuple[tuple[int, int], float]]] = {}
        self._weights: dict[tuple[int, int, int], dict[tuple[int, int], float]] = {}
        self._trained: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}
        self._fastest: dict[tuple[tuple[int, int], int], float] | None = None
        self._modelled: dict[tuple[str, int, int, int], _Modelled | None] = {}  # _model_from_others(), remembered
        self._levels: dict[tuple[int, int], dict[int, float]] = {}  # per shape with rows: bucket -> log(measured / modelled)

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(sorted(self._rows))

    def shapes(self, backend: str) -> tuple[tuple[int, int], ...]:
        rows = self._rows.get(backend)
        return tuple(sorted(rows.shapes)) if rows else ()

    def buckets_held(self, n: int, k: int) -> frozenset[int]:
        """The M buckets where some backend has a row measured at (N, K)."""
        return frozenset(int(b) for rows in self._rows.values() for b in rows.shapes.get((n, k), {}))

    def describe(self) -> str:
        """One line per backend: how many shapes, and at which versions."""
        lines = []
        for name, rows in sorted(self._rows.items()):
            which = "installed versions" if rows.exact else f"other versions ({versions_text(rows.versions)})"
            lines.append(f"{name}: {len(rows.shapes)} shapes measured on {self.device_name}, {which}")
        return "\n".join(lines)

    def estimate(self, backend: str, n: int, k: int, bucket: int) -> Estimate | None:
        """The expected whole-op time of ``backend`` at (N, K) and M bucket ``bucket``, or None.

        Remembered per argument: a modelled estimate interpolates over every measured shape (about 10 ms
        per layer shape, every backend and bucket, with the H200 table's 99 on a slow CPU), and a model's
        layers repeat a few shapes.
        The answer is a function of the rows alone, so a second thread computing it meanwhile writes
        the same value."""
        key = (backend, n, k, bucket)
        if key not in self._memo:
            self._memo[key] = self._estimate(backend, n, k, bucket)
        return self._memo[key]

    def _estimate(self, backend: str, n: int, k: int, bucket: int) -> Estimate | None:
        rows = self._rows.get(backend)
        if rows is None:
            return None
        note = "" if rows.exact else f", measured with {versions_text(rows.versions)}"
        row = rows.row((n, k), bucket)
        if row is not None:
            median = _lucky_dip(rows, (n, k), bucket, row)
            if median is not None:
                return Estimate(median, MEASURED, f"{median:.1f} us measured at the buckets around it ({row.us:.1f} "
                                f"here, below both: a lucky timing of a kernel whose decode time is flat){note}",
                                row.config, (n, k))
            runs = f" (the mean of {row.runs} runs)" if row.runs > 1 else ""
            taken = "" if row.taken is None else (f" at M {row.taken[0]} with its launch configuration, which takes no "
                                                  f"longer on fewer rows ({row.taken[1]:.1f} us with this bucket's own)")
            return Estimate(row.us, MEASURED, f"{row.us:.1f} us measured{taken}{runs}{note}", row.config, (n, k))
        modelled = self._model_from_others(backend, n, k, bucket)
        if modelled is None:
            return self._between(backend, n, k, bucket, note)
        standing, (mn, mk) = modelled.standing, modelled.at
        level = self._level(n, k, bucket)
        us = math.exp(modelled.log_us + level)
        sources = tuple(sorted(modelled.shares.items(), key=lambda item: (-item[1], item[0])))
        nearest = sources[0][0]
        named = ", ".join(f"{sn}x{sk} {share:.0%}" for (sn, sk), share in sources[:_NAMED])
        scaled = f", scaled {math.exp(level):.2f}x to this shape's measured speed" if level else ""
        detail = (f"{us:.1f} us modelled from {len(sources)} measured shapes ({named}{', ...' if len(sources) > _NAMED else ''}),"
                  f" {math.exp(standing):.2f}x the fastest as at {mn}x{mk}{scaled}{note}")
        return Estimate(us, MODEL, detail, rows.row(nearest, bucket).config, nearest, sources)  # type: ignore[union-attr]

    def _between(self, backend: str, n: int, k: int, bucket: int, note: str) -> Estimate | None:
        """At a bucket where ``backend`` was measured at no shape, between the nearest two where it was: its
        estimates at (N, K) there, interpolated in log time over log2 M, with the upper one's launch configuration
        (its tiles take the rows of every M up to it); None beyond the measured range."""
        around = between([b for b in M_BUCKETS if self._train(backend, b)], bucket)
        if around is None:
            return None
        low, high, t = around
        below, above = self.estimate(backend, n, k, low), self.estimate(backend, n, k, high)
        if below is None or above is None:  # not reached: a bucket with rows estimates every shape
            return None
        us = below.us ** (1 - t) * above.us ** t
        detail = (f"{us:.1f} us interpolated between M {low} ({below.us:.1f} us, {below.source}) and M {high} "
                  f"({above.us:.1f} us, {above.source}): no shape measured at M {bucket}{note}")
        return Estimate(us, MODEL, detail, above.config, above.config_shape, above.sources)

    def _model_from_others(self, backend: str, n: int, k: int, bucket: int) -> _Modelled | None:
        """``backend``'s model at (N, K) from the other shapes (never (N, K)'s own rows); None where it was
        measured at no other shape at this bucket."""
        key = (backend, n, k, bucket)
        if key not in self._modelled:
            found = None
            if any(shape != (n, k) for shape in self._train(backend, bucket)):
                weights = self._weights_at(n, k, bucket)
                best_eff, _, _ = _weighted_median(self._values(None, bucket), weights, (n, k))
                standing, shares, at = _weighted_median(self._values(backend, bucket), weights, (n, k))
                found = _Modelled(math.log(floor_us(n, k, bucket)) + best_eff + standing, standing, shares, at)
            self._modelled[key] = found
        return self._modelled[key]

    def _level(self, n: int, k: int, bucket: int) -> float:
        """log(measured / modelled) of the fastest at (N, K): at a bucket with rows of its own, else interpolated
        in log M between the nearest two such buckets (the nearest one's beyond them); 0 without rows."""
        if (n, k) not in self._levels:
            levels = {}
            for b in sorted(self.buckets_held(n, k)):
                modelled = [found.log_us for name in self._rows if (found := self._model_from_others(name, n, k, b)) is not None]
                if modelled:
                    levels[b] = math.log(self._best()[((n, k), b)]) - min(modelled)
            self._levels[(n, k)] = levels
        levels = self._levels[(n, k)]
        if not levels or bucket in levels:
            return levels.get(bucket, 0.0)
        around = between(levels, bucket)
        if around is None:  # beyond the buckets with rows: the nearest one's
            return levels[max(levels) if bucket > max(levels) else min(levels)]
        lo, hi, f = around
        return (1 - f) * levels[lo] + f * levels[hi]

    def _values(self, backend: str | None, bucket: int) -> list[tuple[tuple[int, int], float]]:
        """The model's values at ``bucket`` in increasing order, per measured shape: the fastest backend's
        log(best / floor) (``backend`` None), else ``backend``'s standing log(time / best)."""
        key = (backend, bucket)
        if key not in self._ordered:
            best = self._best()
            if backend is None:
                points = [(shape, math.log(best[(shape, b)] / floor_us(*shape, b))) for (shape, b) in best if b == bucket]
            else:
                rows = self._rows[backend]
                points = [(shape, math.log(_us(rows.buckets(shape)[str(bucket)]) / best[(shape, bucket)]))
                          for shape in self._train(backend, bucket)]
            self._ordered[key] = sorted(points, key=lambda point: point[1])
        return self._ordered[key]

    def _weights_at(self, n: int, k: int, bucket: int) -> dict[tuple[int, int], float]:
        """Every measured shape's weight for a layer of shape (N, K) at ``bucket``: 1 / (distance + eps) ** power,
        times :data:`TILE_PENALTY` where DeepGEMM picks another tile width there than at (N, K) (on
        :data:`~fp8select.measured.deepgemm_tiles.DEVICES`)."""
        if (n, k, bucket) not in self._weights:
            tile = deepgemm_block_n(bucket, n, k) if self._tiled else 0
            self._weights[(n, k, bucket)] = {
                shape: (1.0 if not self._tiled or deepgemm_block_n(bucket, *shape) == tile else TILE_PENALTY)
                / (_distance(shape, n, k) + _EPS) ** _POWER for shape in dict.fromkeys(shape for shape, _ in self._best())}
        return self._weights[(n, k, bucket)]

    def _train(self, backend: str, bucket: int) -> tuple[tuple[int, int], ...]:
        """The shapes ``backend`` was measured at in ``bucket``, in order."""
        key = (backend, bucket)
        if key not in self._trained:
            shapes = self._rows[backend].shapes
            self._trained[key] = tuple(sorted(s for s, rows in shapes.items() if str(bucket) in rows))
        return self._trained[key]

    def _best(self) -> dict[tuple[tuple[int, int], int], float]:
        """The fastest backend's time per (shape, bucket), over the rows used."""
        if self._fastest is None:
            fastest: dict[tuple[tuple[int, int], int], float] = {}
            for rows in self._rows.values():
                for shape in rows.shapes:
                    for bucket, row in rows.buckets(shape).items():
                        key, us = (shape, int(bucket)), _us(row)
                        fastest[key] = min(fastest.get(key, us), us)
            self._fastest = fastest
        return self._fastest


def _lucky_dip(rows: _BackendRows, shape: tuple[int, int], bucket: int, row: Row) -> float | None:
    """The median of ``row`` and the rows at its two nearest buckets (the two above the first) where ``row``
    is a lucky dip: a row without a launch configuration at a decode bucket (M <= :data:`DECODE_MAX`),
    below both neighbours' by at most :data:`LUCKY`; None otherwise, or where a neighbour has no row.

    A backend without launch configurations (a vendor's kernel, its own heuristics choosing the tile)
    streams the weight once at decode, so its time there is flat in M; a row below both neighbours is a
    lucky timing (or the fast side of a time that changes between captures), and taken at its word it
    wins near ties that later runs order the other way. Re-scored on the H200's kept runs (2,772 shipped
    points timed again, each run's backends together; docs/performance-measurements.md), counting such a
    row as the median took the worst point of 75 shapes from 1.070x to 1.043x the fastest backend and one
    point from 1.000 to 1.012; beyond M 16 a row below its neighbours is more often a real change of tile
    (DeepGEMM's and FlashInfer's at M 64) and the same rule raised the worst to 1.06x. Further below
    than :data:`LUCKY` is a real change too. Triton's rows are each its search's pick at that bucket,
    another kernel per bucket: left as measured."""
    if row.config is not None or bucket > DECODE_MAX:
        return None
    i = bucket_index(bucket)
    around = [rows.row(shape, b) for b in ((M_BUCKETS[1], M_BUCKETS[2]) if i == 0 else (M_BUCKETS[i - 1], M_BUCKETS[i + 1]))]
    if around[0] is None or around[1] is None:
        return None
    median = sorted((around[0].us, around[1].us, row.us))[1]
    return median if row.us < median <= row.us * LUCKY else None


def fewer_rows(buckets: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    """One shape's rows of a backend with launch configurations, each replaced by the fastest row of a larger
    bucket where that one took less than ``1 / FEWER_ROWS`` of its time: that configuration, measured on more
    rows, runs this bucket's no slower (the same programs or fewer, each with the same work). The replaced row
    keeps its own time (``own_us``) and names the bucket it comes from (``taken_m``). Rows without a
    configuration (a vendor's, its heuristics picking the kernel by M) are left as they are."""
    if not any(row.get("config") is not None for row in buckets.values()):
        return buckets
    out = dict(buckets)
    fastest: tuple[str, Mapping[str, Any]] | None = None  # the fastest row of the larger buckets
    for bucket in sorted(buckets, key=int, reverse=True):
        row = buckets[bucket]
        if row.get("config") is None:
            continue
        if fastest is not None and _us(fastest[1]) * FEWER_ROWS < _us(row):
            out[bucket] = {**fastest[1], "taken_m": int(fastest[0]), "own_us": _us(row)}
        if fastest is None or _us(row) < _us(fastest[1]):
            fastest = (bucket, row)
    return out


def _us(row: Mapping[str, Any]) -> float:
    """A table row's time (JSON may hold it as an int)."""
    return float(row["us"])


def _distance(shape: tuple[int, int], n: int, k: int) -> float:
    return math.hypot(_N_WEIGHT * math.log2(shape[0] / n), math.log2(shape[1] / k))


def _weighted_median(ordered: list[tuple[tuple[int, int], float]], weights: Mapping[tuple[int, int], float],
                     without: tuple[int, int]) -> tuple[float, dict[tuple[int, int], float], tuple[int, int]]:
    """The weighted median of values at measured shapes but ``without`` (``ordered`` by value; see the module
    docstring), each shape's share of the weight, and the nearest shape with that value."""
    ordered = [point for point in ordered if point[0] != without]
    reached = list(itertools.accumulate(weights[shape] for shape, _ in ordered))
    _, median = ordered[bisect.bisect_left(reached, reached[-1] / 2)]
    at = max((shape for shape, value in ordered if value == median), key=lambda shape: (weights[shape], shape))
    return median, {shape: weights[shape] / reached[-1] for shape, _ in ordered}, at
