"""Fold a narrower re-tune into a tuning table (schema 2), keeping only improvements.

    python -m benchmarks.merge_tuning BASE.json NEW.json OUT.json [--margin 0.02 | --all]

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
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from fp8select.buckets import m_bucket
from fp8select.measured.table import check_table, group_key, merge_tables, save_table

SECTIONS = ("groups", "moe")  # a table's dense groups and its MoE entries
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("out")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--margin", type=float, default=0.0)
    how.add_argument("--all", action="store_true", help="take every row of NEW (a re-timing of whole points)")
    args = parser.parse_args(argv)
    base = check_table(json.loads(Path(args.base).read_text()), args.base)
    new = json.loads(Path(args.new).read_text())
    if "environment" in new:  # a limits report: compared within its run already
        kept, taken = improvements(base, check_table(from_limits(new, args.margin), args.new), -math.inf)
    else:
        kept, taken = improvements(base, check_table(new, args.new), -math.inf if args.all else args.margin)
    save_table(args.out, merge_tables(base, kept))
    print("\n".join(taken) or "no row improved")


if __name__ == "__main__":
    main()
