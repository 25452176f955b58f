"""Does the Gluon wgmma kernel (per-block scaling under the next block's MMA) reach cuBLAS at prefill?

    source .vendors/setup.sh && python benchmarks/gluon_probe.py --out gluon_probe.json

At each DeepSeek-V3 prefill point (M 1024-4096) the whole ops (activation quantization + GEMM) are
timed together, interleaved (:func:`fp8select.timing.time_graphs`): cuBLAS, Triton and DeepGEMM
pinned (the shipped table's configurations) and the Triton quantizer followed by the Gluon kernel,
one column per launch configuration. Every Gluon configuration is first checked against the fp64
reference at that point (relative error below 1e-2) and at ragged shapes with a NaN row, a bias
and per-row (1x128) weight scales.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import fp8select
from fp8select import bench, timing
from fp8select.kernels import triton_gemm
from fp8select.kernels.triton_config import TritonConfig

SHAPES = ((2112, 7168), (4096, 7168), (7168, 2048), (7168, 16384), (7168, 18432), (24576, 1536), (32768, 512),
          (36864, 7168))
MS = (1024, 2048, 4096)
CONFIGS = ((64, 128, 4, 4), (64, 128, 4, 3), (128, 128, 8, 4), (128, 128, 8, 6), (128, 64, 4, 4), (64, 64, 4, 6))
PINNED = ("cuda-scaled-mm", "triton", "deepgemm")


def cfg_name(cfg: tuple[int, int, int, int]) -> str:
    return "gluon {}x{} w{} s{}".format(*cfg)


def wgmma_config(cfg: tuple[int, int, int, int]) -> TritonConfig:
    bm, bn, warps, stages = cfg
    return TritonConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=warps,
                        num_stages=stages, path="wgmma", FIXUP=0, TMA=1)


def gluon_whole(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None,
                cfg: tuple[int, int, int, int], block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """The Triton backend's wgmma path: the quantization kernel, then the Gluon GEMM."""
    return triton_gemm.linear(x, w, s, block, out_dtype=torch.bfloat16, bias=bias, config=wgmma_config(cfg))


def ragged_checks() -> list[dict[str, Any]]:
    """Ragged M/N/K, bias, a NaN row, per-row weight scales: relative error and NaN rows per config."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for n, k, m, block in ((1000, 1040, 333, (128, 128)), (2112, 7168, 77, (1, 128)), (768, 4096, 1500, (128, 128))):
        w, s = bench.random_weight(n, k, "cuda", gen, block=block)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        x[m // 2, 5] = float("nan")
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = bench.reference_for(w, s, block)(x) + bias.to(torch.float64)
        finite = torch.isfinite(ref).all(dim=1)
        for cfg in CONFIGS:
            row: dict[str, Any] = {"n": n, "k": k, "m": m, "block": list(block), "config": cfg_name(cfg)}
            try:
                out = gluon_whole(x, w, s, bias, cfg, block)
                torch.cuda.synchronize()
                row["rel_err"] = round(bench._rel_err(out[finite], ref[finite]), 6)
                row["nan_rows_match"] = bool(torch.equal(torch.isnan(out).any(dim=1), ~finite))
            except Exception as exc:  # noqa: BLE001 - a probe: record and go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--budget-s", type=float, default=400)
    parser.add_argument("--ragged-only", action="store_true", help="only the ragged checks")
    args = parser.parse_args()
    start = time.monotonic()
    report: dict[str, Any] = {"source": "benchmarks/gluon_probe.py", "environment": bench.environment(),
                              "wgmma_runs": triton_gemm.wgmma_runs(torch.device("cuda")),
                              "ragged": ragged_checks(), "points": []}
    print(json.dumps(report["ragged"]), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    if args.ragged_only:
        return 0
    selection = fp8select.resolve()
    by_name = {b.name: b for b in selection.chain}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in SHAPES:
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        ref_of = bench.reference_for(base, scale, (128, 128))
        layers = {name: [bench.single_backend(selection, by_name[name]).prepare(w, scale) for w in weights]
                  for name in PINNED if name in by_name}
        for m in MS:
            if time.monotonic() - start > args.budget_s:
                report["stopped"] = f"budget reached before {n}x{k} M={m}"
                break
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = ref_of(x)
            columns: dict[str, list[Any]] = {name: [functools.partial(layer, x) for layer in per]
                                             for name, per in layers.items()}
            errors: dict[str, Any] = {}
            for cfg in CONFIGS:
                calls = [functools.partial(gluon_whole, x, w, scale, None, cfg) for w in weights]
                try:
                    errors[cfg_name(cfg)] = round(bench._rel_err(calls[0](), ref), 6)
                    columns[cfg_name(cfg)] = calls
                except Exception as exc:  # noqa: BLE001
                    errors[cfg_name(cfg)] = f"{type(exc).__name__}: {exc}"[:300]
            for name in layers:
                errors[name] = round(bench._rel_err(columns[name][0](), ref), 6)
            failed: dict[str, str] = {}
            times = timing.time_graphs(columns, args.replays, errors=failed)
            us = {name: t.median_us for name, t in times.items()}
            gluon = {name: v for name, v in us.items() if name.startswith("gluon")
                     and isinstance(errors.get(name), float) and errors[name] < 1e-2}
            point: dict[str, Any] = {"n": n, "k": k, "m": m, "us": {k_: round(v, 2) for k_, v in us.items()},
                                     "rel_err": errors, "failed": failed}
            cublas = us.get("cuda-scaled-mm")
            if gluon and cublas:
                best = min(gluon, key=gluon.__getitem__)
                point["gluon_best"] = best
                point["gluon_vs_cublas"] = round(cublas / gluon[best], 4)
                if "triton" in us:
                    point["triton_vs_cublas"] = round(cublas / us["triton"], 4)
            report["points"].append(point)
            print(json.dumps(point), flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        else:
            continue
        break
    pts = [p for p in report["points"] if "gluon_vs_cublas" in p]
    if pts:
        def geo(key: str) -> float:
            vals = [p[key] for p in pts if key in p]
            return round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 4)
        per_cfg = {}
        for cfg in CONFIGS:
            vals = [p["us"]["cuda-scaled-mm"] / p["us"][cfg_name(cfg)] for p in pts if cfg_name(cfg) in p["us"]]
            if vals:
                per_cfg[cfg_name(cfg)] = round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 4)
        report["summary"] = {"points": len(pts), "gluon_best_vs_cublas_geomean": geo("gluon_vs_cublas"),
                             "triton_vs_cublas_geomean": geo("triton_vs_cublas"), "per_config_vs_cublas": per_cfg}
        print(json.dumps(report["summary"]), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
