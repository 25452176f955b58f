"""Is the Triton layer as fast as its kernel with the same configuration? Timed together, interleaved.

    source .vendors/setup.sh && python benchmarks/layer_probe.py --out layer_probe.json

At a few prefill points: the pinned Triton layer (its plan's configuration from the shipped table), the same
configuration launched directly through ``triton_gemm.linear`` on the same weights, cuBLAS and DeepGEMM pinned,
and, per point, with and without the bf16 yardstick column that ``bench.measure`` times next to them.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import fp8select
from fp8select import bench, timing
from fp8select.backends.reference import dequantize_weight
from fp8select.kernels import triton_gemm

POINTS = ((36864, 7168, 1024), (4096, 7168, 4096), (7168, 16384, 4096), (24576, 1536, 4096), (7168, 2048, 2048))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--replays", type=int, default=40)
    args = parser.parse_args()
    selection = fp8select.resolve()
    by_name = {b.name: b for b in selection.chain}
    report: dict[str, Any] = {"source": "benchmarks/layer_probe.py", "environment": bench.environment(), "points": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k, m in POINTS:
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        layers = {name: [bench.single_backend(selection, by_name[name]).prepare(w, scale) for w in weights]
                  for name in ("triton", "cuda-scaled-mm", "deepgemm") if name in by_name}
        route = layers["triton"][0].main_plan.route(m)
        cfg = route.config
        columns: dict[str, list[Any]] = {name: [functools.partial(layer, x) for layer in per] for name, per in layers.items()}
        columns["kernel"] = [functools.partial(triton_gemm.linear, x, w, scale, (128, 128), out_dtype=torch.bfloat16,
                                               config=cfg) for w in weights]
        point: dict[str, Any] = {"n": n, "k": k, "m": m, "config": cfg.to_dict(), "why": route.why,
                                 "wgmma_runs": triton_gemm.wgmma_runs(x.device)}
        point["alone"] = {name: t.median_us for name, t in timing.time_graphs(columns, args.replays).items()}
        w16 = dequantize_weight(base, scale, (128, 128), torch.bfloat16)
        copies = bench.rotated(w16)
        columns["bf16-matmul"] = [functools.partial(torch.matmul, x, w.t()) for w in copies]
        point["with_bf16"] = {name: t.median_us for name, t in timing.time_graphs(columns, args.replays).items()}
        del copies, w16
        report["points"].append(point)
        print(json.dumps(point), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
