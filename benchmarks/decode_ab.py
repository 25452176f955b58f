"""Decode (small M) Triton kernels of this tree against a baseline copy of them, timed together; or profiled.

    git show REV:fp8select/kernels/triton_gemm_kernels.py | sed 's/^from \\./from fp8select.kernels./' > base.py
    python -m benchmarks.decode_ab --baseline base.py --out ab.json         # A/B, CUDA graphs
    ncu --clock-control none --nvtx --nvtx-include "prof/" --set full --import-source yes -o decode \\
        python -m benchmarks.decode_ab --profile --shapes 7168x16384 --ms 1,16 --out cases.json

A case is a column at one (N, K, M): ``layer`` (the Triton backend with the shipped table's configuration for that
M), a fixed configuration of :data:`CONFIGS` (on the 7168-row weights only), or a vendor. ``--baseline`` adds each
Triton case again with the baseline's kernels (``base:`` prefix): the launcher of this tree swaps its kernels for the
baseline's around each call, so both run the same launch code and configuration. Timing: whole ops, CUDA graphs,
weights rotated past the L2, every column of a shape interleaved (``timing.time_graphs``), each checked against the
fp64 reference first. ``--profile``: each case runs once unmarked (compilation, first-call work), then once inside
the NVTX range ``prof``, so ncu profiles only those launches; ``cases`` lists them in launch order. ``--distill`` turns
several A/B reports into the distilled form ``benchmarks.merge_tuning`` folds into a tuning table.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import torch

import fp8select
from benchmarks import limits
from benchmarks._cuda import require_cuda
from fp8select.kernels import triton_bound, triton_gemm
from fp8select.kernels.triton_config import TritonConfig
from fp8select.measure import bench, timing

_BASE = {"BLOCK_K": 128, "BLOCK_M": 16, "GROUP_M": 8}
CONFIGS = {  # the shipped table's M 1 and M 16 configurations of 7168 x 16384, and variants of them
    "decode": {"BLOCK_N": 256, "SPLIT_K": 8, "TMA": 1, "num_stages": 3, "num_warps": 4, "path": "decode", "FIXUP": 0},
    "swap": {"BLOCK_N": 256, "SPLIT_K": 8, "TMA": 1, "num_stages": 3, "num_warps": 4, "path": "swap", "FIXUP": 0},
    "decode-fixup": {"BLOCK_N": 256, "SPLIT_K": 8, "TMA": 1, "num_stages": 3, "num_warps": 4, "path": "decode",
                     "FIXUP": 1},
    "decode128-fixup": {"BLOCK_N": 128, "SPLIT_K": 8, "TMA": 1, "num_stages": 3, "num_warps": 4, "path": "decode",
                        "FIXUP": 1},
    "gemm": {"BLOCK_N": 64, "SPLIT_K": 4, "TMA": 0, "num_stages": 3, "num_warps": 2, "path": "gemm", "FIXUP": 0},
    "gemm-fixup": {"BLOCK_N": 64, "SPLIT_K": 4, "TMA": 0, "num_stages": 3, "num_warps": 2, "path": "gemm",
                   "FIXUP": 1},
}
CONFIG_SHAPES = ((7168, 16384), (7168, 18432))
VENDORS = ("flashinfer",)
KERNELS = ("_w8a8_block_kernel", "_w8a8_swap_kernel", "_splitk_reduce_kernel", "_w8a8_persistent_kernel")


def load_kernels(path: str | None):
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("baseline_kernels", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load kernels from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_kernels(module, call):
    """``call`` with the kernels the bound GEMM launches (:mod:`fp8select.kernels.triton_bound`'s) swapped for
    ``module``'s (None: this tree's)."""
    if module is None:
        return call

    def run():
        saved = {name: getattr(triton_bound, name) for name in KERNELS}
        for name in KERNELS:
            setattr(triton_bound, name, getattr(module, name))
        try:
            return call()
        finally:
            for name, kernel in saved.items():
                setattr(triton_bound, name, kernel)
    return run


def columns(n: int, k: int, weight, scale, x, layers, baseline, configs):
    """``{case: call}`` at one point: the Triton layer and configurations (and their baseline twins), vendors."""
    triton_calls = {"layer": functools.partial(layers["triton"][id(weight)], x)} if "triton" in layers else {}
    if (n, k) in CONFIG_SHAPES:
        triton_calls.update({name: functools.partial(
            triton_gemm.linear, x, weight, scale, (128, 128), out_dtype=torch.bfloat16,
            config=TritonConfig.from_dict({**_BASE, **configs[name]})) for name in configs})
    cols = dict(triton_calls)
    if baseline is not None:
        cols.update({f"base:{name}": with_kernels(baseline, call) for name, call in triton_calls.items()})
    cols.update({name: functools.partial(layers[name][id(weight)], x) for name in VENDORS if name in layers})
    return cols


def distill(reports: list[dict]) -> dict:
    """Several A/B reports of one tree as a distilled ``limits.py`` report for ``merge_tuning.py``: per
    point, the table's configuration (the ``layer`` column) and the fastest of :data:`CONFIGS`, each at
    its median over the reports."""
    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    rows = []
    for point in reports[0]["points"]:
        key = (point["n"], point["k"], point["m"])
        same = [p for r in reports for p in r["points"] if (p["n"], p["k"], p["m"]) == key]
        times = {name: median([p["us"][name] for p in same if name in p.get("us", {})]) for name in same[0]["us"]}
        tried = {name: us for name, us in times.items() if name in reports[0]["configs"]}
        if "layer" not in times or not tried:
            continue
        best = min(tried, key=tried.__getitem__)
        config = TritonConfig.from_dict({**_BASE, **reports[0]["configs"][best]}).to_dict()
        rows.append({"n": key[0], "k": key[1], "m": key[2], "table_us": times["layer"], "sweep_us": tried[best],
                     "sweep_config": config, "sweep_name": best, "reports": len(same)})
    return {"environment": reports[0]["env"], "source": "benchmarks/decode_ab.py --distill", "decode": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in bench.SHAPE_SETS["deepseek-v3"]))
    p.add_argument("--ms", default="1,2,4,8,16")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--baseline", help="a copy of triton_gemm_kernels.py to time against (absolute imports)")
    p.add_argument("--profile", action="store_true", help="one NVTX-marked launch per case, for ncu")
    p.add_argument("--replays", type=int, default=60)
    p.add_argument("--distill", nargs="+", metavar="REPORT", help="write --out from these A/B reports instead")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.distill:
        reports = [json.loads(Path(f).read_text()) for f in a.distill]
        Path(a.out).write_text(json.dumps(distill(reports), indent=1))
        return
    require_cuda("decode_ab")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    ms = [int(v) for v in a.ms.split(",")]
    configs = {name: CONFIGS[name] for name in a.configs.split(",") if name}
    baseline = load_kernels(a.baseline)
    sel = fp8select.resolve()
    by = {b.name: b for b in sel.chain}
    gen = torch.Generator(device="cuda").manual_seed(0)
    report: dict[str, Any] = {"env": bench.environment(), "args": vars(a), "configs": configs, "points": [], "errors": {}}
    for n, k in shapes:
        base, scale = bench.random_weight(n, k, "cuda", gen)
        weights = [base] if a.profile else bench.rotated(base)
        ref_of = bench.reference_for(base, scale, (128, 128))
        layers = {nm: {id(w): bench.single_backend(sel, by[nm]).prepare(w, scale) for w in weights}
                  for nm in ("triton", *VENDORS) if nm in by}
        floor = limits.weight_floor_us(n, k)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = ref_of(x)
            first = columns(n, k, base, scale, x, layers, baseline, configs)
            point = {"n": n, "k": k, "m": m, "floor_us": round(floor, 3),
                     "rel_err": {name: round(bench._rel_err(call(), ref), 6) for name, call in first.items()}}
            if a.profile:
                for call in first.values():
                    call()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_push("prof")
                    call()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_pop()
                point["cases"] = list(first)
            else:
                per_weight = [columns(n, k, w, scale, x, layers, baseline, configs) for w in weights]
                cols = {name: [c[name] for c in per_weight] for name in first}
                errors: dict[str, str] = {}
                times = timing.time_graphs(cols, a.replays, errors=errors)
                report["errors"].update({f"{n}x{k}@{m} {name}": e for name, e in errors.items()})
                point["us"] = {name: round(t.median_us, 3) for name, t in times.items()}
                point["of_floor"] = {name: round(floor / t.median_us, 4) for name, t in times.items()}
            report["points"].append(point)
            Path(a.out).write_text(json.dumps(report, indent=1))  # after every point: a cut run keeps its points


if __name__ == "__main__":
    main()
