"""How well MoE plans choose for shapes no table holds, from the tuning table's MoE rows alone (no GPU).

    python -m benchmarks.moe_model_check                   # the shipped H200 table
    python -m benchmarks.moe_model_check --out benchmarks/results/moe_model_check.json
    python -m benchmarks.moe_model_check --routes benchmarks/results/moe_routes_h100.json \
        --out benchmarks/results/moe_model_check_h100.json    # another device's rows (benchmarks.moe_routes)

Each MoE shape of ``--table`` is left out in turn and its routes estimated from the other shapes'
rows (:meth:`fp8select.measured.moe.MoeMeasurements.estimates`, what the plan's ``model`` reason
reads); leave-one-model-out leaves out together the shapes of one model's experts where there are
several (equal ``H, I, k``: DeepSeek-V3's at 8, 32 and 256 local experts), the harder question of a
model none of whose experts were measured; leave-one-bucket-out leaves out one M bucket of every shape, which
the model then interpolates from the measured buckets on either side (a table timed at some M only; the first
and last buckets, with one side, have no estimate and no points). At each left-out point the pick is the route the plan's
ranking puts first (:func:`fp8select.moe_plan.rank_estimates`: under uniform and skewed
routing where the rows hold both) among those with a measured time there, scored by that time over the
fastest measured route's (``model``: ``geomean``, ``worst``, ``over_8pct``; ``model_skewed``: the same
under skewed routing, where the rows hold it), next to what the plan did before the model: the rule
(DeepGEMM masked up to M :data:`fp8select.moe_plan.MASKED_MAX_M`, contiguous above: the first backend
in priority order where every route's gate accepts, as on the H200) and always running one route
(``--always``, default ``cutlass/offsets``, the fastest at most measured points). ``time_error``: the
chosen route's estimate against its measured time (geometric mean and worst of the larger over the
smaller). Times are the whole experts op, so a pick is right or wrong by the same measure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks import moe_routes
from benchmarks._stats import geomean
from fp8select.measured.moe import MoeMeasurements
from fp8select.measured.table import SHIPPED_DIR
from fp8select.moe_plan import MASKED_MAX_M, rank_estimates

RESULTS = Path(__file__).resolve().parent / "results"
Shape = tuple[int, int, int, int]
Truth = dict[tuple[Shape, int], dict[str, float]]
SCORED = ("model", "model_skewed", "rule", "always")


def table_truth(table: dict[str, Any], key: str = "us") -> Truth:
    """``(shape, bucket) -> route -> us`` of the table's MoE rows (later entries winning); ``key="skewed_us"``:
    their times under skewed routing, where they hold one."""
    truth: Truth = {}
    for entry in table.get("moe", ()):
        route = f"{entry['backend']}/{entry['layout']}"
        for shape, buckets in entry["shapes"].items():
            e, h, i, k = (int(v) for v in shape.split(","))
            for bucket, row in buckets.items():
                if key in row:
                    truth.setdefault(((e, h, i, k), int(bucket)), {})[route] = float(row[key])
    return truth


def without(table: dict[str, Any], held: set[Shape], bucket: int | None = None) -> MoeMeasurements:
    """The table's MoE rows without the shapes ``held`` (with ``bucket``: without their rows at that M bucket
    only), every entry at its own versions."""
    keys = {",".join(map(str, s)) for s in held}
    entries = [{**e, "shapes": {s: b if s not in keys else {m: r for m, r in b.items() if int(m) != bucket}
                                for s, b in e["shapes"].items() if s not in keys or bucket is not None}}
               for e in table.get("moe", ())]
    installed = {e["backend"]: e["versions"] for e in table.get("moe", ())}
    return MoeMeasurements([{"moe": entries}], installed)


def rule_route(bucket: int) -> str:
    return "deepgemm/masked" if bucket <= MASKED_MAX_M else "deepgemm/contiguous"


def fold_points(table: dict[str, Any], truth: Truth, held: set[Shape], always: str,
                skewed: Truth | None = None, held_bucket: int | None = None) -> list[dict[str, Any]]:
    """Per left-out point: the model's pick and each chooser's time over the fastest (``skewed``: the times
    under skewed routing, where every route of the point has one). ``held_bucket``: only that M bucket of
    the ``held`` shapes is left out."""
    measurements = without(table, held, held_bucket)
    out = []
    for shape in sorted(held):
        estimates = measurements.estimates(*shape)
        for (s, bucket), times in sorted(truth.items()):
            if s != shape or held_bucket not in (None, bucket):
                continue
            est = {r: e[bucket] for r, e in estimates.items() if r in times and bucket in e}
            if not est:
                continue
            ranked = rank_estimates(bucket, moe_routes.runnable(est), estimates)
            pick = f"{ranked[0].backend}/{ranked[0].layout}"
            best = min(times.values())
            point = {"shape": shape, "m": bucket, "pick": pick, "best": min(times, key=lambda r: times[r]),
                     "model": times[pick] / best, "error": max(est[pick].us, times[pick]) / min(est[pick].us, times[pick])}
            under_skew = (skewed or {}).get((s, bucket), {})
            if set(under_skew) == set(times):
                point["model_skewed"] = under_skew[pick] / min(under_skew.values())
            for name, route in (("rule", rule_route(bucket)), ("always", always)):
                if route in times:
                    point[name] = times[route] / best
            out.append(point)
    return out


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"points": len(points)}
    if not points:  # nothing left to model from
        return out
    for name in SCORED:
        scored = [p for p in points if name in p]  # the rule's and the one route's measured there
        if scored:
            values = [p[name] for p in scored]
            worst = max(scored, key=lambda p: p[name])
            out[name] = {"geomean": geomean(values), "worst": round(worst[name], 4), "worst_at": _where(worst),
                         "over_8pct": sum(v > 1.08 for v in values), "points": len(values)}
    errors = [p["error"] for p in points]
    out["time_error"] = {"geomean": geomean(errors), "worst": round(max(errors), 4)}
    return out


def _where(point: dict[str, Any]) -> str:
    return f"{','.join(map(str, point['shape']))} M {point['m']}"


def cross_validation(table: dict[str, Any], always: str = "cutlass/offsets") -> dict[str, Any]:
    """Leave-one-shape-out, leave-one-model-out and leave-one-bucket-out (one M bucket of every shape left out,
    modelled from the buckets measured on either side of it, as for a table timed at some M only): per fold its
    summary and picks, and the summary of each."""
    truth, skewed = table_truth(table), table_truth(table, "skewed_us")
    shapes = sorted({s for s, _ in truth})
    models: dict[tuple[int, int, int], set[Shape]] = {}
    for s in shapes:
        models.setdefault(s[1:], set()).add(s)
    out: dict[str, Any] = {}
    buckets = sorted({b for _, b in truth})
    for name, folds in (("leave_one_shape_out", [({s}, None) for s in shapes]),
                        ("leave_one_model_out", [(g, None) for g in models.values() if len(g) > 1]),
                        ("leave_one_bucket_out", [(set(shapes), b) for b in buckets])):
        every: list[dict[str, Any]] = []
        rows = []
        for held, bucket in folds:
            points = fold_points(table, truth, held, always, skewed, bucket)
            every.extend(points)
            label = [f"M {bucket}"] if bucket is not None else [",".join(map(str, s)) for s in sorted(held)]
            rows.append({"held": label, **summary(points),
                         "picks": {f"{','.join(map(str, p['shape']))} M {p['m']}": [p["pick"], round(p["model"], 4)]
                                   for p in points if p["pick"] != p["best"]}})
        out[name] = {"summary": summary(every), "folds": rows}
    return out


def text_report(report: dict[str, Any]) -> str:
    head = f"{'left out':<36} {'points':>6}  " + "  ".join(f"{n + ' geo/worst':>17}" for n in SCORED) + "  time error"
    lines = [head]
    for name in ("leave_one_shape_out", "leave_one_model_out", "leave_one_bucket_out"):
        part = report[name]
        for fold in [*part["folds"], {"held": [name.replace("_", "-")], **part["summary"]}]:
            if not fold["points"]:
                continue
            cells = "  ".join(f"{fold[n]['geomean']:>8.3f} {fold[n]['worst']:>8.3f}" if n in fold else f"{'-':>17}"
                              for n in SCORED)
            held = fold["held"][0] if len(fold["held"]) == 1 else f"{len(fold['held'])} shapes of H,I,k {fold['held'][0].split(',', 1)[1]}"
            lines.append(f"{held:<36} {fold['points']:>6}  {cells}  {fold['time_error']['geomean']:.2f}")
        lines.append("")
    return "\n".join(lines).rstrip()


def write_compact(path: str, report: dict[str, Any]) -> None:
    """One line per key, per fold: small enough to keep in benchmarks/results/."""
    lines = ["{"]
    items = list(report.items())
    for i, (key, value) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(value, dict) and "folds" in value:
            lines.append(f' {json.dumps(key)}: {{"summary": {json.dumps(value["summary"])}, "folds": [')
            lines.extend(f"  {json.dumps(f)}" + ("," if j < len(value["folds"]) - 1 else "")
                         for j, f in enumerate(value["folds"]))
            lines.append(" ]}" + end)
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{end}")
    lines.append("}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--table", default=str(SHIPPED_DIR / "tuning-nvidia-h200.json"))
    source.add_argument("--routes", help="a benchmarks.moe_routes report instead of a table")
    parser.add_argument("--always", default="cutlass/offsets", help="the one route to compare with (backend/layout)")
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)
    path = Path(args.routes or args.table)
    data = json.loads(path.read_text(encoding="utf-8"))
    table = moe_routes.as_table(data) if args.routes else data
    kept = {SHIPPED_DIR.resolve(): "fp8select/data", RESULTS.resolve(): "benchmarks/results"}.get(path.resolve().parent)
    report: dict[str, Any] = {
        "tool": "benchmarks.moe_model_check", ("routes" if args.routes else "table"): f"{kept}/{path.name}" if kept else path.name,
        "device_name": table.get("device_name"), "always": args.always,
        "versions": {f"{e['backend']}/{e['layout']}": e["versions"] for e in table.get("moe", ())},
        **cross_validation(table, args.always)}
    print(text_report(report))
    if args.out:
        write_compact(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
