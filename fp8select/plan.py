"""One plan per layer: for every M bucket, the backend that runs, its launch configuration, and why.

:func:`build_plan` is a pure decision over values: the layer's problem, the selection's chain
of accepted backends, each backend's gate, each backend's expected time per bucket
(:class:`fp8select.measured.model.Estimate`), whether the choice was explicit, and how many
extra copies of the weight the layer may hold. Per bucket (:mod:`fp8select.buckets`):

* **explicit** (``resolve(backend=...)`` or ``FP8SELECT_BACKEND``): that backend, wherever its
  gate accepts the bucket; elsewhere the automatic choice among the others (**gate**).
* **measured** / **model**: otherwise the backend with the least expected time among those
  whose gate accepts the bucket and that have an estimate (measured for this shape, or
  modelled from other shapes of the same device);
* **rule**: where no accepted backend has an estimate, the first in priority order.

Gates say only what cannot run or would be wrong; speed is decided here. A gate is asked at
both ends of each bucket, and a backend whose gate rejects either stays out of the whole
bucket (a route never needs a per-call check). The weight budget:
backends whose prepared weight is not the checkpoint's bytes (a requantized, converted or
shuffled copy) count one copy per distinct layout; while the plan needs more copies than
allowed, the layout whose loss costs least (sum of log time ratios over its buckets) is
dropped and its buckets re-chosen. An explicit choice is never dropped.

**Batch-invariant** (``invariance`` given: ``resolve(batch_invariant=True)``): every bucket runs one
backend with one schedule of configurations that a record (:mod:`fp8select.measured.invariance`)
says gives each row the same bits whatever M and its position, or that is invariant by
construction; the backend's gate must accept every M, its weight fit the budget, and an explicit
choice is the only one considered. Among the options, the least expected time (sum of log times
over the buckets, as the weight budget's choice; a schedule's configuration counts as timed only
where the estimate measured that configuration) wins, the priority order breaking ties. No
option: :class:`~fp8select.errors.BatchInvariantError` with every backend's reason.

Backends that win by a hair (:data:`HAIR`) are left out first: a backend a layer uses costs
start-up (its import, and a JIT compile per shape and M range at first use), so one whose every
bucket another backend of the plan runs at most ``HAIR`` slower (both times estimated) gives its
buckets to the plan's others; the drop that costs least goes first, and the plan's notes say which.
Then a bucket whose measured winner leads by at most ``HAIR`` the backend measured there that runs
its neighbouring buckets (both sides of an inner bucket, the one next to an end) goes to that
backend (a near tie is the measurements' noise; the plan switches backends less).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from fp8select.backends.base import CHECKPOINT_LAYOUT, Backend
from fp8select.buckets import M_BUCKETS, bucket_ends, bucket_range, span
from fp8select.capabilities import Capabilities
from fp8select.errors import BatchInvariantError, UnsupportedProblemError
from fp8select.guard import safe_verdict
from fp8select.measured.invariance import Invariance, Option
from fp8select.measured.model import Estimate, Measurements
from fp8select.problem import Problem
from fp8select.routes import Plan, Route, WeightUse
from fp8select.verdict import Candidate, Verdict

__all__ = ["EXPLICIT", "GATE", "HAIR", "INVARIANT", "MEASURED", "MEASURED_BLOCK", "MODEL", "RULE", "Plan", "Route",
           "WeightUse", "build_plan", "estimator", "fitted_config", "gate", "neighbours", "neighbours_share"]

EXPLICIT, GATE, INVARIANT, MEASURED, MODEL, RULE = "explicit", "gate", "invariant", "measured", "model", "rule"

EstimateFn = Callable[[Backend, int], "Estimate | None"]
R = TypeVar("R")
K = TypeVar("K")


MEASURED_BLOCK = (128, 128)
"""The weight block tuning tables are measured with; other blocks are planned without them."""

HAIR = 0.02
"""How much faster a backend must be somewhere in a layer to be worth its start-up. Its first call
per shape and M range JIT-compiles (DeepGEMM 3-5 s, FlashInfer 2-3 s on an H200) and its package
is imported; 2% is within the run-to-run spread of the measurements the estimates come from (which
of two backends leads at a point changes by up to 3% between runs of the same code)."""


def estimator(measurements: Measurements | None, n: int, k: int, block: tuple[int, int]) -> EstimateFn:
    """Expected times of an (N, K) layer per backend and bucket, from the device's measurements."""
    if measurements is None or block != MEASURED_BLOCK:
        return lambda backend, bucket: None
    return lambda backend, bucket: measurements.estimate(backend.name, n, k, bucket)


def gate(backend: Backend, problem: Problem, caps: Capabilities) -> Verdict:
    """``backend.supports(problem)``; a gate that raises (anything but ``KeyboardInterrupt``) or
    answers something other than a Verdict (a third-party one) is a rejection saying so."""
    return safe_verdict(backend.supports, problem, caps, what="gate")


def build_plan(problem: Problem, chain: Sequence[Backend], caps: Capabilities, estimate: EstimateFn, *,
               explicit: str | None = None, max_weight_copies: int | None = 1,
               invariance: Invariance | None = None, held: Collection[str] = ()) -> Plan:
    """The plan for ``problem`` (``m`` None) over ``chain`` (accepted backends, priority order);
    batch-invariant with ``invariance`` (the records that apply here). ``held``: the weight layouts the layer
    holds already (for its other dtype signatures), which count toward ``max_weight_copies`` at no cost.

    Raises :class:`UnsupportedProblemError` when no backend of the chain accepts the layer, and
    :class:`BatchInvariantError` when none runs it batch-invariant.
    """
    load_verdicts = {b.name: gate(b, problem, caps) for b in chain}
    candidates = tuple(Candidate(rank, b.name, load_verdicts[b.name].ok, load_verdicts[b.name].reason)
                       for rank, b in enumerate(chain, 1))
    accepted = [b for b in chain if load_verdicts[b.name].ok]
    if not accepted:
        raise UnsupportedProblemError(problem.describe(), candidates)

    # Per bucket: which accepted backends' gates take every probed M, and why not.
    rejects: dict[tuple[str, int], str] = {}
    for b in accepted:
        for bucket in M_BUCKETS:
            for m in bucket_ends(bucket):
                verdict = gate(b, replace(problem, m=m), caps)
                if not verdict.ok:
                    rejects[(b.name, bucket)] = verdict.reason
                    break
    estimates = {(b.name, bucket): estimate(b, bucket) for b in accepted for bucket in M_BUCKETS}
    layouts = {b.name: b.weight_layout(caps, problem) for b in accepted}
    preferred = {b.name: b.preferred_m(caps) for b in accepted}
    explicit_backend = explicit if explicit in layouts else None
    if invariance is not None:
        return _invariant_plan(problem, accepted, candidates, rejects, estimates, layouts, invariance, explicit_backend,
                               max_weight_copies, held)

    def choose(allowed: Sequence[Backend]) -> tuple[Route, ...]:
        return tuple(_route(bucket, allowed, explicit_backend, rejects, estimates, preferred) for bucket in M_BUCKETS)

    allowed = list(accepted)
    routes = choose(allowed)
    notes: list[str] = []
    while (hair := _by_a_hair(routes, estimates, rejects, explicit_backend)) is not None:
        name, note = hair
        allowed = [b for b in allowed if b.name != name]
        routes = choose(allowed)
        notes.append(note)
    if max_weight_copies is not None:
        held_copies = set(held) - {CHECKPOINT_LAYOUT}
        while True:
            used = {layouts[r.backend] for r in routes if r.backend is not None} - {CHECKPOINT_LAYOUT}
            if len(used | held_copies) <= max_weight_copies:
                break
            droppable = [lay for lay in used - held_copies if explicit_backend is None or layouts[explicit_backend] != lay]
            if not droppable:
                if explicit_backend is not None:
                    notes.append(f"the explicit choice {explicit_backend!r} needs more weight copies than "
                                 f"max_weight_copies={max_weight_copies}; kept")
                break
            options = []
            for lay in sorted(droppable):
                trial_allowed = [b for b in allowed if layouts[b.name] != lay]
                trial = choose(trial_allowed)
                options.append((_cost(trial, estimates) - _cost(routes, estimates), lay, trial_allowed, trial))
            _, dropped, allowed, routes = min(options, key=lambda o: (o[0], o[1]))
            notes.append(f"weight layout {dropped!r} left out: max_weight_copies={max_weight_copies}")
    if explicit_backend is None:
        routes = _smoothed(routes, estimates, rejects)
    by_layout: dict[str, list[str]] = {}
    for route in routes:
        if route.backend is not None:
            by_layout.setdefault(layouts[route.backend], [])
            if route.backend not in by_layout[layouts[route.backend]]:
                by_layout[layouts[route.backend]].append(route.backend)
    weights = tuple(WeightUse(lay, tuple(names)) for lay, names in by_layout.items())
    routes = tuple(_with_config(r, accepted, problem, estimates) for r in routes)
    return Plan(problem, routes, weights, candidates, explicit_backend, max_weight_copies, tuple(notes))


def _invariant_plan(problem: Problem, accepted: Sequence[Backend], candidates: tuple[Candidate, ...],
                    rejects: Mapping[tuple[str, int], str], estimates: Mapping[tuple[str, int], Estimate | None],
                    layouts: Mapping[str, str], invariance: Invariance, explicit: str | None,
                    max_weight_copies: int | None, held: Collection[str]) -> Plan:
    """The batch-invariant plan (the module docstring): the cheapest option of one backend and schedule."""
    options, refused = [], []
    held_copies = set(held) - {CHECKPOINT_LAYOUT}
    for rank, b in enumerate(accepted):
        found, why = invariance.options(b, explicit=b.name == explicit)
        gated = [bucket for bucket in M_BUCKETS if (b.name, bucket) in rejects]
        if explicit is not None and b.name != explicit:
            found, why = (), f"not the explicit choice ({explicit})"
        elif found and gated:
            found, why = (), f"rejects {span(*bucket_range(gated[0]))} ({rejects[(b.name, gated[0])]})"
        elif found and max_weight_copies is not None and layouts[b.name] not in {*held_copies, CHECKPOINT_LAYOUT} \
                and len(held_copies) >= max_weight_copies:
            found, why = (), f"needs a weight copy ({layouts[b.name]}), found max_weight_copies={max_weight_copies}"
        for option in found:
            routes = tuple(_invariant_route(bucket, b, option, estimates) for bucket in M_BUCKETS)
            options.append((_cost(routes, estimates), rank, routes, option.backs(problem.n, problem.k)))
        if not found:
            refused.append((b.name, why))
    if not options:
        raise BatchInvariantError(problem.describe(), [Candidate(i, name, False, why)
                                                       for i, (name, why) in enumerate(refused, 1)])
    _, _, routes, backed = min(options, key=lambda o: (o[0], o[1]))
    notes = tuple(f"not batch-invariant here: {name}: {why}" for name, why in refused)
    name = routes[0].backend
    assert name is not None
    return Plan(problem, routes, (WeightUse(layouts[name], (name,)),), candidates, explicit, max_weight_copies, notes,
                invariant=backed)


def _invariant_route(bucket: int, backend: Backend, option: Option,
                     estimates: Mapping[tuple[str, int], Estimate | None]) -> Route:
    """One bucket of an invariant option: its schedule's configuration as is (never refitted per M),
    timed by the estimate only where that measured the same configuration."""
    raw = option.config_at(bucket)
    config = None if raw is None else backend.launch_config(raw)
    est = estimates.get((backend.name, bucket))
    same = est is not None and (est.config is None if raw is None
                                else est.config is not None and backend.launch_config(est.config) == config)
    if est is not None and same:
        return Route(bucket, backend.name, INVARIANT, f"one kernel for every M; {est.detail}", config, est.us)
    return Route(bucket, backend.name, INVARIANT, "one kernel for every M; no time measured for it here", config)


def _by_a_hair(routes: Sequence[Route], estimates: Mapping[tuple[str, int], Estimate | None],
               rejects: Mapping[tuple[str, int], str], explicit: str | None) -> tuple[str, str] | None:
    """The backend of ``routes`` whose buckets the plan's other backends all run at most :data:`HAIR`
    slower, the one whose loss costs least (sum of log time ratios), with a note saying so; None if none."""
    used = dict.fromkeys(r.backend for r in routes if r.backend is not None)
    best: tuple[float, str, str] | None = None
    for name in used:
        if name == explicit:
            continue
        loss, spans = 0.0, []
        for r in routes:
            if r.backend != name:
                continue
            times = [(e.us, other) for other in used if other != name and (other, r.bucket) not in rejects
                     and (e := estimates.get((other, r.bucket))) is not None]
            if r.us is None or not times or min(times)[0] > r.us * (1 + HAIR):
                break
            us, other = min(times)
            loss += math.log(us / r.us)
            spans.append(f"{span(*bucket_range(r.bucket))}: {other} +{100 * (us / r.us - 1):.1f}%")
        else:
            if spans and (best is None or loss < best[0]):
                best = (loss, name, f"{name} left out: the plan's others run its buckets at most "
                                    f"{100 * HAIR:.0f}% slower ({', '.join(spans)}), not worth its start-up")
    return None if best is None else (best[1], best[2])


def _smoothed(routes: Sequence[Route], estimates: Mapping[tuple[str, int], Estimate | None],
              rejects: Mapping[tuple[str, int], str]) -> tuple[Route, ...]:
    """``routes`` with each bucket whose measured winner leads, by at most :data:`HAIR`, the backend that
    runs its neighbouring buckets (both around an inner bucket, the one below as already smoothed; the one
    next to the first or last bucket) given to that backend.

    Within :data:`HAIR` which of two backends leads at a point is the measurements' noise; a backend that
    runs the buckets around it is the likelier leader there, and the plan switches backends less. Measured
    times only: a modelled estimate's error is larger than the margin."""
    out = list(routes)
    for i, route in enumerate(routes):
        around = neighbours_share(out, routes, i, lambda r: r.backend)
        if route.backend is None or route.us is None or route.why != MEASURED or around in (None, route.backend):
            continue
        est = estimates.get((around, route.bucket))
        if est is None or est.source != MEASURED or (around, route.bucket) in rejects or est.us > route.us * (1 + HAIR):
            continue
        out[i] = Route(route.bucket, around, MEASURED,
                       f"{est.detail}, within {100 * HAIR:.0f}% of {route.backend} ({route.us:.1f} us), which the "
                       f"{neighbours(i, len(routes))} not run", est.config, est.us)
    return tuple(out)


def neighbours_share(done: Sequence[R], routes: Sequence[R], i: int, key: Callable[[R], K]) -> K | None:
    """What the buckets around bucket ``i`` of ``routes`` run, by ``key`` (the backend; for MoE plans, with the
    layout): the route below as already smoothed (``done``) where the one above, as chosen, is the same; at
    the first or last bucket, the one next to it. None where the two differ. The smoothing rule of the dense
    and MoE plans."""
    below = key(done[i - 1] if i > 0 else routes[1])
    above = key(routes[i + 1]) if i < len(routes) - 1 else below  # an end: its one neighbour decides
    return below if below == above else None


def neighbours(i: int, count: int) -> str:
    """Which buckets :func:`neighbours_share` asked about bucket ``i`` of ``count``, for a route's detail."""
    return "buckets on both sides do" if 0 < i < count - 1 else "bucket next to it does"


def _cost(routes: Sequence[Route], estimates: Mapping[tuple[str, int], Estimate | None]) -> float:
    """Sum over buckets of log expected time (unknown times count as the bucket's worst known x2)."""
    total = 0.0
    for r in routes:
        if r.backend is None:
            total += 1e6
        elif r.us is not None:
            total += math.log(r.us)
        else:
            known = [e.us for (_, b), e in estimates.items() if b == r.bucket and e is not None]
            total += math.log(2 * max(known)) if known else 0.0
    return total


def _route(bucket: int, allowed: Sequence[Backend], explicit: str | None, rejects: Mapping[tuple[str, int], str],
           estimates: Mapping[tuple[str, int], Estimate | None], preferred: Mapping[str, int | None]) -> Route:
    runnable = [b for b in allowed if (b.name, bucket) not in rejects]
    prefix = ""
    if explicit is not None:
        if any(b.name == explicit for b in runnable):
            est = estimates.get((explicit, bucket))
            return Route(bucket, explicit, EXPLICIT, "the explicit choice" + (f"; {est.detail}" if est else ""),
                         None if est is None else est.config, None if est is None else est.us)
        reason = rejects.get((explicit, bucket), "not allowed by the weight budget")
        prefix = f"{explicit} rejects this M ({reason}); "
    runnable = [b for b in runnable if b.name != explicit]
    if not runnable:
        why = "; ".join(f"{b.name}: {rejects.get((b.name, bucket), 'left out')}" for b in allowed)
        return Route(bucket, None, GATE, prefix + f"no backend accepts this M ({why})")
    timed = [(e.us, i, b, e) for i, b in enumerate(runnable) if (e := estimates.get((b.name, bucket))) is not None]
    if timed:
        timed.sort(key=lambda t: (t[0], t[1]))
        _, _, best, est = timed[0]
        others = ", ".join(f"{b.name} {us:.1f}" for us, _, b, _ in timed[1:4])
        detail = prefix + est.detail + (f" (others: {others} us)" if others else "")
        return Route(bucket, best.name, GATE if prefix else est.source, detail, est.config, est.us)
    lo = bucket_range(bucket)[0]
    fits = [b for b in runnable if (limit := preferred.get(b.name)) is None or lo <= limit]
    first = (fits or runnable)[0]
    skipped = [f"{b.name} (preferred only for M <= {preferred[b.name]})" for b in runnable[:runnable.index(first)]]
    detail = "first in priority order (no measurement)" + (f", passing over {', '.join(skipped)}" if skipped else "")
    return Route(bucket, first.name, GATE if prefix else RULE, prefix + detail)


def _with_config(route: Route, backends: Sequence[Backend], problem: Problem,
                 estimates: Mapping[tuple[str, int], Estimate | None]) -> Route:
    """``route`` with its launch configuration parsed by the backend that will read it, and fitted by
    it to this layer's shape when it was measured at another (a modelled estimate's nearest shape)."""
    est = estimates.get((route.backend, route.bucket)) if route.backend is not None else None
    if est is None:  # the route's configuration is its estimate's
        return route
    backend = next(b for b in backends if b.name == route.backend)
    return replace(route, config=fitted_config(backend, est, problem, route.bucket))


def fitted_config(backend: Backend, est: Estimate, problem: Problem, m: int) -> Any:
    """``est``'s launch configuration as ``backend`` reads it (:meth:`Backend.launch_config`), fitted to
    ``problem``'s shape at ``m`` rows when it was measured at another (:meth:`Backend.fit_config`); None
    when it has none."""
    if est.config is None:
        return None
    config = backend.launch_config(est.config)
    if est.config_shape is not None and est.config_shape != (problem.n, problem.k):
        config = backend.fit_config(config, est.config_shape, problem, m)
    return config
