"""The selection figures of docs/performance.md, from the distilled regret JSONs of one or more runs.

    python -m benchmarks.summarize_regret benchmarks/results [--plot docs/h200-time-vs-m.png]

Per set of runs (with and without the vendors; the DeepSeek-V3 shapes of the table, and other
models' shapes by the model or measured at load time) it prints the regret of the automatic
choice two ways: **measured** (the ``auto`` column's time over the fastest pinned column's, two
timings that include run-to-run noise even where ``auto`` ran the very same kernel), and
**choice** (the pinned time of the backend ``auto`` ran over the fastest pinned time: the cost
of the decision alone). ``--plot`` draws time against M per backend for two shapes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

SETS = {
    "vendors, DeepSeek-V3 (table)": ("regret_vendors_deepseek", "regret_vendors_deepseek_rest"),
    "vendors, other models (model)": ("regret_vendors_other_model",),
    "vendors, other models (measured at load)": ("regret_vendors_other_load",),
    "no vendors, DeepSeek-V3 (table)": ("regret_novendors_deepseek",),
    "no vendors, other models (model)": ("regret_novendors_other_model",),
    "no vendors, other models (measured at load)": ("regret_novendors_other_load",),
}
PLOT_SHAPES = ((2112, 7168), (7168, 2048))
COLORS = {"deepgemm": "tab:orange", "flashinfer": "tab:green", "cutlass": "tab:purple", "cuda-scaled-mm": "tab:blue",
          "triton": "tab:red", "auto": "black"}


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


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
            "measured_geomean": round(_geomean(measured), 4), "measured_worst": round(max(measured), 3),
            "measured_over_8pct": sum(r > 1.08 for r in measured),
            "choice_geomean": round(_geomean(choice), 4), "choice_worst": round(max(choice), 3),
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    for label, names in SETS.items():
        pts = points(directory, names)
        if pts:
            print(f"{label}: {json.dumps(figures(pts))}")
    if args.plot:
        plot(points(directory, SETS["vendors, DeepSeek-V3 (table)"]), args.plot)


if __name__ == "__main__":
    main()
