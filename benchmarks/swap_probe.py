"""Does the Gluon swap-AB kernel, streaming its weight while the quantizer runs (PDL), reach 0.75 of the HBM floor at decode?

    source .vendors/setup.sh && python benchmarks/swap_probe.py --out swap_probe.json

At each DeepSeek-V3 decode point with N*K >= 16M (M 1-16) the whole ops (activation quantization +
GEMM, bf16 in and out) are timed together, interleaved (:func:`fp8select.timing.time_graphs`),
weights rotated past L2: Triton and the vendors pinned (the shipped table's configurations), and
the Triton quantizer followed by the ``wgmma-swap`` kernel (:mod:`fp8select.kernels.gluon_swap`),
one column per launch configuration, plus the first of them without PDL. Each is first checked
against the fp64 reference at that point, and the path (through ``triton_gemm.linear``) at ragged
shapes with a NaN row, a bias, per-row (1x128) weight scales and the two split-K summations.
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
from fp8select import bench, roofline, timing
from fp8select.kernels import gluon_swap, triton_gemm
from fp8select.kernels.quant import M_MAJOR
from fp8select.kernels.triton_config import TritonConfig
from fp8select.kernels.triton_quant import quantize_per_token_group_triton
from fp8select.kernels.triton_search import fill_split

SHAPES = ((7168, 16384), (7168, 18432), (4096, 7168), (24576, 1536), (32768, 512), (36864, 7168), (4096, 14336))
# (4096 x 14336: another model's shape, whose Triton configuration the plan borrows from 7168 x 16384)
MS = (1, 2, 4, 8, 16)
TILES = ((64, 4, 4), (64, 4, 8), (128, 8, 4), (128, 8, 8), (128, 4, 6), (256, 8, 4))  # BLOCK_N, warps, stages
PINNED = ("triton", "flashinfer", "deepgemm")


def swap_config(bn: int, warps: int, stages: int, split: int, fixup: int = 1, bm: int = 16) -> TritonConfig:
    return TritonConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8, SPLIT_K=split, num_warps=warps,
                        num_stages=stages, path="wgmma-swap", FIXUP=fixup, TMA=1)


def configs(n: int, k: int, m: int) -> list[TritonConfig]:
    """Each tile with the split-K that gives about 2 and about 4 programs per SM."""
    out: list[TritonConfig] = []
    for bn, warps, stages in TILES:
        for per_sm in (2, 4):
            cfg = swap_config(bn, warps, stages, fill_split(n, k, m, 16, bn, programs_per_sm=per_sm, min_blocks=2))
            if cfg not in out:
                out.append(cfg)
    return out


def gluon_op(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, cfg: TritonConfig, counters: torch.Tensor,
             pdl: bool) -> torch.Tensor:
    """The wgmma-swap path by hand (so PDL can be switched off): quantizer, then the Gluon kernel."""
    m, k = x.shape
    n = w.shape[0]
    xq, xs = quantize_per_token_group_triton(x, 128, dtype=w.dtype, layout=M_MAJOR)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    split = cfg.split_for(k)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    gluon_swap.launch(xq, xs, w, s, 128, None, out, ws, counters, split, split > 1, pdl, cfg)
    return out


def ragged_checks() -> list[dict[str, Any]]:
    """The path through triton_gemm.linear: ragged N/K, bias, a NaN row, 1x128 scales, both summations."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for n, k, m, block in ((1000, 1040, 5, (128, 128)), (2112, 7168, 16, (1, 128)), (576, 1536, 3, (128, 128)),
                           (4160, 7200, 13, (128, 128)), (7168, 2048, 40, (128, 128))):
        w, s = bench.random_weight(n, k, "cuda", gen, block=block)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        x[m // 2, 7] = float("nan")
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = bench.reference_for(w, s, block)(x) + bias.to(torch.float64)
        finite = torch.isfinite(ref).all(dim=1)
        for cfg in (swap_config(64, 4, 4, 4), swap_config(64, 4, 4, 4, fixup=0), swap_config(128, 8, 6, 1),
                    swap_config(128, 4, 3, 2, bm=64)):
            row: dict[str, Any] = {"n": n, "k": k, "m": m, "block": list(block), "config": cfg.describe()}
            try:
                out = triton_gemm.linear(x, w, s, block, out_dtype=torch.bfloat16, bias=bias, config=cfg)
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
    parser.add_argument("--budget-s", type=float, default=300)
    args = parser.parse_args()
    start = time.monotonic()
    device = torch.device("cuda")
    report: dict[str, Any] = {"source": "benchmarks/swap_probe.py", "environment": bench.environment(),
                              "wgmma_runs": triton_gemm.wgmma_runs(device), "ragged": ragged_checks(), "points": []}
    print(json.dumps(report["ragged"]), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    selection = fp8select.resolve()
    by_name = {b.name: b for b in selection.chain}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in SHAPES:
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        ref_of = bench.reference_for(base, scale, (128, 128))
        layers = {name: [bench.single_backend(selection, by_name[name]).prepare(w, scale) for w in weights]
                  for name in PINNED if name in by_name}
        counters = triton_gemm.fixup_counters(n, device)
        floor = roofline.weight_bytes(n, k) / roofline.HBM_BYTES_PER_S * 1e6
        for m in MS:
            if time.monotonic() - start > args.budget_s:
                report["stopped"] = f"budget reached before {n}x{k} M={m}"
                break
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = ref_of(x)
            columns: dict[str, list[Any]] = {name: [functools.partial(layer, x) for layer in per]
                                             for name, per in layers.items()}
            errors: dict[str, Any] = {}
            cfgs = configs(n, k, m)
            variants = [(cfg, True) for cfg in cfgs] + [(cfgs[0], False)]
            for cfg, pdl in variants:
                name = cfg.describe() + ("" if pdl else " nopdl")
                calls = [functools.partial(gluon_op, x, w, scale, cfg, counters, pdl) for w in weights]
                try:
                    errors[name] = round(bench._rel_err(calls[0](), ref), 6)
                    columns[name] = calls
                except Exception as exc:  # noqa: BLE001
                    errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            for name in layers:
                if name in columns:
                    errors[name] = round(bench._rel_err(columns[name][0](), ref), 6)
            failed: dict[str, str] = {}
            times = timing.time_graphs(columns, args.replays, errors=failed)
            us = {name: t.median_us for name, t in times.items()}
            gluon = {name: v for name, v in us.items() if name.startswith("wgmma-swap")
                     and isinstance(errors.get(name), float) and errors[name] < 1e-2}
            point: dict[str, Any] = {"n": n, "k": k, "m": m, "floor_us": round(floor, 3),
                                     "us": {k_: round(v, 2) for k_, v in us.items()}, "rel_err": errors,
                                     "failed": failed}
            if gluon:
                best = min(gluon, key=gluon.__getitem__)
                point["gluon_best"] = best
                point["gluon_frac"] = round(floor / gluon[best], 4)
            if "triton" in us:
                point["triton_frac"] = round(floor / us["triton"], 4)
            report["points"].append(point)
            print(json.dumps({k_: v for k_, v in point.items() if k_ not in ("rel_err", "failed")}), flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        else:
            continue
        break
    pts = [p for p in report["points"] if "gluon_frac" in p and "triton_frac" in p]
    if pts:
        def geo(key: str) -> float:
            return round(math.exp(sum(math.log(p[key]) for p in pts) / len(pts)), 4)
        report["summary"] = {"points": len(pts), "gluon_frac_geomean": geo("gluon_frac"),
                             "triton_frac_geomean": geo("triton_frac"),
                             "gluon_at_075": sum(p["gluon_frac"] >= 0.75 for p in pts),
                             "triton_at_075": sum(p["triton_frac"] >= 0.75 for p in pts)}
        print(json.dumps(report["summary"]), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
