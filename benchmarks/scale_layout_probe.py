"""Does the activation scales' layout change the wgmma kernel's speed? Row-major against M-major, timed together.

    source .vendors/setup.sh && python benchmarks/scale_layout_probe.py --out scale_layout_probe.json

At three prefill points, interleaved (:func:`fp8select.timing.time_graphs`): the Triton layer's ``linear``
on the wgmma path, the quantizer then the Gluon GEMM with row-major and with M-major scales, the GEMM
alone on each, the quantizer alone in each layout, and cuBLAS pinned.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import fp8select
from fp8select import bench, timing
from fp8select.kernels import gluon_gemm, triton_gemm
from fp8select.kernels.quant import M_MAJOR, ROW_MAJOR, ScaleLayout
from fp8select.kernels.triton_config import TritonConfig
from fp8select.kernels.triton_quant import quantize_per_token_group_triton as quantize

POINTS = ((7168, 16384, 4096, 128, 128, 8), (36864, 7168, 1024, 128, 128, 8), (24576, 1536, 4096, 64, 128, 4))


def gemm(xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, cfg: TritonConfig) -> torch.Tensor:
    """The Gluon GEMM alone on a quantized activation."""
    out = torch.empty((xq.shape[0], w.shape[0]), dtype=torch.bfloat16, device=xq.device)
    gluon_gemm.launch(xq, xs, w, scale, 128, None, out, cfg)
    return out


def whole(x: torch.Tensor, layout: ScaleLayout, w: torch.Tensor, scale: torch.Tensor, cfg: TritonConfig) -> torch.Tensor:
    """The quantizer writing ``layout``, then the Gluon GEMM."""
    return gemm(*quantize(x, layout=layout), w, scale, cfg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--replays", type=int, default=40)
    args = parser.parse_args()
    selection = fp8select.resolve()
    cublas = bench.single_backend(selection, next(b for b in selection.chain if b.name == "cuda-scaled-mm"))
    report: dict[str, Any] = {"source": "benchmarks/scale_layout_probe.py", "environment": bench.environment(),
                              "points": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k, m, bm, bn, warps in POINTS:
        cfg = TritonConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=warps, num_stages=4,
                           path="wgmma", FIXUP=0, TMA=1)
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = bench.rotated(base)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        prequant = {name: quantize(x, layout=layout) for name, layout in (("row", ROW_MAJOR), ("mmajor", M_MAJOR))}

        columns: dict[str, list[Any]] = {
            "linear": [functools.partial(triton_gemm.linear, x, w, scale, (128, 128), out_dtype=torch.bfloat16,
                                         config=cfg) for w in weights],
            "cublas": [functools.partial(layer, x) for layer in (cublas.prepare(w, scale) for w in weights)],
        }
        for name, layout in (("row", ROW_MAJOR), ("mmajor", M_MAJOR)):
            columns[f"whole-{name}"] = [functools.partial(whole, x, layout, w, scale, cfg) for w in weights]
            columns[f"gemm-{name}"] = [functools.partial(gemm, *prequant[name], w, scale, cfg) for w in weights]
            columns[f"quant-{name}"] = [functools.partial(quantize, x, layout=layout)]
        times = timing.time_graphs(columns, args.replays)
        point = {"n": n, "k": k, "m": m, "config": cfg.describe(),
                 "us": {name: round(t.median_us, 1) for name, t in times.items()}}
        report["points"].append(point)
        print(json.dumps(point), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
