"""The Triton MoE experts op's prefill structures side by side on a CUDA GPU with the ``wgmma`` kernels.

Usage (repository root): ``python -m benchmarks.moe_gate_up --out DIR [--budget-s S]``; writes
``DIR/moe_gate_up.json`` in the form results are kept in (a header key per line, then a point per line).

Per shape (DeepSeek-V3 with 8 and 32 local experts, Qwen3-235B-A22B, Qwen3-30B-A3B) and M (16 to 2048
tokens per expert and more), uniform routing, the whole op of :class:`fp8select.kernels.moe_triton.TritonExperts`
at ``plain128`` (the plain gate-up writing fp32, then silu*up quantized by its own kernel, on 128 x 128 tiles
of 8 warps), ``plain64`` (the same on 64 x 128 tiles of 4 warps), ``fused64`` and ``fused64/s3`` (the fused
``wgmma`` gate-up, silu*up quantized in its epilogue, 4 and 3 stages), ``fused64/n256`` (its down GEMM on
64 x 256 tiles of 8 warps), the persistent programs (``PERSISTENT`` 1, ``/p``: ``plain128/p``, ``plain64/n256/p``,
``fused64/p3`` and ``fused64/n256/p3``; the fused gate-up's at 3 stages, all its shared memory allows), with
DeepGEMM's contiguous layout and
CUTLASS's where installed (their rule's launch), each captured in a CUDA graph and replayed interleaved
(``fp8select.measure.timing``), weights rotated past the L2. Each point also says whether ``fused64``'s
output is ``plain64``'s bit for bit and the persistent columns of :data:`PERSISTENT_TWINS` their twins', and each
column's speed as a fraction of DeepGEMM contiguous's.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda, run_head
from benchmarks._stats import geomean
from benchmarks.distill_limits import json_lines
from benchmarks.moe import _columns, _launch, _routing, _weights
from fp8select.measured.moe import MOE_SHAPES

SHAPES = ("deepseek-v3-e8", "deepseek-v3-e32", "qwen3-235b-a22b", "qwen3-30b-a3b")
M_VALUES = (512, 1024, 2048, 4096, 8192)
VENDOR_COLUMNS = ("deepgemm/contiguous", "cutlass/offsets")


def configs() -> dict[str, Any]:
    from fp8select.kernels.moe_config import MoeTritonConfig

    plain64 = MoeTritonConfig(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                              FUSED_ACT=0, WGMMA=1)
    return {"plain128": dataclasses.replace(plain64, BLOCK_M=128, num_warps=8), "plain64": plain64,
            "fused64": dataclasses.replace(plain64, FUSED_ACT=1),
            "fused64/s3": dataclasses.replace(plain64, FUSED_ACT=1, num_stages=3),
            "fused64/n256": dataclasses.replace(plain64, FUSED_ACT=1, BLOCK_N=256),
            "plain128/p": dataclasses.replace(plain64, BLOCK_M=128, num_warps=8, PERSISTENT=1),
            "plain64/n256/p": dataclasses.replace(plain64, BLOCK_N=256, PERSISTENT=1),
            "fused64/p3": dataclasses.replace(plain64, FUSED_ACT=1, num_stages=3, PERSISTENT=1),
            "fused64/n256/p3": dataclasses.replace(plain64, FUSED_ACT=1, BLOCK_N=256, num_stages=3, PERSISTENT=1)}


PERSISTENT_TWINS = {"plain128/p": "plain128", "fused64/p3": "fused64/s3", "fused64/n256/p3": "fused64/n256"}
"""Each persistent column and the column of the same tiles launched one program per tile: the same sums in
the same order, so the same output bits (checked at every point); ``fused64/n256/p3`` runs one stage fewer
than its twin (which the bits do not depend on)."""


def points(selection: Any, name: str, ms: tuple[int, ...], deadline: float) -> tuple[list[dict[str, Any]], str]:
    import torch

    from fp8select.backends.moe import MoeProblem
    from fp8select.kernels.moe_triton import TritonExperts
    from fp8select.measure.timing import time_graphs
    from fp8select.measure.tune_moe import weight_copies

    e, h, i, k = MOE_SHAPES[name]
    sets = [_weights(e, h, i, seed=10 + c) for c in range(weight_copies(e, h, i, k))]
    ops = [TritonExperts(*w) for w in sets]
    problem = MoeProblem(e, h, i, k)
    pinned = [_columns(selection, problem, w, selection.capabilities, with_reference=False) for w in sets]
    structures = configs()
    rows: list[dict[str, Any]] = []
    for m in ms:
        if time.monotonic() > deadline:
            return rows, f"stopped at {name} M {m}: --budget-s spent"
        w, ids = _routing(m, k, e, "uniform", seed=m + 7)
        x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
        calls = {col: [functools.partial(op, x, w, ids, config) for op in ops] for col, config in structures.items()}
        for col in VENDOR_COLUMNS:
            if col in pinned[0]:
                launches = [_launch(p[col], dataclasses.replace(problem, m=m), m, selection.capabilities) for p in pinned]
                calls[col] = [functools.partial(run, x, w, ids) for run in launches]
        same = bool(torch.equal(ops[0](x, w, ids, structures["fused64"]), ops[0](x, w, ids, structures["plain64"])))
        persistent_same = all(torch.equal(ops[0](x, w, ids, structures[col]), ops[0](x, w, ids, structures[twin]))
                              for col, twin in PERSISTENT_TWINS.items())
        errors: dict[str, str] = {}
        times = {col: t.median_us for col, t in time_graphs(calls, replays=20, errors=errors).items()}
        row: dict[str, Any] = {"shape": name, "m": m, "tokens_per_expert": m * k // e, "fused_same_bits": same,
                               "persistent_same_bits": persistent_same, "us": {col: round(us, 1) for col, us in times.items()}}
        if "deepgemm/contiguous" in times:
            row["speed_vs_deepgemm"] = {col: round(times["deepgemm/contiguous"] / us, 3) for col, us in times.items()
                                        if col in structures}
        if errors:
            row["errors"] = {col: err[:300] for col, err in errors.items()}
        rows.append(row)
        print(row, flush=True)
    del ops, sets, pinned
    torch.cuda.empty_cache()
    return rows, ""


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``fused64``'s time over each plain structure's (geometric mean, least, most), whether its output was
    ``plain64``'s at every point, and per column the points at 1024 tokens or more where it reached 0.8 of
    DeepGEMM contiguous's speed."""
    out: dict[str, Any] = {"fused_same_bits": all(r["fused_same_bits"] for r in rows),
                           "persistent_same_bits": all(r.get("persistent_same_bits", False) for r in rows)}
    for col, twin in PERSISTENT_TWINS.items():
        ratios = [r["us"][col] / r["us"][twin] for r in rows if col in r["us"] and twin in r["us"]]
        if ratios:
            out[f"{col}_vs_{twin}"] = {"geomean": geomean(ratios), "min": round(min(ratios), 3),
                                       "max": round(max(ratios), 3)}
    for plain in ("plain64", "plain128"):
        ratios = [r["us"]["fused64"] / r["us"][plain] for r in rows if "fused64" in r["us"] and plain in r["us"]]
        if ratios:
            out[f"fused64_vs_{plain}"] = {"geomean": geomean(ratios), "min": round(min(ratios), 3),
                                          "max": round(max(ratios), 3)}
    large = [r for r in rows if r["m"] >= 1024 and "speed_vs_deepgemm" in r]
    out["at_least_0.8_of_deepgemm_from_m_1024"] = {
        col: f"{sum(r['speed_vs_deepgemm'].get(col, 0) >= 0.8 for r in large)} of {len(large)}" for col in configs()}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_gate_up", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for moe_gate_up.json")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop timing after this many seconds")
    args = parser.parse_args(argv)
    require_cuda("moe_gate_up")

    import fp8select

    start = time.monotonic()
    selection = fp8select.resolve(plugins=False)
    rows: list[dict[str, Any]] = []
    notes = []
    for name in SHAPES:
        found, note = points(selection, name, M_VALUES, start + args.budget_s)
        rows += found
        if note:
            notes.append(note)
            break
    head = run_head(selection, f"python -m benchmarks.moe_gate_up --out DIR --budget-s {args.budget_s:g}")
    head |= {"notes": notes, "summary": summary(rows), "seconds": round(time.monotonic() - start, 1)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "moe_gate_up.json").write_text(json_lines(head, {"points": rows}), encoding="utf-8")


if __name__ == "__main__":
    main()
