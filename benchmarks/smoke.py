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
