"""The Triton rows a larger bucket's launch configuration stands in for, timed with both configurations.

    python -m benchmarks.fewer_rows --out benchmarks/results/fewer_rows.json

``fp8select.measured.model.fewer_rows`` lets a Triton row of the shipped table give way to a larger bucket's
of the same shape that ran more rows in less time (a configuration takes no longer on fewer rows). This
times that claim at every such point of this device's shipped table (``--limit``: the first that many,
largest stand-in gain first): the whole op (quantization included) at the bucket's M with the row's own
configuration (``own``) and with the one that stands in (``taken``), weights rotated past the L2, both
columns' CUDA graphs replayed interleaved (``timing.time_graphs``), each checked against the fp64 reference
first. Writes per point both medians next to the table's times, and the summary: at how many points the
configuration taken is faster, and the geomean and worst of its time over the own one's.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda
from benchmarks._stats import geomean
from benchmarks.distill_limits import json_lines

ROOT = Path(__file__).resolve().parent.parent


def stand_ins(table: dict[str, Any], backend: str = "triton") -> list[dict[str, Any]]:
    """The points of ``table`` where ``backend``'s row gives way to a larger bucket's (:func:`fewer_rows`):
    shape, bucket, both configurations and their table times, the largest gain (own over taken) first."""
    from fp8select.measured.model import fewer_rows

    points = []
    for group in table["groups"]:
        if group["backend"] != backend:
            continue
        for shape, buckets in group["shapes"].items():
            n, k = (int(v) for v in shape.split(","))
            for bucket, row in fewer_rows(buckets).items():
                if "taken_m" in row:
                    own = buckets[bucket]
                    points.append({"n": n, "k": k, "m": int(bucket), "taken_m": row["taken_m"],
                                   "table_us": {"own": own["us"], "taken": row["us"]},
                                   "configs": {"own": own["config"], "taken": row["config"]}})
    return sorted(points, key=lambda p: (-p["table_us"]["own"] / p["table_us"]["taken"], p["n"], p["k"], p["m"]))


def summarize(points: list[dict[str, Any]]) -> dict[str, Any]:
    """How the configuration taken did against the own one where both were timed."""
    ratios = [p["us"]["taken"] / p["us"]["own"] for p in points if {"own", "taken"} <= set(p.get("us", {}))]
    if not ratios:
        return {"points": 0}
    return {"points": len(ratios), "taken_faster": sum(r < 1 for r in ratios),
            "taken_over_own_geomean": geomean(ratios), "taken_over_own_worst": round(max(ratios), 3),
            "taken_over_own_best": round(min(ratios), 3)}


def _call(linear: Any, x: Any, scale: Any, weight: Any, config: Any) -> Any:
    """One column's call: the whole Triton op with ``config`` on ``weight``."""
    import torch

    return functools.partial(linear, x, weight, scale, (128, 128), out_dtype=torch.bfloat16, config=config)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default=str(ROOT / "fp8select" / "data" / "tuning-nvidia-h200.json"))
    parser.add_argument("--limit", type=int, default=0, help="time the first LIMIT points only (0: all)")
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    require_cuda("fewer_rows")
    import torch

    import fp8select
    from benchmarks._cuda import run_head
    from fp8select.kernels import triton_gemm
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.measure import bench, timing

    points = stand_ins(json.loads(Path(args.table).read_text()))
    points = points[:args.limit] if args.limit else points
    head = run_head(fp8select.resolve(), f"python -m benchmarks.fewer_rows --out {Path(args.out).name}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for point in points:
        n, k, m = point["n"], point["k"], point["m"]
        base, scale = bench.random_weight(n, k, "cuda", gen)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = bench.reference_for(base, scale, (128, 128))(x)
        configs = {name: TritonConfig.from_dict(c) for name, c in point["configs"].items()}
        call = functools.partial(_call, triton_gemm.linear, x, scale)
        point["rel_err"] = {name: round(bench._rel_err(call(base, c)(), ref), 6) for name, c in configs.items()}
        if any(not math.isfinite(e) or e > 1e-2 for e in point["rel_err"].values()):
            continue
        weights = bench.rotated(base)
        errors: dict[str, str] = {}
        times = timing.time_graphs({name: [call(w, c) for w in weights] for name, c in configs.items()},
                                   args.replays, errors=errors)
        point["us"] = {name: round(t.median_us, 3) for name, t in times.items()}
        if errors:
            point["errors"] = errors
        print(f"{n}x{k} M {m}: own {point['us'].get('own')} taken (M {point['taken_m']}) {point['us'].get('taken')}",
              flush=True)
        del weights
    Path(args.out).write_text(json_lines({**head, "summary": summarize(points)}, {"points": points}, per_line=4))


if __name__ == "__main__":
    main()
