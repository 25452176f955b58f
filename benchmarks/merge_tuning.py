"""Merge the entries of one tuning table into another (same fingerprint), for re-tuning a few shapes.

    python benchmarks/merge_tuning.py BASE.json NEW.json OUT.json

Entries of NEW replace those of BASE for the same (N,K) and M bucket only where NEW's measured
time is lower (both tables measure the whole op the same way), so a narrower re-tune never
makes a shipped entry worse.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fp8select.tuning_cache import save_table, validate_table


def merge(base: dict, new: dict) -> tuple[dict, list[str]]:
    if base["fingerprint"] != new["fingerprint"]:
        raise SystemExit(f"fingerprints differ: {base['fingerprint']} != {new['fingerprint']}")
    changed = []
    for shape, buckets in new["entries"].items():
        for bucket, entry in buckets.items():
            old = base["entries"].setdefault(shape, {}).get(bucket)
            if old is None or entry["us"] < old["us"]:
                base["entries"][shape][bucket] = entry
                changed.append(f"{shape} M<={bucket}: {old['us'] if old else None} -> {entry['us']} us ({entry['backend']})")
    return base, changed


if __name__ == "__main__":
    base, new = (json.loads(Path(p).read_text()) for p in sys.argv[1:3])
    merged, changed = merge(base, new)
    assert validate_table(merged) is None
    save_table(sys.argv[3], merged)
    print("\n".join(changed) or "no entry improved")
