"""A 20-second GPU smoke test: the Triton kernels compile and run, scaled_mm works, once each."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fp64_reference import expected, random_problem, rel_err

import fp8select

sel = fp8select.resolve(plugins=False)
print(sel.explain())
w, s = random_problem(2112, 7168, device="cuda")
for name in [b.name for b in sel.chain]:
    layer = fp8select.resolve(sel.capabilities, backend=name, plugins=False).prepare(w, s)
    for m in (1, 16, 200):
        x = torch.randn(m, 7168, device="cuda", dtype=torch.bfloat16)
        try:
            err = rel_err(layer(x), expected(x, w, s, (128, 128)))
            print(f"smoke {name} M={m} ran={layer.plan(m).name} rel_err={err:.2e}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"smoke {name} M={m} FAILED {type(exc).__name__}: {exc}", flush=True)

# Every Triton linear path compiles and computes the same product: fp64 check, and for the
# in-kernel quantizing paths bit-equality with the same kernel on the torch quantizer's output.
from dataclasses import replace  # noqa: E402

from fp8select.kernels import triton_gemm  # noqa: E402
from fp8select.kernels.quant import quantize_per_token_group  # noqa: E402
from fp8select.kernels.triton_search import heuristic_config  # noqa: E402

w, s = random_problem(576, 7200, device="cuda")  # ragged N and K
for path in triton_gemm.PATHS:
    for m in (1, 3, 200):
        x = torch.randn(m, 7200, device="cuda", dtype=torch.bfloat16)
        for extra in ({}, {"SPLIT_K": 4, "FIXUP": 1, "TMA": 1}):
            cfg = replace(heuristic_config(576, 7200, m, path), **extra)
            try:
                out = triton_gemm.linear(x, w, s, (128, 128), out_dtype=torch.bfloat16, config=cfg)
                err = rel_err(out, expected(x, w, s, (128, 128)))
                xq, xs = quantize_per_token_group(x)
                pre = triton_gemm.w8a8_block_gemm(xq, xs, w, s, (128, 128), out_dtype=torch.bfloat16, config=cfg)
                print(f"smoke triton {cfg.describe()} M={m} rel_err={err:.2e} bitwise_vs_prequant={torch.equal(out, pre)}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"smoke triton {cfg.describe()} M={m} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
