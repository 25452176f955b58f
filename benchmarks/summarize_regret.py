"""The selection figures of docs/performance.md, from the distilled regret JSONs of one or more runs.

    python -m benchmarks.summarize_regret benchmarks/results [--plot docs/h200-time-vs-m.png]

Per set of runs (with and without the vendors; the DeepSeek-V3 shapes of the table, and other
models' shapes by the model or measured at load time) it prints the regret of the automatic
choice two ways: **measured** (the ``auto`` column's time over the fastest pinned column's, two
timings that include run-to-run noise even where ``auto`` ran the very same kernel), and
**choice** (the pinned time of the backend ``auto`` ran over the fastest pinned time: the cost
of the decision alone). ``--plot`` draws time against M per backend for two shapes.

``--replan`` scores, per file and pooled per set, the plan this code makes today for each point from the
shipped table (no GPU): the pinned time of the backend it picks over the fastest pinned time, next to the
same for the backend ``auto`` ran then. It re-scores kept timings, measures nothing: what a decision rule
changes on points measured once. The plan is made for the snapshot the run recorded
(``capabilities``); runs before it did are given an H200 snapshot made from their environment and
the table's versions, with every vendor entry point fp8select looks for (:func:`_h200_snapshot`).
A point where today's plan picks a backend with another configuration than the run's (``configs``, recorded by
runs since they were kept; before, the table's own row at that point) is **stale**: its pinned time is not
what the pick takes now, so it is listed apart and left out of ``now``. A run whose timings were folded into
the shipped table's rows (``benchmarks/merge_tuning.py --fold``) is planned from the table with them taken back
out: every figure stays out of sample.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks._stats import geomean

SETS = {
    "vendors, DeepSeek-V3 (table)": ("regret_vendors_deepseek", "regret_vendors_deepseek_rest"),
    "vendors, served shapes (table)": ("regret_vendors_served",),
    "no vendors, served shapes (table)": ("regret_novendors_served",),
    "vendors, 75 more shipped shapes (table)": ("regret_vendors_shipped", "regret_vendors_shipped_rest",
                                                "regret_vendors_shipped_last"),
    "vendors, every shipped shape (table)": ("regret_vendors_deepseek", "regret_vendors_served", "regret_vendors_shipped",
                                             "regret_vendors_shipped_rest", "regret_vendors_shipped_last"),
    "no vendors, 92 shipped shapes (table)": ("regret_novendors_shipped", "regret_novendors_shipped_rest"),
    "no vendors, every shipped shape (table)": ("regret_novendors_deepseek", "regret_novendors_served",
                                                "regret_novendors_shipped", "regret_novendors_shipped_rest"),
    "vendors, five shapes of the re-timed points (table)": ("regret_vendors_retimed",),
    "no vendors, the same five (table)": ("regret_novendors_retimed",),
    "vendors, decode check of the near-tie rules (table)": ("regret_vendors_decode_check",),
    "vendors, the table's near ties within 3% (table)": ("regret_vendors_ties",),
    "no vendors, the table's near ties within 3% (table)": ("regret_novendors_ties",),
    "vendors, the plan's 24 worst points, timed again (table)": ("regret_vendors_worst",),
    "vendors, the plan's 64 worst points, a second run (table)": ("regret_vendors_worst64",),
    "no vendors, the plan's 24 worst points, timed again (table)": ("regret_novendors_worst",),
    "vendors, the plan's 24 worst points after their fold, timed again (table)": ("regret_vendors_worst_refold",),
    "no vendors, the plan's 24 worst points after their fold, timed again (table)": ("regret_novendors_worst_refold",),
    "vendors, other models (model)": ("regret_vendors_other_model",),
    "vendors, models not listed (model)": ("regret_vendors_unseen_model",),
    "vendors, GLM-4.5's dense layers (model)": ("regret_vendors_glm_model",),
    "vendors, models not listed (measured at load, the default)": ("regret_vendors_unseen_default",),
    "vendors, models not listed (the default, second start)": ("regret_vendors_unseen_second",),
    "no vendors, DeepSeek-V3 (table)": ("regret_novendors_deepseek",),
    "no vendors, other models (model)": ("regret_novendors_other_model",),
    "no vendors, models not listed (model)": ("regret_novendors_unseen_model",),
    "no vendors, GLM-4.5's dense layers (model)": ("regret_novendors_glm_model",),
    "no vendors, models not listed (measured at load, the default)": ("regret_novendors_unseen_default",),
    "no vendors, models not listed (the default, second start)": ("regret_novendors_unseen_second",),
    "H100 SXM (no dense table), vendors, models not listed (the default)": ("regret_h100_vendors_first",),
    "H100 SXM, the same, second start": ("regret_h100_vendors_second",),
}
PLOT_SHAPES = ((2112, 7168), (7168, 2048))
COLORS = {"deepgemm": "tab:orange", "flashinfer": "tab:green", "cutlass": "tab:purple", "cuda-scaled-mm": "tab:blue",
          "triton": "tab:red", "auto": "black"}


def points(directory: Path, names: tuple[str, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in names:
        path = directory / f"{name}.json"
        if path.exists():
            out.extend(p for p in json.loads(path.read_text())["points"] if "regret" in p)
    return out


def figures(pts: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [p["regret"] for p in pts]
    choice = [p["us"][p["auto_ran"]] / p["us"][p["best"]] for p in pts if p.get("auto_ran") in p["us"]]
    worst = max(pts, key=lambda p: p["us"].get(p.get("auto_ran"), 0) / p["us"][p["best"]])
    return {"shapes": len({(p["n"], p["k"]) for p in pts}), "points": len(pts),
            "measured_geomean": geomean(measured), "measured_worst": round(max(measured), 3),
            "measured_over_8pct": sum(r > 1.08 for r in measured),
            "choice_geomean": geomean(choice), "choice_worst": round(max(choice), 3),
            "choice_over_8pct": sum(c > 1.08 for c in choice),
            "choice_worst_point": {k: worst.get(k) for k in ("n", "k", "m", "auto_ran", "best")}}


def plot(pts: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOT_SHAPES), figsize=(6 * len(PLOT_SHAPES), 4.2))
    for ax, (n, k) in zip(axes, PLOT_SHAPES, strict=True):
        mine = sorted((p for p in pts if (p["n"], p["k"]) == (n, k)), key=lambda p: p["m"])
        for backend in sorted({b for p in mine for b in p["us"]}):
            xy = [(p["m"], p["us"][backend]) for p in mine if backend in p["us"]]
            style = {"linewidth": 2.2, "linestyle": "--"} if backend == "auto" else {}
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", ms=3, label=backend,
                    color=COLORS.get(backend), **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"N={n} K={k} (H200, whole op, CUDA graphs)")
        ax.set_xlabel("M")
        ax.set_ylabel("median us")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _h200_snapshot(run: dict[str, Any], table: dict[str, Any]) -> Any:
    """The snapshot of an H200 run that recorded none: its torch, CUDA and Triton, the table's version of
    each vendor its chain names, and every entry point fp8select looks for in those vendors."""
    from fp8select import Capabilities
    from fp8select.detect import PACKAGE_SYMBOLS

    env = run["environment"]
    packages = {"triton": env["triton"]}
    for group in table["groups"]:
        if group["backend"] in run["chain"]:
            packages |= {name: v for name, v in group["versions"].items() if name not in ("torch", "cuda", "triton")}
    return Capabilities(device_kind="cuda", device_name=env["device"], compute_capability=(9, 0),
                        torch_version=env["torch"], cuda_version=env["cuda"], has_scaled_mm=True,
                        scaling_types=("BlockWise1x128", "BlockWise128x128"), float8_dtypes=("float8_e4m3fn",),
                        triton_backends=("nvidia",), packages=packages,
                        package_symbols={m: names for m, (_, names) in PACKAGE_SYMBOLS.items() if m in packages})


def replan(directory: Path, table: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Per regret file of ``directory``: the decisions of ``auto`` then and of this code's plan now, each as
    the pinned time of the backend picked over the fastest pinned time (geomean, worst), and the points
    whose pick changed; ``ratios``: now's per point ``(N, K, M)``, and ``chain``: the run's. ``table``: the
    tuning table planned from (default: the shipped H200 table)."""
    from benchmarks.merge_tuning import unfold
    from fp8select import Capabilities, resolve
    from fp8select.measured.table import SHIPPED_DIR

    if table is None:
        table = json.loads((SHIPPED_DIR / "tuning-nvidia-h200.json").read_text())
    out = {}
    for path in sorted(directory.glob("regret_*.json")):
        run = json.loads(path.read_text())
        if "NVIDIA H200" not in run["environment"].get("device", "") or any(
                shape.get("measured") for shape in run.get("load_time_tuning") or ()):
            continue  # (a run that measured rows at load time planned from them, not from the table alone)
        caps = Capabilities.from_dict(run["capabilities"]) if "capabilities" in run else _h200_snapshot(run, table)
        selection = resolve(caps, plugins=False, order=run["chain"], tuning=unfold(table, run))
        plans: dict[tuple[int, int], Any] = {}
        then, now, changed, stale = [], {}, [], []
        for p in run["points"]:
            times = {b: t for b, t in p["us"].items() if b in run["chain"] and b != "reference"}
            shape = (p["n"], p["k"])
            plan = plans[shape] = plans.get(shape) or selection.plan_for(*shape)
            route = plan.route(p["m"]).to_dict()
            pick = route["backend"]
            if pick not in times or p.get("auto_ran") not in times:
                continue
            ran = p["configs"].get(pick) if "configs" in p else _own_config(table, pick, p["n"], p["k"], p["m"])
            if ran is not None and ran != route["config"]:
                stale.append(f"{p['n']}x{p['k']} M {p['m']}: {pick}")
                continue
            fastest = min(times.values())
            then.append(times[p["auto_ran"]] / fastest)
            point = now[(p["n"], p["k"], p["m"])] = times[pick] / fastest
            if pick != p["auto_ran"]:
                changed.append(f"{p['n']}x{p['k']} M {p['m']}: {p['auto_ran']} {then[-1]:.3f} -> {pick} {point:.3f}")
        if now:
            ratios = list(now.values())
            out[path.stem] = {"points": len(now), "then": [geomean(then), round(max(then), 3)],
                              "now": [geomean(ratios), round(max(ratios), 3)], "changed": changed,
                              **({"stale": stale} if stale else {}), "ratios": now, "chain": run["chain"]}
    return out


def _own_config(table: dict[str, Any], backend: str, n: int, k: int, m: int) -> Any:
    """The launch configuration of ``table``'s own row of ``backend`` at (N, K, M): what a run that recorded none
    ran there (a plan may now run another, a larger bucket's: ``fp8select.measured.model``)."""
    for group in table["groups"]:
        if group["backend"] == backend and (row := group["shapes"].get(f"{n},{k}", {}).get(str(m))) is not None:
            return row.get("config")
    return None


def replan_sets(found: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`replan`'s picks pooled per set of runs (:data:`SETS`): points, geomean and worst of today's picks'
    pinned time over the fastest, and how many points lie more than 3% and 5% from it."""
    out = {}
    for label, names in SETS.items():
        ratios = [r for name in names if name in found for r in found[name]["ratios"].values()]
        if ratios:
            out[label] = {"points": len(ratios), "now": [geomean(ratios), round(max(ratios), 3)],
                          "over_3pct": sum(r > 1.03 for r in ratios), "over_5pct": sum(r > 1.05 for r in ratios)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--plot")
    parser.add_argument("--replan", action="store_true", help="score today's plan on the kept timings")
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    if args.replan:
        found = replan(directory)
        for name, figures_now in found.items():
            print(f"{name}: {json.dumps({k: v for k, v in figures_now.items() if k not in ('ratios', 'chain')})}")
        for label, pooled in replan_sets(found).items():
            print(f"{label}: {json.dumps(pooled)}")
        return
    for label, names in SETS.items():
        pts = points(directory, names)
        if pts:
            print(f"{label}: {json.dumps(figures(pts))}")
    if args.plot:
        plot(points(directory, SETS["vendors, DeepSeek-V3 (table)"]), args.plot)


if __name__ == "__main__":
    main()
