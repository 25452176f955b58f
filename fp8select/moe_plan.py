"""One plan per MoE layer: for every M bucket, the backend and layout that run the experts op, and why.

:func:`build_moe_plan` is a pure decision over values, as :func:`fp8select.plan.build_plan` is for
the dense layers. Per M bucket (:mod:`fp8select.buckets`; the tokens per expert a bucket implies are
``M * k / E`` under uniform routing):

* **explicit**: the selection's explicit backend, where one of its layouts' gates accepts the bucket;
* **measured**: otherwise the (backend, layout) with the least measured time of the whole experts op
  (routing, both GEMMs, activation and its quantization, weighted sum) among those whose gate accepts;
  then, as in the dense plans, a bucket whose winner leads by at most :data:`fp8select.plan.HAIR` the
  route that runs the buckets on both sides of it (the one bucket next to an end), measured there too,
  goes to that route: within that margin which route leads is the timings' noise;
* **model** (where no route is measured at this bucket, for a shape no table holds or a bucket its
  rows lack): among the routes whose gate accepts, the one the estimates rank first as measured rows are
  ranked (:func:`rank_estimates`: the least estimate, or where every route's estimate has one under skewed
  routing too, the least worse ratio to the fastest under the two), each estimate modelled from the
  measured shapes (:mod:`fp8select.measured.moe_model`; the detail names them), in its default launch
  configuration (a measured one belongs to another shape). A route measured at no shape on this device
  has no estimate and is not chosen here;
* **rule** (where nothing is measured or estimated): the first backend in priority order, in its first layout,
  except that DeepGEMM runs ``masked`` up to :data:`MASKED_MAX_M` tokens (decode, CUDA graphs: FACTS.md
  measured its masked kernel at 0.83-0.94 of the HBM floor there) and ``contiguous`` above (its masked
  layout holds ``E x M`` rows, which stops paying, and fitting, as M grows);
* **gate**: as the rule, where the first backend in priority order that accepts the layer rejects this
  bucket (the detail says why), or where no backend accepts it (calls of that size raise).

A **batch-invariant** plan (``invariance`` given: ``resolve(batch_invariant=True)``) instead runs one
backend, layout and launch configuration for every M, as the dense plans do: among the routes an
invariance record qualifies (:mod:`fp8select.measured.invariance`, records with a ``layout``), or whose
backend is invariant by construction (the reference, on a CPU or chosen explicitly), and whose gates
take every bucket, the one with the least measured time over the buckets (rows of its configuration);
why ``invariant``. None qualifying is a :class:`~fp8select.errors.BatchInvariantError` naming each
route's reason.

A gate is asked at both ends of each bucket. Measured rows come in as a mapping
``{"backend/layout": {bucket: {"us": float, "config": {...} | None}}}`` for this layer's shape: the
tuning tables' MoE rows (:mod:`fp8select.measured.moe`, written by ``fp8select tune --moe``) or rows
given to ``prepare_moe(measured=...)``; estimates as ``{"backend/layout": {bucket: MoeEstimate}}``
(:meth:`fp8select.measured.moe.MoeMeasurements.estimates`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from fp8select.backends.moe import MoeBackend, MoeProblem
from fp8select.buckets import M_BUCKETS, bucket_ends, bucket_index, bucket_range, span
from fp8select.capabilities import Capabilities
from fp8select.errors import BatchInvariantError, UnsupportedProblemError
from fp8select.guard import safe_verdict
from fp8select.measured.invariance import Invariance, Option
from fp8select.measured.moe_model import MoeEstimate
from fp8select.plan import HAIR, neighbours, neighbours_share
from fp8select.verdict import Candidate, Verdict

__all__ = ["EXPLICIT", "GATE", "INVARIANT", "MASKED_MAX_M", "MEASURED", "MODEL", "RULE", "MoeEstimates", "MoePlan", "MoeRoute",
           "MoeTimes", "build_moe_plan", "rank_estimates", "rank_routes", "route_name"]

EXPLICIT, MEASURED, MODEL, RULE, GATE, INVARIANT = "explicit", "measured", "model", "rule", "gate", "invariant"
MASKED_MAX_M = 64
"""Largest M the rule runs DeepGEMM's masked layout at (decode batch sizes)."""

MoeTimes = Mapping[str, Mapping[Any, Mapping[str, Any]]]
"""Measured rows of one layer shape: ``"backend/layout"`` -> M bucket -> ``{"us": ..., "config": ...}``."""

MoeEstimates = Mapping[str, Mapping[int, MoeEstimate]]
"""Modelled times of one layer shape: ``"backend/layout"`` -> M bucket -> estimate."""


class Timed(NamedTuple):
    """A measured route at one bucket (:func:`rank_routes`)."""

    loss: float
    us: float
    rank: int  # the backend's place in priority order
    backend: str
    layout: str
    row: Mapping[str, Any]


def route_name(backend: str, layout: str) -> str:
    return f"{backend}/{layout}"


@dataclass(frozen=True)
class MoeRoute:
    """What runs the calls of one M bucket."""

    bucket: int
    backend: str | None  # None: no backend runs this bucket (calls raise)
    layout: str
    why: str
    detail: str
    config: Any = None
    us: float | None = None

    def to_dict(self) -> dict[str, Any]:
        config = self.config.to_dict() if hasattr(self.config, "to_dict") else self.config
        return {"bucket": self.bucket, "backend": self.backend, "layout": self.layout, "why": self.why,
                "detail": self.detail, "config": config, "us": self.us}


@dataclass(frozen=True)
class MoePlan:
    """A MoE layer's decisions: one :class:`MoeRoute` per M bucket, and the verdicts per backend and layout."""

    problem: MoeProblem
    routes: tuple[MoeRoute, ...]
    candidates: tuple[Candidate, ...]
    explicit: str | None = None
    invariant: str | None = None  # a batch-invariant plan: what backs it (a record, or a proof)

    def route(self, m: int) -> MoeRoute:
        return self.routes[bucket_index(m)]

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.backend for r in self.routes if r.backend is not None))

    def ranges(self) -> list[tuple[int, int | None, MoeRoute]]:
        """Consecutive buckets with the same backend, layout, why and configuration merged."""
        out: list[tuple[int, int | None, MoeRoute]] = []
        for route in self.routes:
            lo, hi = bucket_range(route.bucket)
            last = out[-1][2] if out else None
            if last is not None and (last.backend, last.layout, last.why, last.config) == (
                    route.backend, route.layout, route.why, route.config):
                out[-1] = (out[-1][0], hi, last)
            else:
                out.append((lo, hi, route))
        return out

    def summary(self) -> str:
        """``M 1-64: deepgemm/masked, M >= 65: deepgemm/contiguous`` (one line)."""
        spans: list[tuple[int, int | None, str]] = []
        for route in self.routes:
            lo, hi = bucket_range(route.bucket)
            name = route_name(route.backend, route.layout) if route.backend else "none"
            if spans and spans[-1][2] == name:
                spans[-1] = (spans[-1][0], hi, name)
            else:
                spans.append((lo, hi, name))
        return ", ".join(f"{span(lo, hi)}: {name}" for lo, hi, name in spans) + (" (batch-invariant)" if self.invariant else "")

    def describe(self) -> str:
        """Several lines: per M range the backend and layout, why, its launch configuration, then the
        backends and layouts left out and why."""
        p = self.problem
        head = f"MoE plan for E={p.experts}, H={p.hidden}, I={p.intermediate}" + (f", k={p.top_k}" if p.top_k else "")
        lines = [head + (f" (explicit choice: {self.explicit})" if self.explicit else "")]
        if self.invariant:
            lines.append(f"  batch-invariant: a token's output depends only on that token (any M, any position); "
                         f"{self.invariant}")
        for lo, hi, route in self.ranges():
            name = route_name(route.backend, route.layout) if route.backend else "-"
            kernel = f"[{route.config.describe()}] " if hasattr(route.config, "describe") else ""
            lines.append(f"  {span(lo, hi):<14} {name:<26} {route.why:<9} {kernel}{route.detail}")
        lines.extend(f"  not for this layer: {c.name}: {c.reason}" for c in self.candidates if not c.accepted)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        p = self.problem
        return {"experts": p.experts, "hidden": p.hidden, "intermediate": p.intermediate, "top_k": p.top_k,
                "explicit": self.explicit, "batch_invariant": self.invariant,
                "routes": [r.to_dict() for r in self.routes], "candidates": [c.to_dict() for c in self.candidates]}


def _gate(backend: MoeBackend, problem: MoeProblem, caps: Capabilities, layout: str) -> Verdict:
    return safe_verdict(backend.supports, problem, caps, layout)


def _rule_layout(runnable: Sequence[str], bucket: int) -> str:
    if "masked" in runnable and "contiguous" in runnable:
        return "masked" if bucket <= MASKED_MAX_M else "contiguous"
    return runnable[0]


def build_moe_plan(problem: MoeProblem, backends: Sequence[MoeBackend], caps: Capabilities, *,
                   measured: MoeTimes | None = None, estimated: MoeEstimates | None = None,
                   explicit: str | None = None, invariance: Invariance | None = None) -> MoePlan:
    """The plan for ``problem`` (``m`` None) over ``backends`` (device-accepted, priority order);
    batch-invariant with ``invariance`` (the records that apply here).

    Raises :class:`UnsupportedProblemError` when no backend accepts the layer in any layout,
    :class:`BatchInvariantError` when none runs it batch-invariant.
    """
    candidates: list[Candidate] = []
    layouts: dict[str, list[str]] = {}
    for b in backends:
        reasons = []
        for layout in b.layouts:
            verdict = _gate(b, problem, caps, layout)
            if verdict.ok:
                layouts.setdefault(b.name, []).append(layout)
            reasons.append(verdict.reason)
        candidates.append(Candidate(len(candidates) + 1, b.name, b.name in layouts, "; ".join(dict.fromkeys(reasons))))
    accepted = [b for b in backends if b.name in layouts]
    if not accepted:
        raise UnsupportedProblemError(problem.describe(), candidates)
    measured, estimated = measured or {}, estimated or {}
    buckets = []
    for bucket in M_BUCKETS:
        refusals: dict[tuple[str, str], str] = {}  # (backend, layout): why its gate rejects this bucket (either end)
        for b in accepted:
            for lay in layouts[b.name]:
                verdicts = (_gate(b, replace(problem, m=m), caps, lay) for m in bucket_ends(bucket))
                why = next((v.reason for v in verdicts if not v.ok), None)
                if why is not None:
                    refusals[(b.name, lay)] = why
        runnable = {b.name: ok for b in accepted if (ok := [lay for lay in layouts[b.name] if (b.name, lay) not in refusals])}
        # a backend none of whose layouts runs this bucket: its first layout's reason
        rejected = {b.name: refusals[(b.name, layouts[b.name][0])] for b in accepted if b.name not in runnable}
        buckets.append((bucket, runnable, rejected, refusals))
    explicit = explicit if explicit in layouts else None
    if invariance is not None:
        return _invariant_plan(problem, accepted, layouts, tuple(candidates), buckets, measured, explicit, invariance)
    timed = [rank_routes(bucket, runnable, measured) for bucket, runnable, _, _ in buckets]
    routes = [_route(bucket, accepted, runnable, rejected, problem, ranked, estimated, explicit)
              for (bucket, runnable, rejected, _), ranked in zip(buckets, timed, strict=True)]
    return MoePlan(replace(problem, m=None), tuple(_smoothed(routes, timed, accepted, problem)), tuple(candidates),
                   explicit)


def _invariant_plan(problem: MoeProblem, accepted: Sequence[MoeBackend], layouts: Mapping[str, Sequence[str]],
                    candidates: tuple[Candidate, ...], buckets: Sequence[tuple[int, Any, Any, Mapping[tuple[str, str], str]]],
                    measured: MoeTimes, explicit: str | None, invariance: Invariance) -> MoePlan:
    """The batch-invariant plan (the module docstring): the cheapest qualifying route, one kernel for every M."""
    shape = (problem.experts, problem.hidden, problem.intermediate, problem.top_k or 0)
    options, refused = [], []
    for rank, b in enumerate(accepted):
        for layout in layouts[b.name]:
            found, why = invariance.options(b, explicit=b.name == explicit, layout=layout)
            gated = next(((bucket, refusals[(b.name, layout)]) for bucket, _, _, refusals in buckets
                          if (b.name, layout) in refusals), None)
            if explicit is not None and b.name != explicit:
                found, why = (), f"not the explicit choice ({explicit})"
            elif found and gated is not None:
                found, why = (), f"rejects {span(*bucket_range(gated[0]))} ({gated[1]})"
            for option in found:
                routes = tuple(_invariant_route(bucket, b, layout, option, problem, measured) for bucket, *_ in buckets)
                known = [r.us for r in routes if r.us is not None]
                cost = sum(map(math.log, known)) + (len(routes) - len(known)) * math.log(2 * max(known)) if known \
                    else math.inf  # an unmeasured bucket counts as twice the slowest measured one
                options.append((cost, rank, routes, option.backs(*shape)))
            if not found:
                refused.append((route_name(b.name, layout), why))
    if not options:
        raise BatchInvariantError(problem.describe(), [Candidate(i, name, False, why)
                                                       for i, (name, why) in enumerate(refused, 1)])
    _, _, routes, backed = min(options, key=lambda o: (o[0], o[1]))
    return MoePlan(replace(problem, m=None), routes, candidates, explicit, invariant=backed)


def _invariant_route(bucket: int, backend: MoeBackend, layout: str, option: Option, problem: MoeProblem,
                     measured: MoeTimes) -> MoeRoute:
    """One bucket of an invariant option: the record's configuration as is (never refitted per M; a
    backend without configurations gets its one default), timed only by a row of that configuration."""
    raw = option.config_at(bucket)
    config = backend.launch_config(raw) if raw is not None else backend.default_config(problem, layout, 1)
    row = _measured_row(measured, route_name(backend.name, layout), bucket)
    same = row is not None and (row.get("config") is None if raw is None else
                                row.get("config") is not None and backend.launch_config(row["config"]) == config)
    if row is not None and same:
        us = float(row["us"])
        return MoeRoute(bucket, backend.name, layout, INVARIANT, f"one kernel for every M; measured {us:.1f} us",
                        config, us)
    return MoeRoute(bucket, backend.name, layout, INVARIANT, "one kernel for every M; no time measured for it here",
                    config)


def _measured_row(measured: MoeTimes, name: str, bucket: int) -> Mapping[str, Any] | None:
    rows = measured.get(name)
    if not rows:
        return None
    row = rows.get(bucket, rows.get(str(bucket)))
    return row if isinstance(row, Mapping) and isinstance(row.get("us"), int | float) else None


def _row_config(backend: MoeBackend, row: Mapping[str, Any], problem: MoeProblem, layout: str, bucket: int) -> Any:
    """The launch configuration a measured row ran: its own, else the backend's default there."""
    if row.get("config") is not None:
        return backend.launch_config(row["config"])
    return backend.default_config(problem, layout, bucket)


def rank_routes(bucket: int, runnable: Mapping[str, Sequence[str]], measured: MoeTimes) -> list[Timed]:
    """The routes that run ``bucket`` and have a measured row there, best first: by least loss, then time under
    uniform routing, then priority and layout order. A route's loss is its worst ratio to the fastest route over
    the routings every route was timed under: uniform routing (``us``), and skewed (``skewed_us``,
    :func:`fp8select.kernels.moe_routing.skewed_routing`) where each row has that time. Uniform times alone rank
    by time; with both, a route far behind under skew (a busy expert's weights read once per small row block)
    loses to one a little behind under either, as a Triton route's configuration is chosen (``tune --moe``)."""
    found = [(rank, name, layout, row) for rank, name in enumerate(runnable) for layout in runnable[name]
             if (row := _measured_row(measured, route_name(name, layout), bucket)) is not None]
    rows = [row for *_, row in found]
    keys = ("us", "skewed_us") if _all_skewed(rows) else ("us",)
    fastest = {key: min(float(row[key]) for row in rows) for key in keys} if rows else {}
    timed = [Timed(max(float(row[key]) / fastest[key] for key in keys), float(row["us"]), rank, name, layout, row)
             for rank, name, layout, row in found]
    return sorted(timed, key=lambda t: (t.loss, t.us, t.rank))


def rank_estimates(bucket: int, runnable: Mapping[str, Sequence[str]], estimated: MoeEstimates) -> list[Timed]:
    """The routes that run ``bucket`` and have an estimate there, ranked as measured rows are
    (:func:`rank_routes`: each estimate read as a row, :meth:`~fp8select.measured.moe_model.MoeEstimate.row`)."""
    return rank_routes(bucket, runnable, {route: {bucket: e.row()} for route, by_bucket in estimated.items()
                                          if (e := by_bucket.get(bucket)) is not None})


def _all_skewed(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether each of a bucket's rows has a time under skewed routing (then they are ranked by it too)."""
    return bool(rows) and all(isinstance(v := row.get("skewed_us"), int | float) and not isinstance(v, bool) and v > 0
                              for row in rows)


def _measured_detail(chosen: Timed, ranked: Sequence[Timed]) -> str:
    """``measured 381.2 us`` for ``chosen`` of its bucket's ``ranked`` routes (``, 254.2 us skewed`` where they
    were ranked under skewed routing too)."""
    skewed = f", {float(chosen.row['skewed_us']):.1f} us skewed" if _all_skewed([t.row for t in ranked]) else ""
    return f"measured {chosen.us:.1f} us{skewed}"


def _smoothed(routes: Sequence[MoeRoute], timed: Sequence[Sequence[Timed]], accepted: Sequence[MoeBackend],
              problem: MoeProblem) -> list[MoeRoute]:
    """``routes`` with each measured bucket whose winner leads, by at most :data:`~fp8select.plan.HAIR` in loss
    (:func:`rank_routes`; under uniform routing alone, in time), the route (backend and layout) that runs the buckets
    on both sides of it (the one below as already smoothed; the one next to the first or last bucket), where that
    route runs this bucket and was measured there, given to that route. As :func:`fp8select.plan._smoothed` does
    for the dense plans, and for its reason: within the margin which route leads is the timings' noise, and the
    route around the bucket is the likelier leader."""
    by_name = {b.name: b for b in accepted}
    out = list(routes)
    for i, route in enumerate(routes):
        around = neighbours_share(out, routes, i, lambda r: (r.backend, r.layout))
        if route.why != MEASURED or route.backend is None or around in (None, (route.backend, route.layout)):
            continue
        found = next((t for t in timed[i] if (t.backend, t.layout) == around), None)
        if found is None or found.loss > timed[i][0].loss * (1 + HAIR):
            continue
        out[i] = MoeRoute(route.bucket, found.backend, found.layout, MEASURED,
                          f"{_measured_detail(found, timed[i])}, within {100 * HAIR:.0f}% of "
                          f"{route_name(route.backend, route.layout)} ({route.us:.1f} us), which the "
                          f"{neighbours(i, len(routes))} not run",
                          _row_config(by_name[found.backend], found.row, problem, found.layout, route.bucket), found.us)
    return out


def _others(ranked: Sequence[Timed]) -> str:
    """`` (others: a/x 2.0, b/y 3.0 us)``: the next three routes of a ranking after the chosen one, or nothing;
    ranked under skewed routing too, each with both times (`` (others: a/x 2.0/1.5 us uniform/skewed)``)."""
    both = _all_skewed([t.row for t in ranked])
    others = ", ".join(f"{route_name(t.backend, t.layout)} {t.us:.1f}" + (f"/{float(t.row['skewed_us']):.1f}" if both else "")
                       for t in ranked[1:4])
    return f" (others: {others} us{' uniform/skewed' if both else ''})" if others else ""


def _route(bucket: int, accepted: Sequence[MoeBackend], runnable: Mapping[str, Sequence[str]],
           rejected: Mapping[str, str], problem: MoeProblem, timed: Sequence[Timed], estimated: MoeEstimates,
           explicit: str | None) -> MoeRoute:
    by_name = {b.name: b for b in accepted}
    if not runnable:
        return MoeRoute(bucket, None, "", GATE, "no backend accepts this M: " +
                        "; ".join(f"{n}: {why}" for n, why in rejected.items()))
    if explicit is not None and explicit in runnable:
        b = by_name[explicit]
        layout = _rule_layout(runnable[explicit], bucket)
        return MoeRoute(bucket, explicit, layout, EXPLICIT, "the explicit choice",
                        b.default_config(problem, layout, bucket))
    if timed:
        best = timed[0]
        others = _others(timed)
        return MoeRoute(bucket, best.backend, best.layout, MEASURED, _measured_detail(best, timed) + others,
                        _row_config(by_name[best.backend], best.row, problem, best.layout, bucket), best.us)
    if ranked := rank_estimates(bucket, runnable, estimated):
        best = ranked[0]
        estimate = estimated[route_name(best.backend, best.layout)][bucket]
        return MoeRoute(bucket, best.backend, best.layout, MODEL,
                        estimate.detail + _others(ranked),
                        by_name[best.backend].default_config(problem, best.layout, bucket), best.us)
    name = next(iter(runnable))
    b = by_name[name]
    layout = _rule_layout(runnable[name], bucket)
    config = b.default_config(problem, layout, bucket)
    first = accepted[0].name
    if first != name:
        return MoeRoute(bucket, name, layout, GATE, f"first in priority order that accepts this M ({first}: "
                        f"{rejected[first]})", config)
    return MoeRoute(bucket, name, layout, RULE, "first in priority order (no measurement)", config)
