"""Time the activation quantizer alone, the Triton linear per path, and cuBLAS block-wise with and without the quantizer.

    python benchmarks/quant_bench.py --out DIR [--baseline OLD/fp8select/kernels]

Run 2 showed cuBLAS's whole op (quantize + scaled_mm) 80 us slower than its GEMM alone at
N=12288, K=7168, M=4096, where the quantizer should read 58 MB and write 29 MB (~25 us); the
first rows separate the two. ``--baseline`` names the ``fp8select/kernels`` folder of another
checkout (``git worktree add``): its quantizer and Triton linear are timed next to this tree's,
same shapes, same launch configurations, alternating, to show what a kernel change costs (the
NaN/inf propagation, for one). Writes quant_bench.json under --out. CUDA only.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fp8select.kernels import triton_gemm
from fp8select.kernels.quant import M_MAJOR, ROW_MAJOR
from fp8select.kernels.triton_quant import quantize_per_token_group_triton
from fp8select.kernels.triton_search import heuristic_config
from fp8select.timing import time_graph

QUANT_SHAPES = ((1, 7168), (16, 7168), (1024, 7168), (4096, 7168), (4096, 16384))
LINEAR_POINTS = (  # (N, K, M, path)
    (7168, 16384, 1, "decode"), (4096, 7168, 1, "decode"), (4096, 7168, 16, "decode"), (4096, 7168, 16, "gemm"),
    (4096, 7168, 16, "fused"), (4096, 7168, 64, "fused"), (4096, 7168, 4096, "gemm"), (24576, 1536, 4096, "gemm"),
)


def _load_baseline(folder: str) -> tuple[ModuleType, ModuleType]:
    """(triton_quant, triton_gemm) of another checkout's kernels folder, as a separate package."""
    root = Path(folder).resolve()
    spec = importlib.util.spec_from_file_location("baseline_kernels", root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["baseline_kernels"] = package
    spec.loader.exec_module(package)
    return (importlib.import_module("baseline_kernels.triton_quant"),
            importlib.import_module("baseline_kernels.triton_gemm"))


def _us(fn: Any) -> float:
    return round(time_graph([fn], 100).median_us, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--baseline", help="fp8select/kernels folder of another checkout, timed alongside")
    args = parser.parse_args()
    base = _load_baseline(args.baseline) if args.baseline else None
    rows: list[dict[str, Any]] = []
    for m, k in QUANT_SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for name, layout in (("row", ROW_MAJOR), ("m_major", M_MAJOR)):
            row: dict[str, Any] = {"case": "quant", "m": m, "k": k, "layout": name}
            for _ in range(2):  # alternate, so drift hits both alike; the second round is reported
                row["us"] = _us(lambda layout=layout, x=x: quantize_per_token_group_triton(x, layout=layout))
                if base is not None:
                    row["baseline_us"] = _us(lambda layout=layout, x=x: base[0].quantize_per_token_group_triton(
                        x, layout=layout))
            row["tb_per_s"] = round((m * k * 3 + m * (k // 128) * 4) / row["us"] / 1e6, 2)
            rows.append(row)
            print(rows[-1], flush=True)
    for n, k, m, path in LINEAR_POINTS:
        w = torch.randn(n, k, device="cuda").clamp(-400, 400).to(torch.float8_e4m3fn)
        ws = torch.rand(-(-n // 128), -(-k // 128), device="cuda") * 1e-3 + 1e-4
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        cfg = heuristic_config(n, k, m, path)
        row = {"case": "triton_linear", "n": n, "k": k, "m": m, "config": cfg.to_dict()}
        new_call = functools.partial(triton_gemm.linear, x, w, ws, (128, 128), out_dtype=torch.bfloat16, config=cfg)
        for _ in range(2):
            row["us"] = _us(new_call)
            if base is not None:
                row["baseline_us"] = _us(functools.partial(base[1].linear, x, w, ws, (128, 128), out_dtype=torch.bfloat16,
                                                           config=cfg.to_dict()))
        rows.append(row)
        print(rows[-1], flush=True)
    n, k, m = 12288, 7168, 4096
    w = torch.randn(n, k, device="cuda").clamp(-400, 400).to(torch.float8_e4m3fn)
    ws = torch.rand(n // 128, k // 128, device="cuda") + 0.5
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, xs = quantize_per_token_group_triton(x, layout=M_MAJOR)
    st = F.ScalingType

    def gemm() -> torch.Tensor:
        return F.scaled_mm(xq, w.t(), xs, st.BlockWise1x128, ws.t(), st.BlockWise128x128, output_dtype=torch.bfloat16)

    def whole() -> torch.Tensor:
        q, s = quantize_per_token_group_triton(x, layout=M_MAJOR)
        return F.scaled_mm(q, w.t(), s, st.BlockWise1x128, ws.t(), st.BlockWise128x128, output_dtype=torch.bfloat16)

    for name, fn in (("cublas_gemm_alone", gemm), ("cublas_quant_plus_gemm", whole)):
        rows.append({"case": name, "n": n, "k": k, "m": m, "us": _us(fn)})
        print(rows[-1], flush=True)
    Path(args.out, "quant_bench.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
