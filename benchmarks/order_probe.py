"""Does the order in which columns are timed change their times? One-after-another rounds against interleaving.

    source .vendors/setup.sh && python benchmarks/order_probe.py --out order_probe.json

At each point, the same columns are timed by both methods, twice each, alternating: ``rounds`` (each column
captured and replayed alone, in two rounds of opposite order, keeping each column's faster round: what
``bench.measure`` did up to run 22) and ``interleaved`` (:func:`fp8select.timing.time_graphs`). Columns:
DeepGEMM pinned, a twin of it (a second layer list on the same weights: the same work, so any difference
between the two is the method's), cuBLAS and Triton pinned, the automatic layer, and DeepGEMM's GEMM alone.
In ``rounds`` the twin runs where the automatic layer ran in ``bench.measure``, next to it.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import fp8select
from fp8select import bench, timing

POINTS = ((32768, 512, 4096), (24576, 1536, 2048), (7168, 16384, 1024), (7168, 2048, 4096), (4096, 7168, 4096),
          (7168, 16384, 4096), (7168, 16384, 1))
PINNED = ("deepgemm", "cuda-scaled-mm", "triton")


def rounds(columns: dict[str, list[Any]], replays: int) -> dict[str, float]:
    best: dict[str, float] = {}
    order = list(columns)
    for round_order in (order, order[::-1]):
        for name in round_order:
            us = timing.time_graph(columns[name], replays).median_us
            best[name] = min(us, best.get(name, us))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    selection = fp8select.resolve()
    by_name = {b.name: b for b in selection.chain}
    report: dict[str, Any] = {"environment": bench.environment(), "replays": args.replays, "points": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k, m in POINTS:
        t0 = time.monotonic()
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = bench.reference_for(base, scale, (128, 128))(x)
        layers: dict[str, list[Any]] = {}
        for name in PINNED:
            if name in by_name:
                sel = bench.single_backend(selection, by_name[name])
                layers[name] = [sel.prepare(w, scale) for w in weights]
        layers["auto"] = [selection.prepare(w, scale) for w in weights]
        columns = {name: [functools.partial(layer, x) for layer in per_copy] for name, per_copy in layers.items()}
        if "deepgemm" in by_name:
            sel = bench.single_backend(selection, by_name["deepgemm"])
            columns["deepgemm-twin"] = [functools.partial(sel.prepare(w, scale), x) for w in weights]
            gemm = [sel.prepare(w, scale, out_dtype=torch.bfloat16) for w in weights]
            xq, xs = bench._quantize_for(by_name["deepgemm"], x)
            columns["deepgemm-gemm"] = [functools.partial(layer, xq, input_scale=xs) for layer in gemm]
        errors = {name: bench._rel_err(calls[0](), ref) for name, calls in columns.items() if name != "deepgemm-gemm"}
        bench.synchronize(x.device)
        point: dict[str, Any] = {"n": n, "k": k, "m": m, "ran": layers["auto"][0].plan(m).name,
                                 "rel_err": {k_: round(v, 5) for k_, v in errors.items()}, "samples": []}
        for _ in range(args.repeats):
            point["samples"].append({"method": "rounds", "us": {k_: round(v, 2) for k_, v in rounds(columns, args.replays).items()}})
            inter = timing.time_graphs(columns, args.replays)
            point["samples"].append({"method": "interleaved", "us": {k_: round(v.median_us, 2) for k_, v in inter.items()}})
        point["seconds"] = round(time.monotonic() - t0, 1)
        report["points"].append(point)
        print(json.dumps(point), flush=True)
        del layers, columns, weights
        torch.cuda.empty_cache()
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
