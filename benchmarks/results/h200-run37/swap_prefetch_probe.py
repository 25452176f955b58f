"""Probe: the swap-AB decode GEMM with its scales two blocks ahead (SCALES 3) and fewer weight stages before the PDL
wait (PRE), against the Triton layer and FlashInfer."""

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

import fp8select
from fp8select import bench, roofline, timing
from fp8select.kernels import triton_gemm, triton_quant
from fp8select.kernels.quant import M_MAJOR

Cfg = namedtuple("Cfg", "BLOCK_M BLOCK_N num_warps num_stages split rotate scales pre")
VARIANTS = {
    "64 s4 sk4": Cfg(16, 64, 4, 4, 4, False, 0, 4),
    "64 s4 sk4 sc3": Cfg(16, 64, 4, 4, 4, False, 3, 4),
    "64 s4 sk4 pre1": Cfg(16, 64, 4, 4, 4, False, 0, 1),
    "64 s4 sk4 pre0": Cfg(16, 64, 4, 4, 4, False, 0, 0),
    "64 s4 sk4 sc3 pre1": Cfg(16, 64, 4, 4, 4, False, 3, 1),
    "128 s4 sk7 sc3 pre1": Cfg(16, 128, 4, 4, 7, False, 3, 1),
    "64 s6 sk4 sc3 pre2": Cfg(16, 64, 4, 6, 4, False, 3, 2),
    "64 s4 sk8 sc3 pre1": Cfg(16, 64, 4, 4, 8, False, 3, 1),
    "64 s4 sk2 sc3 pre1": Cfg(16, 64, 4, 4, 2, False, 3, 1),
}


def op(x, w, s, c, counters):
    xq, xs = triton_quant.quantize_per_token_group_triton(x, 128, dtype=w.dtype, layout=M_MAJOR)
    m, k = x.shape
    kb = -(-k // 128)
    split = -(-kb // -(-kb // min(c.split, kb)))
    out = torch.empty((m, w.shape[0]), dtype=torch.bfloat16, device=x.device)
    ws = torch.empty((split, m, w.shape[0]), dtype=torch.float32, device=x.device) if split > 1 else out
    gluon_swap.launch(xq, xs, w, s, 128, None, out, ws, counters, split, split > 1, True, c._replace(split=split))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    sel = fp8select.resolve()
    by = {b.name: b for b in sel.chain}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rep = {"env": bench.environment(), "points": []}
    for (n, k), ms in (((7168, 16384), (1, 8, 16)), ((7168, 18432), (1, 8, 16)), ((4096, 7168), (16,)), ((36864, 7168), (16,))):
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        ref_of = bench.reference_for(base, scale, (128, 128))
        layers = {nm: [bench.single_backend(sel, by[nm]).prepare(w, scale) for w in weights] for nm in ("triton", "flashinfer") if nm in by}
        counters = triton_gemm.fixup_counters(n, torch.device("cuda"))
        floor = roofline.weight_bytes(n, k) / roofline.HBM_BYTES_PER_S * 1e6
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = ref_of(x)
            cols = {nm: [functools.partial(layer, x) for layer in per] for nm, per in layers.items()}
            errs = {}
            for name, c in VARIANTS.items():
                calls = [functools.partial(op, x, w, scale, c, counters) for w in weights]
                try:
                    errs[name] = round(bench._rel_err(calls[0](), ref), 6)
                    cols[name] = calls
                except Exception as e:  # noqa: BLE001 - a probe: record and go on
                    errs[name] = f"{type(e).__name__}: {e}"[:200]
            failed = {}
            times = timing.time_graphs(cols, 40, errors=failed)
            us = {k_: round(t.median_us, 2) for k_, t in times.items()}
            rep["points"].append({"n": n, "k": k, "m": m, "floor_us": round(floor, 3), "us": us, "errs": errs, "failed": failed})
            print(json.dumps({k_: v for k_, v in rep["points"][-1].items() if k_ != "errs"}), flush=True)
            Path(a.out).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
