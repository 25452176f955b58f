"""Probe: what the per-token-group quantizer costs in a decode op at M 16 against M 1: its program shape, its PDL."""

from __future__ import annotations

import argparse
import contextlib
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
from fp8select.kernels.triton_config import TritonConfig

Cfg = namedtuple("Cfg", "BLOCK_M BLOCK_N num_warps num_stages split rotate")
G = Cfg(16, 64, 4, 4, 4, False)
SHAPE0 = triton_quant._program_shape
PDL0 = triton_quant.pdl_launch


@contextlib.contextmanager
def quant_mode(rows, warps, pdl):
    if rows is not None:
        triton_quant._program_shape = lambda m, g: (min(rows, triton_quant.triton.next_power_of_2(m)), warps)
    if not pdl:
        triton_quant.pdl_launch = lambda *a, **k: {}
    try:
        yield
    finally:
        triton_quant._program_shape = SHAPE0
        triton_quant.pdl_launch = PDL0


def gluon_op(x, w, s, counters, mode):
    with quant_mode(*mode):
        xq, xs = triton_quant.quantize_per_token_group_triton(x, 128, dtype=w.dtype, layout=M_MAJOR)
    m, _k = x.shape
    out = torch.empty((m, w.shape[0]), dtype=torch.bfloat16, device=x.device)
    ws = torch.empty((G.split, m, w.shape[0]), dtype=torch.float32, device=x.device)
    gluon_swap.launch(xq, xs, w, s, 128, None, out, ws, counters, G.split, True, True, G)
    return out


def triton_op(x, w, s, cfg, counters, mode):
    with quant_mode(*mode):
        return triton_gemm.linear(x, w, s, (128, 128), out_dtype=torch.bfloat16, config=cfg, counters=counters)


def quant_only(x, mode):
    with quant_mode(*mode):
        return triton_quant.quantize_per_token_group_triton(x, 128, layout=M_MAJOR)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rep = {"env": bench.environment(), "points": []}
    modes = {
        "quant 16 rows/prog pdl": (None, 4, True),
        "quant nopdl": (None, 4, False),
        "quant 1 row/prog": (1, 4, True),
        "quant 4 rows/prog": (4, 4, True),
        "quant 16 rows 1 warp": (16, 1, True),
    }
    tri8 = TritonConfig.from_dict(
        {
            "BLOCK_M": 16,
            "BLOCK_N": 64,
            "BLOCK_K": 128,
            "GROUP_M": 8,
            "SPLIT_K": 4,
            "num_warps": 2,
            "num_stages": 3,
            "path": "gemm",
            "FIXUP": 0,
            "TMA": 0,
        }
    )
    for n, k in ((7168, 16384), (7168, 18432), (4096, 7168)):
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        counters = triton_gemm.fixup_counters(n, torch.device("cuda"))
        ref_of = bench.reference_for(base, scale, (128, 128))
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = ref_of(x)
            cols, errs = {}, {}
            for name, mode in modes.items():
                cols[f"gluon | {name}"] = [functools.partial(gluon_op, x, w, scale, counters, mode) for w in weights]
                cols[f"triton gemm sk4 | {name}"] = [functools.partial(triton_op, x, w, scale, tri8, counters, mode) for w in weights]
                cols[f"quant only | {name}"] = [functools.partial(quant_only, x, mode)]
                errs[name] = round(bench._rel_err(cols[f"gluon | {name}"][0](), ref), 6)
            failed = {}
            times = timing.time_graphs(cols, 40, errors=failed)
            us = {k_: round(t.median_us, 2) for k_, t in times.items()}
            rep["points"].append(
                {
                    "n": n,
                    "k": k,
                    "m": m,
                    "floor_us": round(roofline.weight_bytes(n, k) / roofline.HBM_BYTES_PER_S * 1e6, 3),
                    "us": us,
                    "errs": errs,
                    "failed": failed,
                }
            )
            print(json.dumps(rep["points"][-1]), flush=True)
            Path(a.out).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
