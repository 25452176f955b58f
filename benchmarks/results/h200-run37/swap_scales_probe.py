"""Probe: the decode GEMMs' time growth with M is the activation scales' layout? M-major (a new L2 line every
K block or two at M 8-16, prefetched one block ahead) against row-major (a token's next 32 blocks in one line)."""

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

import fp8select
from fp8select import bench, roofline, timing
from fp8select.kernels import triton_gemm, triton_quant
from fp8select.kernels.quant import M_MAJOR, ROW_MAJOR

Cfg = namedtuple("Cfg", "BLOCK_M BLOCK_N num_warps num_stages split rotate")
G = Cfg(16, 64, 4, 4, 4, False)


@contextlib.contextmanager
def row_major():
    triton_gemm.M_MAJOR = ROW_MAJOR
    try:
        yield
    finally:
        triton_gemm.M_MAJOR = M_MAJOR


def layer_call(layer, x, rm):
    if rm:
        with row_major():
            return layer(x)
    return layer(x)


def gluon_op(x, w, s, counters, layout):
    xq, xs = triton_quant.quantize_per_token_group_triton(x, 128, dtype=w.dtype, layout=layout)
    m, _k = x.shape
    out = torch.empty((m, w.shape[0]), dtype=torch.bfloat16, device=x.device)
    ws = torch.empty((G.split, m, w.shape[0]), dtype=torch.float32, device=x.device)
    gluon_swap.launch(xq, xs, w, s, 128, None, out, ws, counters, G.split, True, True, G)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    sel = fp8select.resolve()
    by = {b.name: b for b in sel.chain}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rep = {"env": bench.environment(), "points": []}
    for n, k in ((7168, 16384), (7168, 18432), (4096, 7168), (24576, 1536), (32768, 512), (36864, 7168), (4096, 14336)):
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        ref_of = bench.reference_for(base, scale, (128, 128))
        layers = [bench.single_backend(sel, by["triton"]).prepare(w, scale) for w in weights]
        counters = triton_gemm.fixup_counters(n, torch.device("cuda"))
        for m in (1, 2, 4, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = ref_of(x)
            cols = {
                "triton m-major": [functools.partial(layer_call, layer, x, False) for layer in layers],
                "triton row-major": [functools.partial(layer_call, layer, x, True) for layer in layers],
                "gluon m-major": [functools.partial(gluon_op, x, w, scale, counters, M_MAJOR) for w in weights],
                "gluon row-major": [functools.partial(gluon_op, x, w, scale, counters, ROW_MAJOR) for w in weights],
            }
            errs = {c: round(bench._rel_err(calls[0](), ref), 6) for c, calls in cols.items()}
            failed = {}
            times = timing.time_graphs(cols, 40, errors=failed)
            us = {k_: round(t.median_us, 2) for k_, t in times.items()}
            pt = {
                "n": n,
                "k": k,
                "m": m,
                "floor_us": round(roofline.weight_bytes(n, k) / roofline.HBM_BYTES_PER_S * 1e6, 3),
                "us": us,
                "errs": errs,
                "failed": failed,
            }
            rep["points"].append(pt)
            print(json.dumps({k_: v for k_, v in pt.items() if k_ != "errs"}), flush=True)
            Path(a.out).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
