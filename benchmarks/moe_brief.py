"""A whole ``benchmarks.moe`` run (every shape, M 1-8192) distilled to a line per shape: the form it is kept in.

    python -m benchmarks.moe --out DIR                     # on the GPU: DIR/moe.json, a timing per line
    python -m benchmarks.moe_brief DIR/moe.json --out benchmarks/results/moe_all.json

A whole run holds several hundred timings; ``benchmarks/results/moe.json`` keeps the quick run's in full.
Per shape this keeps what the targets are judged on (docs/moe.md): auto's time over the fastest pinned
route's (geomean and worst over its M and both routings, and the worst point), which route is fastest how
often, and the fraction of the HBM floor auto and the Triton route reach at decode, ``[uniform, skewed]``
per M. The header is the run's (device, versions, command, each column's worst numerics).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._stats import geomean
from benchmarks.distill_limits import json_lines

HEAD = ("device", "torch", "triton", "packages", "command", "numerics_worst", "m0_ok", "seconds")
FLOOR_COLUMNS = ("auto", "triton/sorted")


def per_shape(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per shape of ``report`` (a ``benchmarks.moe`` moe.json), in the run's order."""
    rows = []
    for shape in dict.fromkeys(p["shape"] for p in report["summary"]["points"]):
        points = [p for p in report["summary"]["points"] if p["shape"] == shape]
        worst = max(points, key=lambda p: p["auto_ratio"])
        floors: dict[str, dict[str, list[float | None]]] = {}
        for t in report["timing"]:
            if t["shape"] == shape and t["column"] in FLOOR_COLUMNS and t.get("hbm_fraction") is not None:
                pair = floors.setdefault(t["column"], {}).setdefault(str(t["m"]), [None, None])
                pair[t["routing"] == "skewed"] = t["hbm_fraction"]
        rows.append({"shape": shape, "points": len(points),
                     "auto_vs_fastest_geomean": geomean([p["auto_ratio"] for p in points]),
                     "auto_vs_fastest_worst": worst["auto_ratio"],
                     "worst_point": f"M {worst['m']} {worst['routing']}, fastest {worst['fastest']}",
                     "fastest": dict(Counter(p["fastest"] for p in points).most_common()),
                     "decode_hbm_fraction": floors})
    return rows


def brief(report: dict[str, Any]) -> str:
    """The kept form: the run's header and overall figures, then a shape per line."""
    head = {k: report[k] for k in HEAD if k in report}
    summary = report["summary"]
    head["summary"] = {"points": len(summary["points"]), "auto_vs_fastest_geomean": summary["auto_vs_fastest_geomean"],
                       "auto_vs_fastest_worst": summary["auto_vs_fastest_worst"]}
    return json_lines(head, {"shapes": per_shape(report)})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_brief", description=__doc__.split("\n")[0])
    parser.add_argument("report", help="a benchmarks.moe moe.json")
    parser.add_argument("--out", required=True, help="the distilled report")
    args = parser.parse_args(argv)
    text = brief(json.loads(Path(args.report).read_text(encoding="utf-8")))
    Path(args.out).write_text(text, encoding="utf-8")
    s = json.loads(text)["summary"]
    print(f"moe_brief: {s['points']} points, auto vs fastest {s['auto_vs_fastest_geomean']} geomean, "
          f"{s['auto_vs_fastest_worst']} worst")


if __name__ == "__main__":
    main()
