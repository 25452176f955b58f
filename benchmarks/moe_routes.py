"""Every MoE route of a point side by side, from ``tune --moe --json`` runs: what the plan's ranking picks.

    python -m fp8select tune --moe all --m 1,4,...,8192 --force --max-configs 1 --out T.json --json ROWS.json
    python -m benchmarks.moe_routes ROWS.json [ROWS.json ...] --out benchmarks/results/moe_routes_h100.json
    python -m benchmarks.moe_routes --table fp8select/data/tuning-nvidia-h200.json
    python -m benchmarks.moe_routes --report benchmarks/results/moe_routes_h100.json \
        --packages deep_gemm=2.6.1,sgl_kernel=0.4.4 --to-table fp8select/data/tuning-nvidia-h100-80gb-hbm3.json

``--table``: a tuning table's MoE rows instead, where every route of a point was timed together (the
shipped H200 table's: `tune --moe all --force --max-configs 1`, merged with ``merge_tuning --all``); the
table keeps no ``rel_err``, and the report is printed (the table is the kept data), or written to ``--out``.
``--report``: a kept report of this tool, written as the tuning table to ship for its device (``--to-table``,
:func:`shippable`).

``tune --moe`` times every route of a point together, under uniform and then skewed routing (a row's
``us`` and ``skewed_us``), and checks each against the reference first (``rel_err``). This distils the
runs (later files winning on equal points) into a point per line: each route's ``[uniform, skewed]``
time, the route that is fastest under uniform routing alone and the one
:func:`fp8select.moe_plan.rank_routes` ranks first with both (the plan's measured pick, before its
smoothing of near ties), each route's worst ``rel_err`` per shape, and Triton's speed over DeepGEMM
contiguous's from M 1024 (the MoE target: at least 0.8x).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.distill_limits import json_lines, portable
from fp8select.backends.moe_builtin import MOE_BACKENDS
from fp8select.capabilities import Capabilities
from fp8select.kernels.moe_config import default_config
from fp8select.measured.moe import parse_moe_shape
from fp8select.measured.table import backend_versions, new_table, save_table
from fp8select.moe_plan import rank_routes

TRITON, CONTIGUOUS = "triton/sorted", "deepgemm/contiguous"
FROM_M = 1024


def _merged(runs: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[int, dict[str, dict[str, Any]]]], dict[str, dict[str, float]]]:
    """``shape -> m -> route -> row`` of the runs' tables, and ``shape -> route -> worst rel_err``."""
    points: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    errors: dict[str, dict[str, float]] = {}
    for run in runs:
        for entry in run["table"].get("moe", ()):
            route = f"{entry['backend']}/{entry['layout']}"
            for shape, buckets in entry["shapes"].items():
                for m, row in buckets.items():
                    points.setdefault(shape, {}).setdefault(int(m), {})[route] = row
        for row in run["rows"]:
            if "rel_err" in row:
                worst = errors.setdefault(row["shape"], {})
                worst[row["route"]] = max(worst.get(row["route"], 0.0), round(row["rel_err"], 4))
    return points, errors


def runnable(routes: Iterable[str]) -> dict[str, list[str]]:
    """``backend -> layouts`` of ``routes`` (``backend/layout`` names) in priority order, as a plan passes them to
    :func:`fp8select.moe_plan.rank_routes` (its tie-break)."""
    names = set(routes)
    found = {cls.name: [lay for lay in cls.layouts if f"{cls.name}/{lay}" in names] for cls in MOE_BACKENDS}
    return {name: layouts for name, layouts in found.items() if layouts}


def _point(m: int, rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    ranked = rank_routes(m, runnable(rows), {r: {m: row} for r, row in rows.items()})
    return {"m": m, "us": {r: [row["us"], row.get("skewed_us")] for r, row in rows.items()},
            "fastest_uniform": min(rows, key=lambda r: rows[r]["us"]),
            "ranked_first": f"{ranked[0].backend}/{ranked[0].layout}"}


def distil(runs: Sequence[Mapping[str, Any]], command: str) -> dict[str, Any]:
    """The report (``--out``'s content as a dict): a header, then ``points`` (each with its ``shape``)."""
    points, errors = _merged(runs)
    rows = [{"shape": shape, **_point(m, by_m[m])} for shape, by_m in points.items() for m in sorted(by_m)]
    ratios = {p["shape"] + f" M {p['m']}": round(p["us"][CONTIGUOUS][0] / p["us"][TRITON][0], 3) for p in rows
              if p["m"] >= FROM_M and TRITON in p["us"] and CONTIGUOUS in p["us"]}
    moved = [f"{p['shape']} M {p['m']}: {p['fastest_uniform']} -> {p['ranked_first']}" for p in rows
             if p["fastest_uniform"] != p["ranked_first"]]
    devices = sorted({run["environment"].get("device", "?") for run in runs})
    summary = {"points": len(rows), "moved_by_skew": moved,
               "triton_speed_over_deepgemm_contiguous": ratios,
               "triton_at_least_0.8x": f"{sum(v >= 0.8 for v in ratios.values())} of {len(ratios)}",
               "first_by_ranking": {r: sum(p["ranked_first"] == r for p in rows)
                                    for r in sorted({p["ranked_first"] for p in rows})}}
    return {"what": "every MoE route of a point timed together as the whole experts op (interleaved CUDA-graph "
                    "replays, weights rotated past the L2), under uniform and then skewed routing",
            "device": devices[0] if len(devices) == 1 else devices,
            "environment": [run["environment"] for run in runs], "command": command,
            "us": "per route [uniform, skewed] median us; fastest_uniform: the least uniform time; ranked_first: "
                  "moe_plan.rank_routes's first (by the worse of a route's two ratios to the fastest)",
            "rel_err_worst": errors, "summary": summary, "points": rows}


def as_table(report: Mapping[str, Any]) -> dict[str, Any]:
    """A report's times as a tuning table's MoE rows (``us``, and ``skewed_us`` where timed; no versions: the
    report keeps the runs' environments instead), for :mod:`benchmarks.moe_model_check` to cross-validate the
    model on them."""
    entries: dict[str, dict[str, Any]] = {}
    for point in report["points"]:
        for route, (us, skewed) in point["us"].items():
            backend, layout = route.split("/", 1)
            entry = entries.setdefault(route, {"backend": backend, "layout": layout, "versions": {}, "shapes": {}})
            row = {"us": us} if skewed is None else {"us": us, "skewed_us": skewed}
            entry["shapes"].setdefault(point["shape"], {})[str(point["m"])] = row
    device = report["device"]
    return {"device_name": device if isinstance(device, str) else ", ".join(device), "moe": list(entries.values())}


def shippable(report: Mapping[str, Any], packages: Mapping[str, str], source: str = "the report") -> dict[str, Any]:
    """A kept report of one device's runs as the tuning table to ship for it: :func:`as_table`'s rows, each
    route's at the versions its runs had (torch, CUDA and Triton from the report's environments, which must
    agree; each backend's own packages from ``packages``, as their releases), Triton's at the rule's
    configuration, which those runs timed (``tune --moe --max-configs 1`` where no table of the device holds
    one: :func:`fp8select.kernels.moe_config.tuning_configs` starts from the rule). No dense rows; the note
    names ``source`` (where the report is kept) and its runs' command."""
    if not isinstance(report["device"], str):
        raise ValueError(f"a table is one device's: the report's runs came from {', '.join(report['device'])}")
    found = {(env["torch"], env["cuda"], env["triton"]) for env in report["environment"]}
    if len(found) != 1:
        raise ValueError(f"the report's runs had other torch, CUDA or Triton versions: {sorted(found)}")
    torch_version, cuda, triton = found.pop()
    # the snapshot the runs had, as far as a row's versions read it (backend_versions: what a row depends on)
    caps = Capabilities(device_kind="cuda", device_name=report["device"], torch_version=torch_version,
                        cuda_version=cuda, packages={**packages, "triton": triton})
    own = {cls.name: cls.packages for cls in MOE_BACKENDS}
    table = new_table(report["device"], note=f"MoE rows only, written by benchmarks.moe_routes --to-table from {source}, "
                                             f"which says of its runs: {report['command']}")
    table["moe"] = as_table(report)["moe"]
    for entry in table["moe"]:
        if missing := [name for name in own[entry["backend"]] if name not in packages]:
            raise ValueError(f"--packages: {entry['backend']}'s rows need the version of {', '.join(missing)}")
        entry["versions"] = backend_versions(caps, own[entry["backend"]])
        if entry["backend"] == "triton":
            for shape, rows in entry["shapes"].items():
                experts, _, _, top_k = parse_moe_shape(shape)
                for m, row in rows.items():
                    row["config"] = default_config(int(m), top_k, experts).to_dict()
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_routes", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", help="tune --moe --json files")
    parser.add_argument("--table", help="a tuning table whose MoE rows are one run's (instead of runs)")
    parser.add_argument("--out", help="the distilled report (required with runs)")
    parser.add_argument("--report", help="a kept report of this tool, written as a table to ship (with --to-table)")
    parser.add_argument("--to-table", help="where --report's table goes")
    parser.add_argument("--packages", default="", help="NAME=VERSION,...: the backends' own packages the report's runs had")
    parser.add_argument("--command", default="python -m fp8select tune --moe ... --force --max-configs 1 --json ROWS.json",
                        help="the tune command the runs came from, as the report says it")
    args = parser.parse_args(argv)
    if args.report or args.to_table:
        if not (args.report and args.to_table) or args.runs or args.table:
            parser.error("--report and --to-table go together, without runs or --table")
        packages = dict(item.split("=", 1) for item in args.packages.split(",") if "=" in item)
        try:
            table = shippable(json.loads(Path(args.report).read_text()), packages, portable(args.report))
        except ValueError as exc:
            parser.error(str(exc))
        save_table(args.to_table, table)
        print(f"moe_routes: {sum(len(r) for e in table['moe'] for r in e['shapes'].values())} rows of "
              f"{len(table['moe'])} routes to {args.to_table}")
        return
    if bool(args.runs) == bool(args.table) or (args.runs and not args.out):
        parser.error("give tune --moe --json files and --out, or --table")
    if args.table:
        table = json.loads(Path(args.table).read_text())
        runs = [{"environment": {"device": table["device_name"]}, "table": table, "rows": []}]
    else:
        runs = [json.loads(Path(p).read_text()) for p in args.runs]
    report = distil(runs, f"the MoE rows of {args.table}" if args.table else args.command)
    head = {k: v for k, v in report.items() if k != "points"}
    text = json_lines(head, {"points": report["points"]})
    if not args.out:
        print(text, end="")
        return
    Path(args.out).write_text(text, encoding="utf-8")
    s = report["summary"]
    print(f"moe_routes: {s['points']} points, {len(s['moved_by_skew'])} moved by skew, "
          f"Triton at least 0.8x DeepGEMM contiguous at {s['triton_at_least_0.8x']}")


if __name__ == "__main__":
    main()
