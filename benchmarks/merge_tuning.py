"""Fold a narrower re-tune into a tuning table (schema 2), keeping only improvements.

    python benchmarks/merge_tuning.py BASE.json NEW.json OUT.json

A row of NEW replaces BASE's row for the same backend, versions, shape and M bucket only where
NEW's measured whole-op time is lower (both tables measure it the same way), so a narrower
re-tune never makes a shipped row worse; rows BASE lacks are added.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fp8select.tuning.table import check_table, merge_tables, save_table


def improvements(base: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """NEW's rows that beat BASE's (as a table), and a line per row taken."""
    if base["device_name"] != new["device_name"]:
        raise SystemExit(f"devices differ: {base['device_name']} != {new['device_name']}")
    rows = {(g["backend"], tuple(sorted(g["versions"].items())), shape, bucket): row["us"]
            for g in base["groups"] for shape, buckets in g["shapes"].items() for bucket, row in buckets.items()}
    kept = {**new, "groups": []}
    taken = []
    for group in new["groups"]:
        versions = tuple(sorted(group["versions"].items()))
        shapes: dict[str, dict[str, Any]] = {}
        for shape, buckets in group["shapes"].items():
            for bucket, row in buckets.items():
                old = rows.get((group["backend"], versions, shape, bucket))
                if old is None or row["us"] < old:
                    shapes.setdefault(shape, {})[bucket] = row
                    taken.append(f"{group['backend']} {shape} M<={bucket}: {old} -> {row['us']} us")
        if shapes:
            kept["groups"].append({**group, "shapes": shapes})
    return kept, taken


if __name__ == "__main__":
    base, new = (check_table(json.loads(Path(p).read_text()), p) for p in sys.argv[1:3])
    kept, taken = improvements(base, new)
    save_table(sys.argv[3], merge_tables(base, kept))
    print("\n".join(taken) or "no row improved")
