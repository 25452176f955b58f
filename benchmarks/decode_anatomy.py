"""Where a decode call's time goes on the H200 beyond its configuration: the read ceiling and PDL.

    python -m benchmarks.decode_anatomy --out decode_anatomy.json [--ms 1,4,16] [--sweep LIMITS.json]

For every DeepSeek-V3 weight of >= 16M elements (the decode target's set), timed by the recipe of docs/measurements.md (CUDA
graph, median of the replays, weights rotated past the L2):

1. ``read``: the fastest of a few Triton kernels that only read the weight's bytes (each program xor-folds a
   contiguous share into one word), and torch's copy of them (read plus write): what any kernel streaming that
   many bytes reaches at that size, next to the HBM floor (weight and scale bytes / 4.3 TB/s).
2. ``modes``: at each M the Triton op (bf16 in) with the shipped table's configuration, and the sweep's best
   (``--sweep``, a distilled limits report) where that differs, without PDL and with PDL at every weight size.
   Each is timed back to back (each op may overlap the one before, as consecutive fp8select ops do) and isolated
   (a one-element torch kernel, which never lets a dependent launch early, between the ops; its own time,
   measured alone, subtracted). Every configuration and mode is checked against the fp64 reference first.
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

from benchmarks import limits
from benchmarks._cuda import require_cuda
from fp8select.buckets import m_bucket
from fp8select.kernels.triton_config import SCALE_GROUP_K, TritonConfig
from fp8select.measure import bench, timing

SWEEP = Path(__file__).resolve().parent / "results" / "limits_decode.json"  # a distilled limits report
MODES = {"off": False, "pdl": True}
READ_CONFIGS = [(g, block, stages, warps) for g in (132, 264, 528) for block in (4096, 8192)
                for stages in (2, 4) for warps in (4, 8)]


def parse_config(text: str) -> TritonConfig:
    """``decode 16x128 G8 SK8 w4 s3 F0 TMA1`` (limits.py's form) -> the configuration."""
    path, tile, group, split, warps, stages, fixup, tma = text.split()
    bm, bn = map(int, tile.split("x"))
    return TritonConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=SCALE_GROUP_K, GROUP_M=int(group[1:]), SPLIT_K=int(split[2:]),
                        num_warps=int(warps[1:]), num_stages=int(stages[1:]), path=path, FIXUP=int(fixup[1:]),
                        TMA=int(tma[3:]))


def read_kernels() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def read_kernel(src, out, elems, per_prog, BLOCK: tl.constexpr, STAGES: tl.constexpr):
        start = tl.program_id(0) * per_prog
        end = tl.minimum(start + per_prog, elems)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.int32)
        for i in tl.range(start, end, BLOCK, num_stages=STAGES):
            acc ^= tl.load(src + i + offs, mask=i + offs < end, other=0)
        tl.store(out + tl.program_id(0), tl.xor_sum(acc, 0))

    return read_kernel


def read_ceiling(weights: list[Any], replays: int) -> dict[str, Any]:
    """Best pure-read time of one weight's bytes, and torch's copy time, per call (rotated like the GEMMs)."""
    import torch
    import triton

    kernel = read_kernels()
    words = [w.view(torch.int32).reshape(-1) for w in weights]
    elems = words[0].numel()
    out = torch.empty(1024, dtype=torch.int32, device="cuda")
    best: dict[str, Any] = {"us": math.inf}
    for grid, block, stages, warps in READ_CONFIGS:
        per_prog = triton.cdiv(triton.cdiv(elems, grid), block) * block

        def call(src: Any, per_prog: int = per_prog, grid: int = grid, block: int = block, stages: int = stages,
                 warps: int = warps) -> None:
            kernel[(grid,)](src, out, elems, per_prog, BLOCK=block, STAGES=stages, num_warps=warps)

        us = timing.time_graph([functools.partial(call, src) for src in words], replays).median_us
        if us < best["us"]:
            best = {"us": round(us, 3), "grid": grid, "block_words": block, "stages": stages, "warps": warps}
    dsts = [torch.empty_like(w) for w in weights[:2]]
    copy_us = timing.time_graph([functools.partial(dsts[i % 2].copy_, w) for i, w in enumerate(weights)], replays).median_us
    return {"read": best, "copy_us": round(copy_us, 3)}


def set_mode(pdl: bool) -> None:
    from fp8select.kernels import triton_pdl

    triton_pdl._device_has_pdl = lambda index, on=pdl: on  # type: ignore[assignment]
    triton_pdl.PDL_MAX_WEIGHT = 1 << 40


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ms", default="1,4,16")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--sweep", default=str(SWEEP), help="a distilled limits report: its decode sweep configurations")
    args = parser.parse_args(argv)
    require_cuda("decode_anatomy")
    import torch

    from fp8select.kernels import triton_gemm

    t0 = time.monotonic()
    ms = bench.parse_ms(args.ms)
    table = limits.plan_work(0, 0, 0).table
    sweep = {(r["n"], r["k"], r["m"]): parse_config(r["sweep_config"]) for r in json.loads(Path(args.sweep).read_text())["decode"]}
    shapes = [s for s in bench.SHAPE_SETS["deepseek-v3"] if s[0] * s[1] >= 16 * 2**20]
    flag = torch.zeros(1, device="cuda")
    barrier = functools.partial(flag.add_, 1)
    barrier_us = timing.time_graph([barrier] * 8, args.replays).median_us
    report: dict[str, Any] = {"source": "benchmarks/decode_anatomy.py", "barrier_us": round(barrier_us, 3),
                              "weights": [], "points": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in shapes:
        w, s = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(w)
        floor = limits.weight_floor_us(n, k)
        ceiling = read_ceiling(weights, args.replays)
        report["weights"].append({"n": n, "k": k, "floor_us": round(floor, 3), **ceiling,
                                  "read_frac_of_floor": round(floor / ceiling["read"]["us"], 4)})
        reference = bench.reference_for(w, s, (128, 128))
        counters = triton_gemm.fixup_counters(n, "cuda")
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = reference(x)
            cfgs = {"table": table.get((n, k, m_bucket(m))), "sweep": sweep.get((n, k, m))}
            for label, cfg in cfgs.items():
                if cfg is None or (label == "sweep" and cfg == cfgs["table"]):
                    continue
                row: dict[str, Any] = {"n": n, "k": k, "m": m, "config": label, "describe": cfg.describe(),
                                       "floor_us": round(floor, 3)}
                run = functools.partial(triton_gemm.linear, block_size=(128, 128), out_dtype=torch.bfloat16,
                                        config=cfg, counters=counters)
                for mode, pdl in MODES.items():
                    set_mode(pdl)
                    try:
                        if bench.checked_call(functools.partial(run, b=w, b_scale=s), x, ref) is None:
                            raise ValueError("wrong result")
                        b2b = timing.time_graph([functools.partial(run, x, wi, s) for wi in weights], args.replays)
                        iso_calls = [c for wi in weights for c in (functools.partial(run, x, wi, s), barrier)]
                        iso = timing.time_graph(iso_calls, args.replays)
                        row[mode] = {"b2b_us": round(b2b.median_us, 3),
                                     "isolated_us": round(2 * iso.median_us - barrier_us, 3)}
                    except Exception as exc:  # noqa: BLE001 - a failing mode is data
                        row[mode] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                report["points"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        del weights, reference
        report["elapsed_s"] = round(time.monotonic() - t0, 1)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
