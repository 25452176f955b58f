"""How well the plan's model chooses for shapes no table holds, from measurements alone (no GPU).

    python -m benchmarks.model_check                       # the shipped H200 table, cross-validated
    python -m benchmarks.model_check --regret benchmarks/results/regret_vendors_other_model.json \
        --regret benchmarks/results/regret_novendors_other_model.json \
        --regret benchmarks/results/regret_vendors_unseen_model.json \
        --regret benchmarks/results/regret_novendors_unseen_model.json \
        --regret benchmarks/results/regret_vendors_glm_model.json \
        --regret benchmarks/results/regret_novendors_glm_model.json --out benchmarks/results/model_check.json

Choice regret: the measured time of the backend the model picks over the fastest measured time at that point
(``geomean``, ``worst``); and over the time of the layer's best single backend (the one backend fastest over
all of the layer's M buckets, geometric mean, among those measured at every one): ``vs_single_*``, what
per-bucket choice gains over an engine that runs one backend. ``--table``: the tuning table (default: the
shipped H200 table), cross-validated two ways: leave-one-shape-out (each shape removed in turn and planned
from the others) and leave-one-model-out (every shape of one model removed together: the model that serves
it first in :mod:`fp8select.measured.shapes`, else the shape alone); and each shape left out with 10, 20 or 30
of its rows put back as load-time measurement takes them (``partly_measured``); and each M bucket left out of
every shape at once (``leave_one_bucket_out``, :func:`bucket_fold`); and a first start on a device no table covers,
10, 20 or 30 rows measured a shape (``no_table``). ``--regret FILE``: a ``benchmarks.regret``
result, its pinned backends' times as the truth, planned from the table without the file's shapes (one the
table holds too is left out of it, so that every point tests the model).
``--backends a,b``: choose among those only; without it every figure comes twice, with all backends and
without the vendors (``cuda-scaled-mm`` and ``triton``).
``--out FILE`` also writes the report (the kept one, which docs/performance.md quotes: the second command).
``--eps/--power/--n-weight/--tile-penalty`` try other interpolation constants (``fp8select.measured.model``). Backends the
truth lacks are not chosen from; times are whole ops, so a pick is right or wrong by the same measure.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._stats import geomean
from fp8select.backends import DEFAULT_ORDER
from fp8select.measure.loadtime import by_closeness
from fp8select.measured import model
from fp8select.measured.shapes import served_shapes
from fp8select.measured.table import SHIPPED_DIR

Truth = dict[tuple[int, int, int], dict[str, float]]
Rows = dict[str, dict[str, dict[str, dict[str, float]]]]
"""A table's rows: backend -> ``"N,K"`` -> M bucket -> row."""
WITHOUT_VENDORS = ("cuda-scaled-mm", "triton")
PARTLY = (10, 20, 30)
"""Rows of a left-out shape put back (``partly_measured``): what a load-time budget measures of a shape."""


def _measurements(table: dict[str, Any], drop: tuple[int, int] | set[tuple[int, int]] | None = None,
                  *more: dict[str, Any]) -> model.Measurements:
    """The model's index of ``table`` (every group at its own versions) without the shape(s) ``drop``, then the
    tables ``more`` (of the same backends and versions)."""
    dropped = set() if drop is None else {drop} if isinstance(drop, tuple) else drop
    keys = {f"{n},{k}" for n, k in dropped}
    groups = [{**g, "shapes": {s: b for s, b in g["shapes"].items() if s not in keys}} for g in table["groups"]]
    return model.Measurements(table["device_name"], [{**table, "groups": groups}, *more], _installed(table))


def _installed(table: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {g["backend"]: g["versions"] for g in table["groups"]}


def table_truth(table: dict[str, Any]) -> Truth:
    """Per (N, K, M bucket) of ``table``'s dense rows, each backend's time as a plan reads it (:func:`_as_planned`)."""
    truth: Truth = {}
    for g in table["groups"]:
        for shape, buckets in g["shapes"].items():
            n, k = (int(v) for v in shape.split(","))
            for bucket, row in buckets.items():
                truth.setdefault((n, k, int(bucket)), {})[g["backend"]] = float(row["us"])
    return _as_planned(truth, _configured(table))


def _regret_truth(path: str, table: dict[str, Any]) -> Truth:
    """A regret run's pinned times as a plan reads them (:func:`_as_planned`; the backends configured as in
    ``table``: runs before the configurations were recorded ran them too)."""
    points = json.loads(Path(path).read_text())["points"]
    return _as_planned({(p["n"], p["k"], p["m"]): {b: t for b, t in p["us"].items()
                                                   if b not in ("auto", "bf16-matmul", "reference")} for p in points},
                       _configured(table))


def _configured(table: dict[str, Any]) -> set[str]:
    """The backends whose rows in ``table`` carry a launch configuration (Triton's)."""
    return {g["backend"] for g in table["groups"] for rows in g["shapes"].values() for row in rows.values()
            if row.get("config") is not None}


def _as_planned(truth: Truth, configured: set[str]) -> Truth:
    """``truth`` with the time of each ``configured`` backend at a bucket where a larger bucket's configuration
    ran faster by more than :data:`~fp8select.measured.model.FEWER_ROWS` replaced by that time, as the model
    reads rows (:func:`~fp8select.measured.model.fewer_rows`): what the plan then runs there takes no longer."""
    rows: dict[tuple[int, int, str], dict[str, dict[str, Any]]] = {}
    for (n, k, m), times in truth.items():
        for backend in configured & set(times):
            rows.setdefault((n, k, backend), {})[str(m)] = {"us": times[backend], "config": {}}
    out = {point: dict(times) for point, times in truth.items()}
    for (n, k, backend), buckets in rows.items():
        for bucket, row in model.fewer_rows(buckets).items():
            out[(n, k, int(bucket))][backend] = row["us"]
    return out


def _single_best(truth: Truth) -> dict[tuple[int, int], str]:
    """Per layer, the backend with the least geometric-mean time over its M buckets, among those timed at all."""
    layers: dict[tuple[int, int], list[dict[str, float]]] = {}
    for (n, k, _), times in truth.items():
        layers.setdefault((n, k), []).append(times)
    out = {}
    for shape, points in layers.items():
        everywhere = set.intersection(*(set(t) for t in points))
        if everywhere:
            out[shape] = min(sorted(everywhere), key=lambda b: sum(math.log(t[b]) for t in points))
    return out


def choice_regret(truth: Truth, measurements_for: Any, *, rule: bool = False,
                  single: dict[tuple[int, int], str] | None = None) -> list[dict[str, Any]]:
    """Per point: the model's pick among the backends with a true time, its regret against the fastest and
    its time over the layer's best single backend's (``single``: named over other points, else over ``truth``'s).
    A point where no backend has an estimate is left out, or with ``rule`` the first of them in priority order
    runs there, as the plan does."""
    out = []
    single = _single_best(truth) if single is None else single
    for (n, k, m), times in sorted(truth.items()):
        meas = measurements_for(n, k)
        est = {b: e.us for b in times if (e := meas.estimate(b, n, k, m)) is not None}
        if not est and not rule:
            continue
        pick = min(est, key=lambda b: est[b]) if est else _first(times)
        best = min(times, key=lambda b: times[b])
        one = single.get((n, k), pick)
        out.append({"n": n, "k": k, "m": m, "pick": pick, "best": best, "regret": times[pick] / times[best],
                    "single": one, "vs_single": times[pick] / times[one]})
    return out


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The regrets' figures; ``layers_slower_than_single``: the layers whose picks take longer than their best
    single backend (geometric mean over their points), and ``layer_vs_single_worst`` the most."""
    regrets = [p["regret"] for p in points]
    worst = max(points, key=lambda p: p["regret"])
    layers: dict[tuple[int, int], list[float]] = {}
    for p in points:
        layers.setdefault((p["n"], p["k"]), []).append(p["vs_single"])
    per_layer = [geomean(v) for v in layers.values()]
    return {"points": len(points), "geomean": geomean(regrets),
            "worst": round(worst["regret"], 4), "worst_point": {k: worst[k] for k in ("n", "k", "m", "pick", "best")},
            "over_8pct": sum(r > 1.08 for r in regrets), "over_3pct": sum(r > 1.03 for r in regrets),
            "vs_single_geomean": geomean([p["vs_single"] for p in points]),
            "vs_single_worst": round(max(p["vs_single"] for p in points), 4),
            "layers": len(layers), "layers_slower_than_single": sum(g > 1 for g in per_layer),
            "layer_vs_single_worst": max(per_layer)}


def model_of(shape: tuple[int, int]) -> str:
    """The model whose projection ``shape`` is first in the catalogue, else the shape itself."""
    for served in served_shapes():
        if (served.n, served.k) == shape:
            return served.uses[0].model
    return f"{shape[0]}x{shape[1]}"


def cross_validation(table: dict[str, Any], keep: set[str] | None) -> dict[str, Any]:
    """Leave-one-shape-out and leave-one-model-out summaries of ``table`` (choosing among ``keep`` only)."""
    truth = _only(table_truth(table), keep)
    folds: dict[str, dict[tuple[int, int], set[tuple[int, int]]]] = {"shape": {}, "model": {}}
    by_model: dict[str, set[tuple[int, int]]] = {}
    for n, k, _ in truth:
        folds["shape"][(n, k)] = {(n, k)}
        by_model.setdefault(model_of((n, k)), set()).add((n, k))
    folds["model"] = {shape: group for group in by_model.values() for shape in group}
    out: dict[str, Any] = {}
    for name, held in folds.items():
        out[f"leave_one_{name}_out"] = summary(choice_regret(truth, _without(table, held)))
    out["models"] = {name: sorted(f"{n}x{k}" for n, k in group) for name, group in sorted(by_model.items())}
    return out


def partly_measured(table: dict[str, Any], keep: set[str] | None, budgets: Sequence[int] = PARTLY) -> dict[str, Any]:
    """Each shape of ``table`` left out, then as many of its rows put back as load-time measurement takes
    within a budget of that many rows (whole M buckets, the closest contests first, as
    :func:`fp8select.measure.loadtime.points_to_measure` orders them), and its points planned from those and
    the other shapes: a summary per budget."""
    truth = _only(table_truth(table), keep)
    points: dict[int, list[dict[str, Any]]] = {budget: [] for budget in budgets}
    for n, k in sorted({(n, k) for n, k, _ in truth}):
        without = _measurements(table, (n, k))
        at = {m: times for (pn, pk, m), times in truth.items() if (pn, pk) == (n, k)}
        order = by_closeness({m: {b: without.estimate(b, n, k, m) for b in times} for m, times in at.items()})
        for budget in budgets:
            rows: dict[str, dict[str, dict[str, float]]] = {}
            taken = 0
            for m, names in order:
                if taken + len(names) > budget:
                    break
                taken += len(names)
                for name in names:
                    rows.setdefault(name, {})[str(m)] = {"us": at[m][name]}
            partly = _measurements(table, (n, k), _rows_table(table, {b: {f"{n},{k}": r} for b, r in rows.items()}))
            points[budget] += choice_regret({(n, k, m): times for m, times in at.items()}, lambda _n, _k, partly=partly: partly)
    return {f"{budget}_rows_measured": summary(found) for budget, found in points.items()}


def bucket_fold(table: dict[str, Any], keep: set[str] | None) -> dict[str, Any]:
    """Each M bucket of ``table`` left out of every shape at once (a table timed at some M only) and its points
    planned from the other buckets: the summary over the buckets between two measured ones (none beyond), and
    ``rule``: the regret of the priority order's first backend there, what ran before the model interpolated."""
    truth = _only(table_truth(table), keep)
    single = _single_best(truth)
    points: list[dict[str, Any]] = []
    for bucket in sorted({m for _, _, m in truth}):
        groups = [{**g, "shapes": {s: {b: r for b, r in rows.items() if b != str(bucket)} for s, rows in g["shapes"].items()}}
                  for g in table["groups"]]
        without = _measurements({**table, "groups": groups})
        points += choice_regret({p: t for p, t in truth.items() if p[2] == bucket}, lambda _n, _k, w=without: w,
                                single=single)
    planned = [truth[(p["n"], p["k"], p["m"])] for p in points]
    rule = [times[_first(times)] / min(times.values()) for times in planned]
    return {**summary(points), "rule": {"geomean": geomean(rule), "worst": round(max(rule), 4)}}


def _first(times: dict[str, float]) -> str:
    """The first backend in priority order among those timed: what the plan runs where nothing is estimated."""
    return next(b for b in DEFAULT_ORDER if b in times)


def no_table(table: dict[str, Any], keep: set[str] | None, budgets: Sequence[int] = PARTLY) -> dict[str, Any]:
    """A first start on a device no table covers: ``table``'s shapes prepared one after another (in its order), each
    measuring as many rows as load-time measurement takes within a budget of that many (whole M buckets, as
    :func:`fp8select.measure.loadtime.points_to_measure` orders them from the rows taken so far), then planned
    from those rows, where a bucket no backend has an estimate at runs the priority order: a summary per budget."""
    truth = _only(table_truth(table), keep)
    out = {}
    for budget in budgets:
        rows: Rows = {}
        known = _measurements(_rows_table(table, rows))  # the rows taken so far, indexed again as they grow
        points: list[dict[str, Any]] = []
        for n, k in sorted({(n, k) for n, k, _ in truth}):
            at = {m: times for (pn, pk, m), times in truth.items() if (pn, pk) == (n, k)}
            taken = 0
            for m, names in by_closeness({m: {b: known.estimate(b, n, k, m) for b in times} for m, times in at.items()}):
                if taken + len(names) > budget:
                    break
                taken += len(names)
                for name in names:
                    rows.setdefault(name, {}).setdefault(f"{n},{k}", {})[str(m)] = {"us": at[m][name]}
            if taken:
                known = _measurements(_rows_table(table, rows))
            points += choice_regret({(n, k, m): times for m, times in at.items()}, lambda _n, _k, w=known: w, rule=True)
        out[f"no_table_{budget}_rows"] = summary(points)
    return out


def _rows_table(table: dict[str, Any], rows: Rows) -> dict[str, Any]:
    """``rows`` as a table of ``table``'s device, each backend at its versions there."""
    installed = _installed(table)
    return {**table, "groups": [{"backend": b, "versions": installed[b], "shapes": shapes} for b, shapes in rows.items()]}


def unseen_regret(table: dict[str, Any], truth: Truth) -> dict[str, Any]:
    """The summary of ``truth`` (another run's times) planned from ``table`` without the shapes it holds."""
    unseen = _measurements(table, {(n, k) for n, k, _ in truth})
    return summary(choice_regret(truth, lambda n, k: unseen))


def _without(table: dict[str, Any], held: dict[tuple[int, int], set[tuple[int, int]]]) -> Any:
    """``(n, k) -> Measurements`` of ``table`` without the shapes held out with (N, K), each fold built once."""
    cache: dict[frozenset[tuple[int, int]], model.Measurements] = {}

    def measurements_for(n: int, k: int) -> model.Measurements:
        key = frozenset(held[(n, k)])
        if key not in cache:
            cache[key] = _measurements(table, held[(n, k)])
        return cache[key]
    return measurements_for


def _only(truth: Truth, keep: set[str] | None) -> Truth:
    return truth if keep is None else {p: {b: t for b, t in times.items() if b in keep} for p, times in truth.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default=str(SHIPPED_DIR / "tuning-nvidia-h200.json"))
    parser.add_argument("--regret", action="append", default=[], help="a regret.py result (repeatable)")
    parser.add_argument("--backends", help="comma list: choose among these only")
    parser.add_argument("--eps", type=float, default=model._EPS)
    parser.add_argument("--power", type=float, default=model._POWER)
    parser.add_argument("--n-weight", type=float, default=model._N_WEIGHT)
    parser.add_argument("--tile-penalty", type=float, default=model.TILE_PENALTY)
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args(argv)
    model._EPS, model._POWER, model._N_WEIGHT, model.TILE_PENALTY = args.eps, args.power, args.n_weight, args.tile_penalty
    table = json.loads(Path(args.table).read_text())
    report: dict[str, Any] = {"constants": {"eps": args.eps, "power": args.power, "n_weight": args.n_weight,
                                            "tile_penalty": args.tile_penalty}}
    choices = {args.backends: set(args.backends.split(","))} if args.backends else {
        "all": None, "without vendors": set(WITHOUT_VENDORS)}
    for label, keep in choices.items():
        report[label] = cross_validation(table, keep)
        report[label].update(partly_measured(table, keep))
        report[label]["leave_one_bucket_out"] = bucket_fold(table, keep)
        report[label].update(no_table(table, keep))
        report["models"] = report[label].pop("models")  # the same for every choice
        for path in args.regret:
            report[label][f"{Path(path).parent.name}/{Path(path).name}"] = unseen_regret(
                table, _only(_regret_truth(path, table), keep))
    text = _text(report)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def _text(report: dict[str, Any]) -> str:
    """The report as JSON, a line per fold (the form results are kept in: small, and a diff per fold)."""
    def value(v: Any) -> str:
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(x)}" for k, x in v.items()) + "\n }"
        return json.dumps(v)

    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in report.items()) + "\n}"


if __name__ == "__main__":
    raise SystemExit(main())
