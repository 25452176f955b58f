"""Time the activation quantizer alone, per scale layout, and cuBLAS block-wise with and without it.

Run 2 showed cuBLAS's whole op (quantize + scaled_mm) 80 us slower than its GEMM alone at
N=12288, K=7168, M=4096, where the quantizer should read 58 MB and write 29 MB (~25 us). This
separates the two. Writes quant_bench.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fp8select.bench import time_graph
from fp8select.kernels.quant import M_MAJOR, ROW_MAJOR
from fp8select.kernels.triton_quant import quantize_per_token_group_triton


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for m, k in ((16, 7168), (1024, 7168), (4096, 7168), (4096, 16384)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for name, layout in (("row", ROW_MAJOR), ("m_major", M_MAJOR)):
            t = time_graph([lambda layout=layout, x=x: quantize_per_token_group_triton(x, layout=layout)], 50)
            moved = m * k * 3 + m * (k // 128) * 4
            rows.append({"m": m, "k": k, "layout": name, "us": round(t.median_us, 2),
                         "tb_per_s": round(moved / t.median_us / 1e6, 2)})
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
        rows.append({"case": name, "n": n, "k": k, "m": m, "us": round(time_graph([fn], 50).median_us, 2)})
        print(rows[-1], flush=True)
    Path(args.out, "quant_bench.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
