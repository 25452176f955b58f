"""How close the automatic choice comes to the fastest backend, per point (the selection targets).

    python -m benchmarks.regret --shapes deepseek-v3 --label vendors --out regret_vendors_deepseek.json
    python -m benchmarks.regret --ties 0.03 --label vendors --out regret_vendors_ties.json
    python -m benchmarks.regret --worst 24 --label vendors --out regret_vendors_worst.json
    python -m benchmarks.regret --shipped 1/2 --label vendors-fresh --out regret_vendors_fresh_1.json

Times, by the recipe of docs/measurements.md, every accepted backend pinned (a selection whose chain is that
backend alone) and the ``auto`` layer (``resolve().prepare()``: its plan), side by side for each
(N, K, M): whole op with quantization, CUDA-graph replay, weights rotated past the L2, all of
a point's columns timed together with their replays interleaved (``timing.time_graphs``).
Writes the distilled figures: per point every backend's median, the launch configuration each pinned
backend that has one ran (``configs``: Triton's), what auto ran and its regret (auto time / fastest
pinned time), and the summary: regret geomean and worst, and how the ideal per-point choice compares
with always running one backend.

``--ties MARGIN`` times, instead of ``--shapes`` x ``--m``, the points of this device's shipped table where
the two fastest rows of this machine's backends lie within MARGIN (a fraction) of each other: the near ties
that one timing orders by chance, a run to fold into the table (``benchmarks/merge_tuning.py --fold``).
``--shipped PART/PARTS`` times every shape of this device's shipped table at ``--m``, in PARTS jobs of about
equal weight bytes (:func:`shipped_part`: part PART of them), a fresh run of every shipped shape.
``--worst COUNT`` times the COUNT points of the shipped table's shapes where this code's plan scores worst
on the kept runs of this machine's chain (``benchmarks/results``, scored as ``benchmarks.summarize_regret
--replan`` scores them): the points that decide the shipped shapes' worst figure, timed again to fold in.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fp8select
from benchmarks._cuda import require_cuda
from benchmarks.distill_limits import json_lines, portable
from fp8select.measure import bench

SKIP = ("auto", "bf16-matmul", "reference")
RESULTS = Path(__file__).parent / "results"


def distill(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    points: dict[tuple[int, int, int], dict[str, Any]] = {}
    for r in rows:
        if r.get("m", 0) == 0:
            continue
        p = points.setdefault((r["n"], r["k"], r["m"]), {"n": r["n"], "k": r["k"], "m": r["m"], "us": {}})
        if "whole" in r:
            p["us"][r["backend"]] = r["whole"]["median_us"]
            if "config" in r and r["backend"] not in SKIP:  # what --replan compares today's plan with
                p.setdefault("configs", {})[r["backend"]] = r["config"]
            if r["backend"] == "auto":
                p["auto_ran"] = r.get("ran")
        elif r.get("correct") is False or "error" in r:
            p.setdefault("failed", {})[r["backend"]] = r.get("error") or f"rel_err {r.get('rel_err')}"
    out = []
    for p in points.values():
        pinned = {b: t for b, t in p["us"].items() if b not in SKIP}
        if pinned:
            best = min(pinned, key=lambda b: pinned[b])
            p["best"] = best
            if "auto" in p["us"]:
                p["regret"] = round(p["us"]["auto"] / pinned[best], 4)
        out.append(p)
    return out


def _geomean(values: Sequence[float]) -> float | None:
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 4) if values else None


def summarize(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    regrets = [p["regret"] for p in points if "regret" in p]
    worst = max((p for p in points if "regret" in p), key=lambda p: p["regret"], default=None)
    backends = sorted({b for p in points for b in p["us"] if b not in SKIP})
    always = {}
    for b in backends:  # the ideal per-point choice against always running b (where b ran everywhere)
        ratios = [p["us"][b] / p["us"][p["best"]] for p in points if b in p["us"] and "best" in p]
        if len(ratios) == len([p for p in points if "best" in p]):
            always[b] = _geomean(ratios)
    decode = [p["regret"] for p in points if "regret" in p and p["m"] <= 16]
    return {"points": len(points), "auto_regret_geomean": _geomean(regrets), "auto_regret_worst": max(regrets, default=None),
            "worst_point": None if worst is None else {k: worst[k] for k in ("n", "k", "m", "auto_ran", "best", "regret")},
            "points_over_8pct": sum(r > 1.08 for r in regrets), "decode_regret_worst": max(decode, default=None),
            "ideal_vs_always": always}


def near_ties(table: dict[str, Any], backends: Sequence[str], margin: float) -> dict[tuple[int, int], list[int]]:
    """Per shape of ``table``'s dense rows, its M buckets where the two fastest rows of ``backends`` lie within
    ``margin`` of each other (buckets with one such row or none left out); the shape holding the closest
    contest first, so that a budget that ends early has timed the closest."""
    from benchmarks.model_check import table_truth

    out: dict[tuple[int, int], list[int]] = {}
    closest: dict[tuple[int, int], float] = {}
    for (n, k, m), times in sorted(table_truth(table).items()):
        found = sorted(us for name, us in times.items() if name in backends)
        if len(found) > 1 and found[1] <= found[0] * (1 + margin):
            out.setdefault((n, k), []).append(m)
            closest[(n, k)] = min(closest.get((n, k), math.inf), found[1] / found[0])
    return {shape: out[shape] for shape in sorted(out, key=lambda shape: (closest[shape], shape))}


def worst_points(found: dict[str, dict[str, Any]], chain: Sequence[str], shapes: set[tuple[int, int]],
                 count: int) -> dict[tuple[int, int], list[int]]:
    """The ``count`` points of ``shapes`` in the runs of ``found`` (:func:`benchmarks.summarize_regret.replan`'s)
    whose chain is ``chain`` where the plan's pick is slowest against the fastest backend (the most over the
    runs), per shape; the shape holding the worst point first."""
    worst: dict[tuple[int, int, int], float] = {}
    for run in found.values():
        if list(run["chain"]) == list(chain):
            for point, ratio in run["ratios"].items():
                if point[:2] in shapes:
                    worst[point] = max(ratio, worst.get(point, 0.0))
    out: dict[tuple[int, int], list[int]] = {}
    for n, k, m in sorted(worst, key=lambda point: (-worst[point], point))[:count]:
        out.setdefault((n, k), []).append(m)
    return {shape: sorted(ms) for shape, ms in out.items()}


def shipped_part(shapes: Sequence[tuple[int, int]], part: int, parts: int) -> list[tuple[int, int]]:
    """Part ``part`` (1-based) of ``parts`` of ``shapes``: largest weight first, each shape to the part holding
    the fewest weight bytes so far (ties: the lower part), so that the parts take about equal time."""
    loads = [0] * parts
    chosen: list[list[tuple[int, int]]] = [[] for _ in range(parts)]
    for n, k in sorted(shapes, key=lambda s: (-s[0] * s[1], s)):
        least = loads.index(min(loads))
        loads[least] += n * k
        chosen[least].append((n, k))
    return chosen[part - 1]


def _part(text: str) -> tuple[int, int]:
    """``PART/PARTS`` (``1/2``), checked."""
    try:
        part, parts = (int(v) for v in text.split("/"))
    except ValueError:
        part = parts = 0
    if not 1 <= part <= parts:
        raise argparse.ArgumentTypeError(f"expected PART/PARTS with 1 <= PART <= PARTS, found {text!r}")
    return part, parts


def _shipped(selection: Any) -> tuple[str, dict[str, Any], set[tuple[int, int]]]:
    """This device's name, its shipped table (no groups where none ships) and the dense shapes the table holds."""
    from benchmarks.model_check import table_truth
    from fp8select.measured.table import SHIPPED_DIR, load_table, table_path

    device = selection.capabilities.device_name or ""
    shipped = load_table(table_path(SHIPPED_DIR, device)) or {"groups": []}
    return device, shipped, {(n, k) for n, k, _ in table_truth(shipped)}


def _measure_at_load(selection: Any, shapes: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """Where the selection measures at load time (by default where the cache directory can be written;
    ``FP8SELECT_TUNE=off`` plans from the tables alone): each shape's first ``prepare()`` (which measures it
    where its plan is open) timed; the auto layers measured afterwards reuse what it found."""
    import torch

    if not selection.tune_at_load:
        return []
    out = []
    for n, k in shapes:
        w, s = bench.random_weight(n, k, "cuda")
        t0 = time.perf_counter()
        layer = selection.prepare(w, s)
        torch.cuda.synchronize()
        out.append({"n": n, "k": k, "seconds": round(time.perf_counter() - t0, 3), "plan": layer.main_plan.summary(),
                    "measured": sum(len(b) for g in selection._memo.measured.get((n, k), {}).get("groups", [])
                                    for b in g["shapes"].values())})
        print(f"load-time tuning {n}x{k}: {out[-1]}", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="deepseek-v3")
    parser.add_argument("--m", default=",".join(str(m) for m in bench.DEFAULT_M))
    parser.add_argument("--label", default="")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--budget-s", type=float, default=math.inf)
    instead = parser.add_mutually_exclusive_group()
    instead.add_argument("--ties", type=float, help="time the shipped table's near ties within this fraction instead")
    instead.add_argument("--worst", type=int, help="time the points the plan scores worst on the kept runs instead")
    instead.add_argument("--shipped", type=_part, metavar="PART/PARTS",
                         help="time part PART of PARTS of every shape of the shipped table instead of --shapes")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    require_cuda("regret")
    start = time.monotonic()
    selection = fp8select.resolve()
    print(selection.explain(), flush=True)
    chosen_points = args.ties is not None or args.worst is not None
    if chosen_points:  # each shape at its own Ms
        from benchmarks.summarize_regret import replan

        device, shipped, held = _shipped(selection)
        chain = [b.name for b in selection.chain]
        chosen = (near_ties(shipped, chain, args.ties) if args.ties is not None else
                  worst_points(replan(RESULTS), chain, held, args.worst))
        batches = [([shape], ms) for shape, ms in chosen.items()]
        if not batches:
            raise SystemExit(f"regret: no shipped table of {device or 'this device'} holds a point within {args.ties}"
                             if args.ties is not None else
                             f"regret: no kept run of the chain {' -> '.join(chain)} times a shape of the shipped table")
    elif args.shipped:
        device, _, held = _shipped(selection)
        shapes = shipped_part(sorted(held), *args.shipped)
        if not shapes:
            raise SystemExit(f"regret: no shipped table of {device or 'this device'} holds a dense shape for part "
                             f"{args.shipped[0]} of {args.shipped[1]}")
        batches = [(shapes, bench.parse_ms(args.m))]
    else:
        batches = [(bench.parse_shapes(args.shapes), bench.parse_ms(args.m))]
    load_time = _measure_at_load(selection, [shape for shapes, _ in batches for shape in shapes])
    rows: list[dict[str, Any]] = []
    measuring = time.monotonic()
    for shapes, ms in batches:
        rows += bench.measure(selection, shapes, ms, replays=args.replays,
                              budget_s=args.budget_s - (time.monotonic() - measuring), gemm_alone=False, bf16=False,
                              progress=lambda line: print(line, flush=True))
    points = distill(rows)
    summary = summarize(points)
    print(json.dumps(summary, indent=1), flush=True)
    head = {"label": args.label, "environment": bench.environment(), "capabilities": selection.capabilities.to_dict(),
            "chain": [b.name for b in selection.chain],
            "tuning_sources": [portable(source) for source in selection.tuning_sources],
            "seconds": round(time.monotonic() - start, 1), "load_time_tuning": load_time, "summary": summary}
    per_line = 4 if chosen_points else len(bench.parse_ms(args.m))
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(json_lines(head, {"points": points}, per_line=per_line))


if __name__ == "__main__":
    main()
