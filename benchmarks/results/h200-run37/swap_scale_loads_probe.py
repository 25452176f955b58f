"""Probe: does the swap-AB decode GEMM's growth with M come from its per-K-block activation-scale loads?
(SCALES 1: no activation-scale loads, 2: no scale loads at all; wrong results, timing only)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import namedtuple
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gluon_swap
import torch

from fp8select import bench, roofline, timing
from fp8select.kernels import triton_gemm, triton_quant
from fp8select.kernels.quant import M_MAJOR

Cfg = namedtuple("Cfg", "BLOCK_M BLOCK_N num_warps num_stages split rotate scales")


def op(x, w, s, c, counters, quant):
    _m, _k = x.shape
    if quant:
        xq, xs = triton_quant.quantize_per_token_group_triton(x, 128, dtype=w.dtype, layout=M_MAJOR)
    else:
        xq, xs = x
    out = torch.empty((xq.shape[0], w.shape[0]), dtype=torch.bfloat16, device=xq.device)
    ws = torch.empty((c.split, xq.shape[0], w.shape[0]), dtype=torch.float32, device=xq.device) if c.split > 1 else out
    gluon_swap.launch(xq, xs, w, s, 128, None, out, ws, counters, c.split, c.split > 1, True, c)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rep = {"env": bench.environment(), "points": []}
    for n, k in ((7168, 16384), (7168, 18432)):
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        counters = triton_gemm.fixup_counters(n, torch.device("cuda"))
        cols = {}
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            pre = triton_quant.quantize_per_token_group_triton(x, 128, dtype=base.dtype, layout=M_MAJOR)
            for split in (1, 4):
                for sc in (0, 1, 2):
                    c = Cfg(16, 64, 4, 4, split, False, sc)
                    cols[f"m{m} sk{split} scales{sc}"] = [functools.partial(op, x, w, scale, c, counters, True) for w in weights]
                    cols[f"m{m} sk{split} scales{sc} prequant"] = [
                        functools.partial(op, pre, w, scale, c, counters, False) for w in weights
                    ]
        failed = {}
        times = timing.time_graphs(cols, 40, errors=failed)
        us = {k_: round(t.median_us, 2) for k_, t in times.items()}
        rep["points"].append(
            {"n": n, "k": k, "floor_us": round(roofline.weight_bytes(n, k) / roofline.HBM_BYTES_PER_S * 1e6, 3), "us": us, "failed": failed}
        )
        print(json.dumps(rep["points"][-1]), flush=True)
        Path(a.out).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
