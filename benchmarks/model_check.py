"""How well the plan's model chooses for shapes no table holds, from measurements alone (no GPU).

    python -m benchmarks.model_check                       # the shipped H200 table, each shape left out in turn
    python -m benchmarks.model_check --regret benchmarks/results/regret_vendors_other_model.json

Choice regret: the measured time of the backend the model picks over the fastest measured time at that point.
``--table``: the tuning table (default: the shipped H200 table). Leave-one-out: each of its shapes is removed in
turn and planned from the others, against its own rows. ``--regret FILE``: a ``benchmarks.regret`` result on
shapes outside the table, its pinned backends' times as the truth, planned from the whole table.
``--backends a,b``: choose among those only (``cuda-scaled-mm,triton``: a machine without the vendors).
``--eps/--power/--n-weight`` try other interpolation constants (``fp8select.measured.model``). Backends the
truth lacks are not chosen from; times are whole ops, so a pick is right or wrong by the same measure.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from fp8select.measured import model
from fp8select.measured.table import SHIPPED_DIR

Truth = dict[tuple[int, int, int], dict[str, float]]


def _measurements(table: dict[str, Any], drop: tuple[int, int] | None = None) -> model.Measurements:
    """The model's index of ``table`` (every group at its own versions), without shape ``drop``."""
    groups = [{**g, "shapes": {s: b for s, b in g["shapes"].items() if drop is None or s != f"{drop[0]},{drop[1]}"}}
              for g in table["groups"]]
    installed = {g["backend"]: g["versions"] for g in table["groups"]}
    return model.Measurements(table["device_name"], [{**table, "groups": groups}], installed)


def _table_truth(table: dict[str, Any]) -> Truth:
    truth: Truth = {}
    for g in table["groups"]:
        for shape, buckets in g["shapes"].items():
            n, k = (int(v) for v in shape.split(","))
            for bucket, row in buckets.items():
                truth.setdefault((n, k, int(bucket)), {})[g["backend"]] = float(row["us"])
    return truth


def _regret_truth(path: str) -> Truth:
    points = json.loads(Path(path).read_text())["points"]
    return {(p["n"], p["k"], p["m"]): {b: t for b, t in p["us"].items() if b not in ("auto", "bf16-matmul", "reference")}
            for p in points}


def choice_regret(truth: Truth, measurements_for: Any) -> list[dict[str, Any]]:
    """Per point: the model's pick among the backends with a true time, and its regret."""
    out = []
    for (n, k, m), times in sorted(truth.items()):
        meas = measurements_for(n, k)
        est = {b: e.us for b in times if (e := meas.estimate(b, n, k, m)) is not None}
        if not est:
            continue
        pick, best = min(est, key=lambda b: est[b]), min(times, key=lambda b: times[b])
        out.append({"n": n, "k": k, "m": m, "pick": pick, "best": best, "regret": times[pick] / times[best]})
    return out


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    regrets = [p["regret"] for p in points]
    worst = max(points, key=lambda p: p["regret"])
    return {"points": len(points), "geomean": round(math.exp(sum(map(math.log, regrets)) / len(regrets)), 4),
            "worst": round(worst["regret"], 4), "worst_point": {k: worst[k] for k in ("n", "k", "m", "pick", "best")},
            "over_8pct": sum(r > 1.08 for r in regrets), "over_3pct": sum(r > 1.03 for r in regrets)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default=str(SHIPPED_DIR / "tuning-nvidia-h200.json"))
    parser.add_argument("--regret", action="append", default=[], help="a regret.py result (repeatable)")
    parser.add_argument("--backends", help="comma list: choose among these only")
    parser.add_argument("--eps", type=float, default=model._EPS)
    parser.add_argument("--power", type=float, default=model._POWER)
    parser.add_argument("--n-weight", type=float, default=model._N_WEIGHT)
    args = parser.parse_args(argv)
    model._EPS, model._POWER, model._N_WEIGHT = args.eps, args.power, args.n_weight
    table = json.loads(Path(args.table).read_text())
    report: dict[str, Any] = {"constants": {"eps": args.eps, "power": args.power, "n_weight": args.n_weight},
                              "backends": args.backends or "all"}
    keep = set(args.backends.split(",")) if args.backends else None

    def only(truth: Truth) -> Truth:
        return truth if keep is None else {p: {b: t for b, t in times.items() if b in keep} for p, times in truth.items()}

    cache: dict[tuple[int, int], model.Measurements] = {}
    loo = choice_regret(only(_table_truth(table)), lambda n, k: cache.setdefault((n, k), _measurements(table, (n, k))))
    report["leave_one_out"] = summary(loo)
    whole = _measurements(table)
    for path in args.regret:
        report[f"{Path(path).parent.name}/{Path(path).name}"] = summary(choice_regret(only(_regret_truth(path)),
                                                                                 lambda n, k: whole))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
