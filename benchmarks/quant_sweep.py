"""The activation quantization kernel's program shape (rows per program, warps), timed on the GPU.

    python benchmarks/quant_sweep.py --out quant_sweep.json

For M in 1024 and 4096 and the DeepSeek-V3 K values: the kernel alone (M-major scales, as DeepGEMM
takes them), its input in the L2 as in a model (it was just written), in CUDA graphs of 8 calls;
each shape against the current rule (``triton_quant._program_shape``).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from fp8select.kernels import triton_quant
from fp8select.kernels.quant import ScaleLayout
from fp8select.timing import time_graph

SHAPES = [(m, k) for m in (1024, 4096) for k in (512, 1536, 2048, 7168, 16384, 18432)]
PROGRAMS = [(rows, warps) for rows in (8, 16, 32, 64) for warps in (2, 4, 8)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    layout = ScaleLayout(mn_major=True, m_align=4)
    rule = triton_quant._program_shape
    rows_out = []
    for m, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        times = {}
        for shape in [None, *PROGRAMS]:
            triton_quant._program_shape = rule if shape is None else (lambda _m, _g, s=shape: s)
            try:
                calls = [lambda x=x: triton_quant.quantize_per_token_group_triton(x, 128, layout=layout)] * 8
                times["rule" if shape is None else f"{shape[0]}x{shape[1]}w"] = round(time_graph(calls, 30).median_us, 2)
            finally:
                triton_quant._program_shape = rule
        best = min(times, key=times.get)
        rows_out.append({"m": m, "k": k, "rule": rule(m, 128), "us": times, "best": best,
                         "best_over_rule": round(times[best] / times["rule"], 3)})
        print(m, k, times["rule"], best, times[best], flush=True)
    geo = {name: statistics.geometric_mean([r["us"][name] / r["us"]["rule"] for r in rows_out])
           for name in rows_out[0]["us"]}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump({"rows": rows_out, "geomean_vs_rule": {k: round(v, 3) for k, v in sorted(geo.items(), key=lambda kv: kv[1])}},
                  fh, indent=1)


if __name__ == "__main__":
    main()
