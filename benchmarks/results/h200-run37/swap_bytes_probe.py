"""Probe: is the swap-AB kernel's growth with M the activation's bytes (TMA rows fetched), its values, or M itself?"""

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
from fp8select.kernels import triton_gemm
from fp8select.kernels.quant import M_MAJOR
from fp8select.kernels.triton_quant import quantize_per_token_group_triton

Cfg = namedtuple("Cfg", "BLOCK_M BLOCK_N num_warps num_stages split rotate")
CFGS = (Cfg(16, 64, 4, 4, 1, False), Cfg(16, 64, 4, 4, 4, False), Cfg(16, 128, 4, 4, 7, False))


def op(x, w, s, c, counters, desc_rows, quant):
    m, _k = x.shape
    n = w.shape[0]
    if quant:
        xq, xs = quantize_per_token_group_triton(x, 128, dtype=w.dtype, layout=M_MAJOR)
    else:
        xq, xs = x, s[1]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    ws = torch.empty((c.split, m, n), dtype=torch.float32, device=x.device) if c.split > 1 else out
    gluon_swap.launch(xq, xs, w, s[0], 128, None, out, ws, counters, c.split, c.split > 1, True, c, desc_rows)
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
        floor = roofline.weight_bytes(n, k) / roofline.HBM_BYTES_PER_S * 1e6
        x1 = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        x16 = torch.randn(16, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        xsame = x1.expand(16, k).contiguous()
        xq16, xs16 = quantize_per_token_group_triton(x16, 128, dtype=base.dtype, layout=M_MAJOR)
        variants = {
            "m1": (x1, None, True),
            "m16": (x16, None, True),
            "m16 same rows": (xsame, None, True),
            "m16 one row fetched": (x16, 1, True),
            "m16 prequantized": (xq16, None, False),
        }
        cols = {}
        for c in CFGS:
            for vname, (x, rows, quant) in variants.items():
                s2 = (scale, xs16)
                cols[f"{c.BLOCK_N} sk{c.split} | {vname}"] = [functools.partial(op, x, w, s2, c, counters, rows, quant) for w in weights]
        failed = {}
        times = timing.time_graphs(cols, 40, errors=failed)
        us = {k_: round(t.median_us, 2) for k_, t in times.items()}
        rep["points"].append({"n": n, "k": k, "floor_us": round(floor, 3), "us": us, "failed": failed})
        print(json.dumps(rep["points"][-1]), flush=True)
        Path(a.out).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
