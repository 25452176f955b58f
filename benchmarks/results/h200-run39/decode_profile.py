"""Why decode GEMMs slow down as M grows at a fixed weight: the cases to time and to profile with Nsight Compute.

    PYTHONPATH=. python benchmarks/decode_profile.py --out times.json              # time every case (CUDA graphs)
    ncu --clock-control none --nvtx --nvtx-include "prof/" --set full --import-source yes -o decode \
        python benchmarks/decode_profile.py --profile --out cases.json             # one marked launch per case

A case is a backend or a fixed Triton configuration at one M on one weight (default 7168 x 16384). Timing: whole
ops, CUDA graphs, weights rotated past the L2, interleaved (``timing.time_graphs``), each checked against the fp64
reference first. Profiling: each case runs once unmarked (compilation, first-call work), then once inside the NVTX
range ``prof``, so ncu profiles only those launches; ``cases.json`` lists the cases in launch order.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import fp8select
from fp8select import bench, roofline, timing
from fp8select.kernels import triton_gemm
from fp8select.kernels.triton_config import TritonConfig

_BASE = {"BLOCK_K": 128, "BLOCK_M": 16, "GROUP_M": 8, "FIXUP": 0}
CONFIGS = {  # the shipped table's M 1 and M 16 rows of 7168 x 16384, and their prequantized / in-kernel siblings
    "decode": TritonConfig.from_dict({**_BASE, "BLOCK_N": 256, "SPLIT_K": 8, "TMA": 1, "num_stages": 3,
                                      "num_warps": 4, "path": "decode"}),
    "swap": TritonConfig.from_dict({**_BASE, "BLOCK_N": 256, "SPLIT_K": 8, "TMA": 1, "num_stages": 3,
                                    "num_warps": 4, "path": "swap"}),
    "gemm": TritonConfig.from_dict({**_BASE, "BLOCK_N": 64, "SPLIT_K": 4, "TMA": 0, "num_stages": 3,
                                    "num_warps": 2, "path": "gemm"}),
    "decode64": TritonConfig.from_dict({**_BASE, "BLOCK_N": 64, "SPLIT_K": 4, "TMA": 1, "num_stages": 4,
                                        "num_warps": 4, "path": "decode"}),
}
VENDORS = ("flashinfer", "deepgemm")


def cases(ms: list[int]) -> list[tuple[str, int]]:
    return [(name, m) for name in (*CONFIGS, *VENDORS) for m in ms]


def make_call(name: str, m: int, weight: torch.Tensor, scale: torch.Tensor, layers: dict, x: torch.Tensor):
    if name in CONFIGS:
        return functools.partial(triton_gemm.linear, x, weight, scale, (128, 128), out_dtype=torch.bfloat16,
                                 config=CONFIGS[name])
    return functools.partial(layers[name][id(weight)], x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=7168)
    p.add_argument("--k", type=int, default=16384)
    p.add_argument("--ms", default="1,16")
    p.add_argument("--profile", action="store_true", help="one NVTX-marked launch per case, for ncu")
    p.add_argument("--replays", type=int, default=60)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    ms = [int(v) for v in a.ms.split(",")]
    sel = fp8select.resolve()
    by = {b.name: b for b in sel.chain}
    gen = torch.Generator(device="cuda").manual_seed(0)
    base, scale = bench.random_weight(a.n, a.k, "cuda", gen)
    weights = [base] if a.profile else bench.rotated(base)
    ref_of = bench.reference_for(base, scale, (128, 128))
    layers = {nm: {id(w): bench.single_backend(sel, by[nm]).prepare(w, scale) for w in weights}
              for nm in VENDORS if nm in by}
    xs = {m: torch.randn(m, a.k, device="cuda", dtype=torch.bfloat16, generator=gen) for m in ms}
    todo = [(nm, m) for nm, m in cases(ms) if nm in CONFIGS or nm in layers]
    report = {"n": a.n, "k": a.k, "env": bench.environment(), "skipped": sorted(set(VENDORS) - set(layers)),
              "configs": {nm: c.to_dict() for nm, c in CONFIGS.items()}, "cases": [], "errors": {}}
    floor = roofline.weight_bytes(a.n, a.k) / roofline.HBM_BYTES_PER_S * 1e6
    for nm, m in todo:
        err = bench._rel_err(make_call(nm, m, base, scale, layers, xs[m])(), ref_of(xs[m]))
        report["cases"].append({"case": f"{nm}@m{m}", "rel_err": round(err, 6)})
    if a.profile:
        for nm, m in todo:
            call = make_call(nm, m, base, scale, layers, xs[m])
            call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("prof")
            call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
    else:
        cols = {f"{nm}@m{m}": [make_call(nm, m, w, scale, layers, xs[m]) for w in weights] for nm, m in todo}
        times = timing.time_graphs(cols, a.replays, errors=report["errors"])
        for row in report["cases"]:
            if (t := times.get(row["case"])) is not None:
                row["us"] = round(t.median_us, 3)
                row["of_floor"] = round(floor / t.median_us, 4)
    Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
