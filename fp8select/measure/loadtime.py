"""Measure a layer shape at load time, where the model is not sure (by default where the rows can be kept:
:func:`fp8select.measured.sources.wants_load_time_tuning`; ``FP8SELECT_TUNE=load`` or ``off`` decide instead).

The plan's model (:mod:`fp8select.measured.model`) picks well on average but can lose 10-25% at
a near tie on a shape far from any measured one. So a layer whose shape no table holds is measured
before its plan is made, but only where it matters: the M buckets whose best estimates lie within
:data:`CLOSE` of each other (and backends with no estimate at all), the closest contests first (equal ones
spread over M, :data:`SPREAD`), each of those backends once, Triton with at most two launch configurations,
within a time budget (``FP8SELECT_TUNE_BUDGET_S``, default 3 s: no point starts after it, so a shape takes 3-4 s and the
vendors' JIT compilation on a cold cache, where their first calls at a new shape take 2-4 s each and
a first start measures only a few rows). ``FP8SELECT_JIT_PROCESSES=N`` (for a cold JIT cache: a new
machine, a new model) first compiles the vendors' kernels at every open point of a shape measured for
the first time in up to N worker processes at once (:mod:`fp8select.jit_processes`), outside the budget,
so that the budget times instead of compiling. The rows join the cache directory's table; a later start
plans the shape from its rows (the buckets not measured yet by the model, scaled to the speed the rows
show) and measures the open buckets that are left, until none are; with a process group, rank 0
measures and every rank gets its rows (the same plans everywhere).

MoE experts layers the same way (``prepare_moe``): the M buckets of a shape no table holds where two
or more routes have estimates within :data:`CLOSE` of the best (or none; standings as the plan ranks them,
under skewed routing too where the rows have it), timed as ``tune --moe``
does with the layer's own weights as the first copy rotated through, at most two Triton
configurations, within the same budget (:func:`measure_moe_shape`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fp8select._log import get_logger
from fp8select.backends.base import Backend
from fp8select.buckets import M_BUCKETS
from fp8select.capabilities import Capabilities
from fp8select.guard import PASS_THROUGH
from fp8select.jit_processes import compile_in_processes, processes_wanted, split_jobs
from fp8select.measured.model import Measurements
from fp8select.measured.table import add_rows, cache_dir, table_path
from fp8select.plan import gate
from fp8select.problem import Problem

__all__ = ["CLOSE", "ENV_BUDGET", "by_closeness", "measure_moe_shape", "measure_shape",
           "moe_buckets_to_measure", "points_to_measure"]

ENV_BUDGET = "FP8SELECT_TUNE_BUDGET_S"
CLOSE = 1.25
"""Backends whose estimates are within this factor of the best one's are measured."""
DEFAULT_BUDGET_S = 3.0  # no new point after it: the last one ends within about 4 s
JIT_TIMEOUT_S = 120.0  # per worker: a few compiles take 10-20 s, a hung one must not hold the start
BLOCK = (128, 128)


def budget_s(caps: Capabilities) -> float:
    try:
        value = float(caps.env.get(ENV_BUDGET, "").strip() or DEFAULT_BUDGET_S)
    except ValueError:
        return DEFAULT_BUDGET_S
    return value if math.isfinite(value) and value > 0 else DEFAULT_BUDGET_S


def points_to_measure(chain: Sequence[Backend], caps: Capabilities, measurements: Measurements | None,
                      n: int, k: int) -> list[tuple[int, list[str]]]:
    """The M buckets of an (N, K) layer worth measuring, each with the backends to time there: the buckets no
    table holds a row of (a table's, or an earlier start's) where two or more backends' gates take the
    bucket and their estimates are missing or within :data:`CLOSE` of the best. The closest contests
    first (:func:`by_closeness`): a budget that ends early has settled those, and the next start measures
    the rest (on a cold JIT cache the vendors' compiles take most of a first start's budget)."""
    held = measurements.buckets_held(n, k) if measurements is not None else frozenset()
    runnable = [b for b in chain if b.name != "reference" and gate(b, Problem(n, k, BLOCK), caps).ok]
    contests = {}
    for bucket in M_BUCKETS:
        if bucket in held:
            continue
        contenders = [b for b in runnable if gate(b, Problem(n, k, BLOCK, bucket), caps).ok]
        contests[bucket] = {b.name: measurements.estimate(b.name, n, k, bucket) if measurements else None
                            for b in contenders}
    return by_closeness(contests)


def measure_shape(selection: Any, n: int, k: int, *, device: Any, group: Any = None) -> dict[str, Any] | None:
    """Measure what :func:`points_to_measure` names for (N, K) (on rank 0 of ``group`` when given),
    add it to the cache directory's table and return the new rows (None when nothing was needed)."""
    caps = selection.capabilities
    todo = dict(points_to_measure(selection.chain, caps, selection.measurements, n, k))
    if not todo:
        return None

    def measure() -> dict[str, Any]:
        from fp8select.measure.tune import tune

        timed = [b for b in selection.chain if any(b.name in names for names in todo.values())]
        if selection.measurements is None or not selection.measurements.buckets_held(n, k):
            _compiled_in_processes(timed, todo, caps, n, k, device)
        _vendors_loaded(timed, caps, device)
        table, _ = tune(selection, [(n, k)], list(todo), force=True, replays=10, max_configs=2,
                        budget_s=budget_s(caps), only=lambda name, m: name in todo[m], device=device)
        return table

    return _measured_and_saved(caps, measure, group, n=n, k=k, buckets=list(todo))


def moe_buckets_to_measure(chain: Sequence[Any], caps: Capabilities, table: Any, shape: tuple[int, int, int, int]
                           ) -> list[int]:
    """The M buckets worth measuring for a MoE layer ``(E, H, I, k)`` of ``chain`` (MoE backends), given
    ``table`` (:class:`~fp8select.measured.moe.MoeMeasurements` or None): those with no row of the shape
    where two or more routes' gates accept it and two or more of those have no estimate or a standing within
    :data:`CLOSE` of the best, as the plan ranks them (:func:`fp8select.moe_plan.rank_estimates`: under skewed
    routing too where the estimates have it); the closest contests first (the next start measures what a
    budget left)."""
    from fp8select.backends.moe import MoeProblem
    from fp8select.moe_plan import rank_estimates, route_name

    held = {bucket for rows in (table.times(*shape) if table else {}).values() for bucket in rows}
    estimates = table.estimates(*shape) if table else {}
    contests = {}
    for bucket in M_BUCKETS:
        if bucket in held:
            continue
        problem = MoeProblem(*shape, m=bucket)
        runnable = {b.name: [lay for lay in b.layouts if b.supports(problem, caps, lay).ok]
                    for b in chain if b.name != "reference"}
        runnable = {name: layouts for name, layouts in runnable.items() if layouts}
        ranked = {route_name(t.backend, t.layout): t for t in rank_estimates(bucket, runnable, estimates)}
        contests[bucket] = {route_name(name, lay): ranked.get(route_name(name, lay))
                            for name, layouts in runnable.items() for lay in layouts}
    return [bucket for bucket, _ in by_closeness(contests, value=lambda timed: timed.loss)]


def _spread(buckets: Sequence[int]) -> dict[int, int]:
    """Each bucket's place when both ends come first, then the middle of each span between placed ones, and so on."""
    order, spans = [0, len(buckets) - 1], [(0, len(buckets) - 1)]
    while spans:
        halves = []
        for lo, hi in spans:
            if hi - lo > 1:
                mid = (lo + hi) // 2
                order.append(mid)
                halves += [(lo, mid), (mid, hi)]
        spans = halves
    return {buckets[i]: place for place, i in enumerate(order)}


SPREAD = _spread(M_BUCKETS)
"""The order of contests equally close (those with a missing estimate, on a device no table covers): M 1, 8192, 64,
8, 512, 2, 16, ... . The buckets a budget leaves then lie between measured ones, where the plan's model
interpolates (:meth:`fp8select.measured.model.Measurements.estimate`), not above them, where it has nothing."""


def by_closeness(contests: Mapping[int, Mapping[str, Any]], value: Any = lambda estimate: estimate.us
                 ) -> list[tuple[int, list[str]]]:
    """Per M bucket, the names whose estimate (anything ``value`` reads a time from, ``us`` by default; or None)
    is missing or within :data:`CLOSE` of the best, where there are two or more; ordered by how close the
    contest is (the runner-up's estimate over the best one's, a missing estimate counting as a tie), then
    spread over M (:data:`SPREAD`)."""
    found = []
    for bucket, estimates in contests.items():
        best = min((value(e) for e in estimates.values() if e is not None), default=math.inf)
        close = [name for name, e in estimates.items() if e is None or value(e) <= best * CLOSE]
        if len(close) < 2:
            continue
        known = sorted(value(estimates[name]) for name in close if estimates[name] is not None)
        gap = 1.0 if len(known) < len(close) else known[1] / known[0]
        found.append((gap, SPREAD.get(bucket, len(SPREAD)), bucket, close))
    return [(bucket, close) for *_, bucket, close in sorted(found, key=lambda item: item[:3])]


def measure_moe_shape(selection: Any, chain: Sequence[Any], table: Any, experts: Sequence[Any],
                      shape: tuple[int, int, int, int], *, device: Any, group: Any = None) -> dict[str, Any] | None:
    """Measure what :func:`moe_buckets_to_measure` names for ``shape`` (on rank 0 of ``group`` when given)
    with the layer's weights ``experts`` (``w13, s13, w2, s2``), add it to the cache directory's table and
    return the new rows (None when nothing was needed)."""
    caps = selection.capabilities
    buckets = moe_buckets_to_measure(chain, caps, table, shape)
    if not buckets:
        return None

    def measure() -> dict[str, Any]:
        from fp8select.measure.tune_moe import tune_moe

        _vendors_loaded([b for b in chain if b.name != "reference"], caps, device)
        found, _ = tune_moe(selection, [shape], buckets, force=True, replays=10, max_configs=2,
                            budget_s=budget_s(caps), chain=chain, device=device, experts=tuple(experts))
        return found

    return _measured_and_saved(caps, measure, group, moe=list(shape), buckets=buckets)


def _measured_and_saved(caps: Capabilities, measure: Any, group: Any, **what: Any) -> dict[str, Any] | None:
    """``measure()``'s table (run on rank 0 of ``group`` when given, every rank getting it), logged with
    ``what`` and added to the cache directory's table; None when nothing was measured. Best effort: a
    measurement that fails (out of memory while the engine loads, a backend's error outside its own
    checks) is logged (``fp8select.load_time_tuning_failed``) and the layer is planned without it."""
    start = time.monotonic()

    def attempt() -> dict[str, Any]:
        try:
            return dict(measure())
        except PASS_THROUGH:
            raise
        except Exception as exc:  # noqa: BLE001 - logged; the plan goes on from the tables and the model
            get_logger().warning("fp8select.load_time_tuning_failed", **what, error=f"{type(exc).__name__}: {exc}"[:300])
            _free_device_cache()
            return {}

    if group is None:
        table = attempt()
    else:
        from fp8select.distributed import measure_on_one_rank

        table = measure_on_one_rank(attempt, None if isinstance(group, str) else group)
    points = sum(len(b) for section in ("groups", "moe") for g in table.get(section, ()) for b in g["shapes"].values())
    get_logger().info("fp8select.load_time_tuning", **what, points=points, seconds=round(time.monotonic() - start, 3))
    if not points:
        return None
    _save(caps, table)
    return table


def _compiled_in_processes(backends: Sequence[Backend], todo: Mapping[int, Sequence[str]], caps: Capabilities,
                           n: int, k: int, device: Any) -> None:
    """With ``FP8SELECT_JIT_PROCESSES=N``: the JIT vendors' kernels for (N, K) at the buckets ``todo`` times them,
    compiled in up to N worker processes at once (Triton's are not: it times configurations its search finds
    then, not the one a worker would run). A worker that fails only leaves its compiles to the measurement.
    Called at a shape's first measurement only (it holds no row yet): that compiles every open point, so a
    later start finds the kernels of what the budget left compiled (each worker is a process start, 10-20 s
    a shape on the H200, for nothing on warm caches)."""
    processes = processes_wanted(caps)
    compilers = [b.name for b in backends if b.jit and b.name != "triton"]
    if not processes or not compilers:
        return
    start = time.monotonic()
    jobs = split_jobs({(name, n, k, str(device)): tuple(m for m, names in todo.items() if name in names)
                       for name in compilers}, "bfloat16", processes)
    done = compile_in_processes(jobs, processes, timeout_s=JIT_TIMEOUT_S)
    get_logger().info("fp8select.load_time_jit", n=n, k=k, jobs=len(jobs), failed=sum("error" in d for d in done),
                      seconds=round(time.monotonic() - start, 3))


def _vendors_loaded(backends: Sequence[Any], caps: Capabilities, device: Any) -> None:
    """The backends' once-per-process vendor setup (import; warm-up on a GPU), done before the budget's clock
    starts, so that the first shape a process measures does not spend its budget on it (on the H200 with the
    vendors the first shape of a run got 9 rows measured, the next ones 15-45)."""
    import torch

    from fp8select.verify_chain import load_vendors

    device = torch.device(device)
    load_vendors(backends, caps, device if device.type == "cuda" else None, get_logger())


def _free_device_cache() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _save(caps: Capabilities, table: Mapping[str, Any]) -> None:
    """Add the rows to the cache directory's table (best effort: a cache that cannot be written
    only means the next start measures again)."""
    if not caps.device_name:
        return
    with contextlib.suppress(OSError, ValueError):
        add_rows(table_path(cache_dir(caps.env), caps.device_name), caps.device_name, table)

