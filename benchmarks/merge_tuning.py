"""Fold a narrower re-tune into a tuning table (schema 2), keeping only improvements; or another run's timings.

    python -m benchmarks.merge_tuning BASE.json NEW.json OUT.json [--margin 0.02 | --all | --fold]

A row of NEW replaces BASE's row for the same backend, versions, shape and M bucket (and, for the
MoE rows of a table's ``moe`` list, the same layout; ``fp8select tune --moe`` writes them) only where
NEW's measured whole-op time is lower by more than ``--margin`` (a fraction; default 0) (both measure the whole op the same way: CUDA graph,
median, weights rotated past the L2), so a narrower re-tune never makes a shipped row worse;
rows BASE lacks are added. NEW is a tuning table, or a distilled ``benchmarks.limits``
report (``benchmarks/results/limits_*.json``, or ``benchmarks.decode_ab --distill``'s): then its sweep-best Triton configurations
replace BASE's rows where they beat the table's configuration timed in the same report by
more than the margin (times of two runs differ by a few percent: the comparison stays within
one run), at the versions of its ``environment``.

``--all`` takes every row of NEW: for a re-timing of whole points (``tune --force``, every backend of a point
timed together, interleaved), which replaces rows that other runs timed and kept only where faster (a
faster-only merge keeps each row's luckiest timing, and a plan then compares rows of different runs).

``--fold``: NEW is a ``benchmarks.regret`` result of this device, whose pinned backends timed points the table
holds again; each such time joins its row, whose ``us`` becomes the geometric mean of the row's timings
(``runs`` of them, 1 where the row does not say) and this one. Two timings of one point in two runs differ by
2-4% (cuBLAS's by 6-8%), about what separates the backends at a near tie, so a row timed once orders a near
tie by chance; the mean of several orders it as a later run most likely will. A time joins the row of its
backend at the versions the run recorded (torch, CUDA and Triton always; a vendor package where the run's
snapshot names it), and Triton's only where the run recorded the configuration it ran and it is the row's
(runs before they recorded it may have run another); a point at an M other than its bucket's largest (which
``tune`` times) is left out. The table's ``folded`` list names each run folded
(its ``environment`` time, then the file's name); a run already named is refused. ``unfold`` takes a run's
timings back out: ``benchmarks.summarize_regret --replan`` scores a folded run against the table without it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from fp8select.buckets import m_bucket
from fp8select.measured.table import check_table, group_key, merge_tables, release, save_table

SECTIONS = ("groups", "moe")  # a table's dense groups and its MoE entries
NOT_PINNED = ("auto", "reference", "bf16-matmul")  # a regret run's columns that are not a backend's row
VERSION_KEYS = ("torch", "cuda", "triton")  # what the Triton rows' speed depends on (tuning.table.backend_versions)


def from_limits(report: dict[str, Any], margin: float) -> dict[str, Any]:
    """A distilled limits report as a table: a Triton row per point whose sweep's best beat the
    table's configuration (timed in the same run) by more than ``margin``."""
    env = report["environment"]
    shapes: dict[str, dict[str, Any]] = {}
    for phase in ("decode", "prefill"):
        for row in report.get(phase, []):
            if row["sweep_us"] >= row["table_us"] * (1 - margin):
                continue
            shapes.setdefault(f"{row['n']},{row['k']}", {})[str(m_bucket(row["m"]))] = {
                "us": row["sweep_us"], "config": row["sweep_config"]}
    versions = {key: env[key] for key in VERSION_KEYS}
    return {"schema": 2, "device_name": env["device"], "groups": [{"backend": "triton", "versions": versions,
                                                                  "shapes": shapes}]}


def improvements(base: dict[str, Any], new: dict[str, Any], margin: float = 0.0) -> tuple[dict[str, Any], list[str]]:
    """NEW's rows that beat BASE's by more than ``margin`` (as a table), and a line per row taken."""
    if base["device_name"] != new["device_name"]:
        raise SystemExit(f"devices differ: {base['device_name']} != {new['device_name']}")
    rows = {(group_key(g), shape, bucket): row["us"] for section in SECTIONS for g in base.get(section, ())
            for shape, buckets in g["shapes"].items() for bucket, row in buckets.items()}
    kept = {**{k: v for k, v in new.items() if k != "moe"}, "groups": []}
    taken = []
    for section in SECTIONS:
        for group in new.get(section, ()):
            name = group["backend"] + (f"/{group['layout']}" if "layout" in group else "")
            shapes: dict[str, dict[str, Any]] = {}
            for shape, buckets in group["shapes"].items():
                for bucket, row in buckets.items():
                    old = rows.get((group_key(group), shape, bucket))
                    if old is None or row["us"] < old * (1 - margin):
                        shapes.setdefault(shape, {})[bucket] = row
                        taken.append(f"{name} {shape} M<={bucket}: {old} -> {row['us']} us")
            if shapes:
                kept.setdefault(section, []).append({**group, "shapes": shapes})
    return kept, taken


def _timings(table: dict[str, Any], run: dict[str, Any]) -> list[tuple[dict[str, Any], float]]:
    """The rows of ``table`` that ``run`` timed again, each with its time there (see the module docstring)."""
    env = run["environment"]
    if env.get("device") != table["device_name"]:
        raise SystemExit(f"devices differ: {env.get('device')} != {table['device_name']}")
    packages = run.get("capabilities", {}).get("packages", {})
    groups: dict[str, list[dict[str, Any]]] = {}
    for group in table["groups"]:
        versions = group["versions"]
        if all(versions.get(key) == env.get(key) for key in VERSION_KEYS) and all(
                name not in packages or release(packages[name]) == version
                for name, version in versions.items() if name not in VERSION_KEYS):
            groups.setdefault(group["backend"], []).append(group)
    ambiguous = sorted(name for name, found in groups.items() if len(found) > 1)
    if ambiguous:
        raise SystemExit(f"the run's versions match several groups of {', '.join(ambiguous)}")
    out = []
    for point in run["points"]:
        if m_bucket(point["m"]) != point["m"]:
            continue  # a row is timed at its bucket's largest M, as tune times it
        shape, bucket = f"{point['n']},{point['k']}", str(point["m"])
        for name, us in point["us"].items():
            row = groups[name][0]["shapes"].get(shape, {}).get(bucket) if name in groups and name not in NOT_PINNED else None
            if row is not None and point.get("configs", {}).get(name) == row.get("config"):
                out.append((row, us))
    return out


def _run_id(run: dict[str, Any], name: str) -> str:
    return f"{run['environment']['time']} {name}"


def _names(entry: str, run: dict[str, Any]) -> bool:
    """Whether ``entry`` of a table's ``folded`` list (:func:`_run_id`) names ``run``: by its time."""
    return entry.split(" ", 1)[0] == run["environment"]["time"]


def _is_folded(table: dict[str, Any], run: dict[str, Any]) -> bool:
    return any(_names(entry, run) for entry in table.get("folded", ()))


def fold(table: dict[str, Any], run: dict[str, Any], name: str) -> tuple[dict[str, Any], int]:
    """``table`` with the timings of ``run`` (a regret result called ``name``) folded into its rows, and how many."""
    if _is_folded(table, run):
        raise SystemExit(f"{name}: already folded into the table ({run['environment']['time']})")
    out = json.loads(json.dumps(table))
    found = _timings(out, run)
    for row, us in found:
        runs = row.get("runs", 1)
        row["us"] = round(math.exp((runs * math.log(row["us"]) + math.log(us)) / (runs + 1)), 3)
        row["runs"] = runs + 1
    out["folded"] = [*out.get("folded", ()), _run_id(run, name)]
    return out, len(found)


def unfold(table: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """``table`` with the timings of ``run`` taken back out of its rows: as if it had not been folded in (to the
    rounding of a row's microseconds); ``table`` itself where it was not. A row timed once (re-timed whole
    since, by ``--all`` or ``--margin``) holds no run's timing and is left as it is."""
    if not _is_folded(table, run):
        return table
    out = json.loads(json.dumps(table))
    for row, us in _timings(out, run):
        if "runs" not in row:
            continue
        runs = row.pop("runs")
        row["us"] = round(math.exp((runs * math.log(row["us"]) - math.log(us)) / (runs - 1)), 3)
        if runs > 2:
            row["runs"] = runs - 1
    out["folded"] = [entry for entry in out["folded"] if not _names(entry, run)]
    if not out["folded"]:
        del out["folded"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("out")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--margin", type=float, default=0.0)
    how.add_argument("--all", action="store_true", help="take every row of NEW (a re-timing of whole points)")
    how.add_argument("--fold", action="store_true", help="NEW is a regret run: fold its timings into the rows")
    args = parser.parse_args(argv)
    base = check_table(json.loads(Path(args.base).read_text()), args.base)
    new = json.loads(Path(args.new).read_text())
    if args.fold != ("points" in new):
        raise SystemExit(f"{args.new}: --fold takes a regret run (benchmarks.regret), and a regret run needs --fold")
    if args.fold:
        folded, count = fold(base, new, Path(args.new).stem)
        save_table(args.out, folded)
        print(f"{count} timings folded into their rows")
        return
    if "environment" in new:  # a limits report: compared within its run already
        kept, taken = improvements(base, check_table(from_limits(new, args.margin), args.new), -math.inf)
    else:
        kept, taken = improvements(base, check_table(new, args.new), -math.inf if args.all else args.margin)
    save_table(args.out, merge_tables(base, kept))
    print("\n".join(taken) or "no row improved")


if __name__ == "__main__":
    main()
