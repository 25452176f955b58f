"""The MoE experts op on a CUDA GPU: every backend's numerics, then its time per backend and layout, pinned and auto.

Usage (repository root): ``python -m benchmarks.moe --out DIR [--quick] [--shapes NAMES] [--m M,...] [--budget-s S]``;
writes ``DIR/moe.json``. ``--shapes`` (names of :data:`fp8select.measured.moe.MOE_SHAPES`, comma-separated) and ``--m``
replace the shapes and M values (``--quick``'s, or every one).
``--anatomy``: only where decode calls' GPU time goes, per column and kernel (``DIR/moe_anatomy.json``).
``--pdl``: only the Triton op at decode with and without programmatic dependent launch (``DIR/moe_pdl.json``, a
point per line: :func:`pdl_points`).

* **numerics**: each accepted MoE backend and layout (the reference included) on small M, uniform and
  skewed routing, all tokens on the same k experts, a third of the ids -1, and M 0 through the layer,
  against an fp64 reference computed here on the GPU from the semantics (docs/moe.md), and against the
  same with both GEMMs' outputs rounded to bf16 (DeepGEMM's); relative Frobenius error.
* **timing**: the whole experts op (routing, quantization, both grouped GEMMs, silu*up and its
  quantization, weighted sum) per backend/layout pinned (``backend.bind``) and the layer's own plan
  (``auto``), each captured in a CUDA graph and replayed interleaved (``fp8select.measure.timing``),
  over the DeepSeek-V3 per-rank shapes (8, 32, 256 local experts; H 7168, I 2048, k 8) and Qwen3-MoE
  (30B-A3B: E 128, H 2048, I 768; 235B-A22B: E 128, H 4096, I 1536), M 1-8192, routing uniform and
  skewed. Weights are rotated through enough copies that one call's expert weights exceed the 60 MB L2
  three times over. At decode (at most 64 tokens per expert) the time is also given as a fraction of the
  HBM floor of the expert weights read (the experts the routing touched, at 4.3 TB/s, FACTS.md).
* **summary**: per point the fastest pinned column and auto's ratio to it; geomean and worst.

Stops timing (and says so) when ``--budget-s`` runs out; what was measured is written either way. Each file is
written in the form results are kept in (``benchmarks/results/``): a header key per line (``moe.json``'s
numerics as each column's worst case), then a row per line.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda
from benchmarks._stats import geomean
from benchmarks.distill_limits import json_lines
from fp8select.measured.moe import MOE_SHAPES

SHAPES = MOE_SHAPES
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
QUICK_SHAPES = ("deepseek-v3-e32", "qwen3-30b-a3b")
QUICK_M = (1, 16, 64, 512, 4096)
HBM_BYTES_PER_S = 4.3e12
Weights = tuple[Any, Any, Any, Any]
"""``(w13, w13 scales, w2, w2 scales)``."""


def _weights(e: int, h: int, i: int, seed: int) -> Weights:
    import torch

    from fp8select.measure.tune_moe import random_experts

    return random_experts(e, h, i, "cuda", torch.Generator(device="cuda").manual_seed(seed))


def _routing(m: int, k: int, e: int, kind: str, seed: int) -> tuple[Any, Any]:
    import torch

    from fp8select.kernels.moe_routing import skewed_routing, uniform_routing

    draw = skewed_routing if kind == "skewed" else uniform_routing
    return draw(m, k, e, "cuda", torch.Generator(device="cuda").manual_seed(seed))


def _hbm_floor(ids: Any, h: int, i: int) -> tuple[int, float]:
    """The experts ``ids`` route to, and the microseconds their weights (``3 * H * I`` bytes each) take to
    stream at :data:`HBM_BYTES_PER_S`."""
    import torch

    used = int(torch.unique(ids).numel())
    return used, used * 3 * h * i / HBM_BYTES_PER_S * 1e6


def _quant64(v: Any) -> Any:
    """Per-row 1x128 quantization in fp64 (scale amax / 448), dequantized."""
    import torch

    m, k = v.shape
    groups = -(-k // 128)
    padded = torch.zeros((m, groups * 128), dtype=torch.float64, device=v.device)
    padded[:, :k] = v.double()
    blocks = padded.view(m, groups, 128)
    scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-10) / 448.0
    q = (blocks / scale).clamp(-448, 448).float().to(torch.float8_e4m3fn).double()
    return (q * scale).view(m, -1)[:, :k]


def _deq64(w: Any, s: Any) -> Any:
    n, k = w.shape
    return w.double() * s.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


def reference64(x: Any, w13: Any, s13: Any, w2: Any, s2: Any, weights: Any, ids: Any, gemm_out: Any = None) -> Any:
    """The semantics in fp64 on the GPU (a loop over the experts used); ``gemm_out`` rounds both GEMMs'
    outputs to that dtype (what a backend whose grouped GEMMs write bf16, DeepGEMM, computes)."""
    import torch

    inter = w13.shape[1] // 2
    a = _quant64(x)
    y = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    ids64 = ids.long()
    for e in torch.unique(ids64[ids64 >= 0]).tolist():
        tok, slot = torch.nonzero(ids64 == e, as_tuple=True)
        hid = a[tok] @ _deq64(w13[e], s13[e]).t()
        if gemm_out is not None:
            hid = hid.to(gemm_out).double()
        act = _quant64(torch.nn.functional.silu(hid[:, :inter]) * hid[:, inter:])
        out = act @ _deq64(w2[e], s2[e]).t()
        if gemm_out is not None:
            out = out.to(gemm_out).double()
        y.index_add_(0, tok, out * weights[tok, slot].double().unsqueeze(1))
    return y


def _rel(out: Any, ref: Any) -> float:
    import torch

    diff = out.double() - ref
    if not bool(torch.isfinite(diff).all()):
        return math.inf
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def _columns(selection: Any, problem: Any, weights: Weights, caps: Any, *, with_reference: bool) -> dict[str, Any]:
    """Each accepted backend/layout's launch on these weights, pinned (name ``backend/layout``)."""
    from fp8select.backends.moe import MoeWeights
    from fp8select.moe_select import moe_chain

    out: dict[str, Any] = {}
    for backend in moe_chain(selection):
        if backend.name == "reference" and not with_reference:
            continue
        for layout in backend.layouts:
            if not backend.supports(problem, caps, layout).ok:
                continue
            prepared = backend.prepare(MoeWeights(*weights, (128, 128)), caps)
            out[f"{backend.name}/{layout}"] = (backend, prepared, layout)
    return out


def _layer_and_columns(selection: Any, shape: tuple[int, int, int, int], *, seed: int,
                       with_reference: bool) -> tuple[Weights, Any, dict[str, Any], Any]:
    """Random experts of ``shape``: ``(weights, problem, pinned columns, the layer prepare_moe plans)``."""
    from fp8select.backends.moe import MoeProblem

    e, h, i, k = shape
    weights = _weights(e, h, i, seed=seed)
    problem = MoeProblem(e, h, i, k)
    columns = _columns(selection, problem, weights, selection.capabilities, with_reference=with_reference)
    return weights, problem, columns, selection.prepare_moe(*weights, top_k=k)


def _launch(column: Any, problem: Any, m: int, caps: Any) -> Any:
    backend, prepared, layout = column
    return backend.bind(prepared, layout, backend.default_config(problem, layout, m), caps)


def numerics(selection: Any, name: str, shape: tuple[int, int, int, int]) -> list[dict[str, Any]]:
    import dataclasses

    import torch

    e, h, _, k = shape
    caps = selection.capabilities
    weights, problem, columns, layer = _layer_and_columns(selection, shape, seed=1, with_reference=True)
    rows: list[dict[str, Any]] = []
    cases = [(m, kind) for m in (1, 16, 256) for kind in ("uniform", "skewed")] + [(64, "one-expert"), (64, "minus-one")]
    for m, kind in cases:
        w, ids = _routing(m, k, e, "skewed" if kind == "skewed" else "uniform", seed=m)
        if kind == "one-expert":
            ids = torch.arange(k, device="cuda", dtype=torch.int32).expand(m, k).contiguous()
        if kind == "minus-one":
            ids = torch.where(torch.rand(ids.shape, device="cuda") < 1 / 3, -1, ids)
        x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
        ref = reference64(x, *weights, w, ids)
        ref_bf16 = reference64(x, *weights, w, ids, gemm_out=torch.bfloat16)
        for col, column in {**columns, "auto": None}.items():
            try:
                run = layer if column is None else _launch(column, dataclasses.replace(problem, m=m), m, caps)
                y = run(x, w, ids)
                rows.append({"shape": name, "m": m, "routing": kind, "column": col, "rel_err": _rel(y, ref),
                             "rel_err_vs_bf16_gemm_outputs": _rel(y, ref_bf16)})
            except Exception as exc:  # noqa: BLE001 - a tool: record and go on
                rows.append({"shape": name, "m": m, "routing": kind, "column": col, "error": repr(exc)[:300]})
    empty = layer(torch.empty(0, h, device="cuda", dtype=torch.bfloat16), torch.empty(0, k, device="cuda"),
                  torch.empty(0, k, device="cuda", dtype=torch.int32))
    rows.append({"shape": name, "m": 0, "routing": "empty", "column": "auto", "ok": tuple(empty.shape) == (0, h)})
    del columns, layer, weights
    torch.cuda.empty_cache()
    return rows


def timing(selection: Any, name: str, shape: tuple[int, int, int, int], ms: tuple[int, ...], deadline: float,
           ) -> tuple[list[dict[str, Any]], str]:
    import dataclasses

    import torch

    from fp8select.backends.moe import MoeProblem
    from fp8select.measure.timing import time_graphs
    from fp8select.measure.tune_moe import MAX_MASKED_BYTES, weight_copies

    e, h, i, k = shape
    caps = selection.capabilities
    sets = [_weights(e, h, i, seed=10 + c) for c in range(weight_copies(e, h, i, k))]
    problem = MoeProblem(e, h, i, k)
    pinned = [_columns(selection, problem, w, caps, with_reference=False) for w in sets]
    layers = [selection.prepare_moe(*w, top_k=k) for w in sets]
    rows: list[dict[str, Any]] = []
    for m in ms:
        for kind in ("uniform", "skewed"):
            if time.monotonic() > deadline:
                return rows, f"stopped at {name} M {m}: --budget-s spent"
            w, ids = _routing(m, k, e, kind, seed=m + 7)
            x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
            calls: dict[str, list[Any]] = {"auto": [functools.partial(layer, x, w, ids) for layer in layers]}
            for col in pinned[0]:
                if col.endswith("/masked") and e * m * (3 * h + 5 * i) > MAX_MASKED_BYTES:
                    continue  # E x M rows: the layout is for decode (the rule stops at M 64)
                launches = [_launch(p[col], dataclasses.replace(problem, m=m), m, caps) for p in pinned]
                calls[col] = [functools.partial(run, x, w, ids) for run in launches]
            errors: dict[str, str] = {}
            times = time_graphs(calls, replays=20, errors=errors)
            used, floor_us = _hbm_floor(ids, h, i)
            decode = m * k / e <= 64
            for col, t in times.items():
                row = {"shape": name, "m": m, "routing": kind, "column": col, **t.to_dict(),
                       "experts_read": used, "hbm_floor_us": round(floor_us, 3)}
                if decode:
                    row["hbm_fraction"] = round(floor_us / t.median_us, 4)
                rows.append(row)
            rows.extend({"shape": name, "m": m, "routing": kind, "column": col, "error": err[:300]}
                        for col, err in errors.items())
    del pinned, layers, sets
    torch.cuda.empty_cache()
    return rows, ""


ANATOMY_SHAPE = "deepseek-v3-e32"
ANATOMY_M = (1, 16, 64)


def anatomy(selection: Any, name: str, shape: tuple[int, int, int, int], ms: tuple[int, ...]) -> list[dict[str, Any]]:
    """Where a decode call's GPU time goes: each column's kernels (torch profiler, eager calls after a
    warm-up), GPU microseconds per call summed by kernel name, the largest first, next to the HBM floor."""
    import dataclasses

    import torch
    from torch.profiler import ProfilerActivity, profile

    e, h, i, k = shape
    caps = selection.capabilities
    _, problem, columns, layer = _layer_and_columns(selection, shape, seed=3, with_reference=False)
    rows: list[dict[str, Any]] = []
    calls = 5
    for m in ms:
        w, ids = _routing(m, k, e, "uniform", seed=m)
        x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
        _, floor_us = _hbm_floor(ids, h, i)
        for col, column in {"auto": None, **columns}.items():
            run = layer if column is None else _launch(column, dataclasses.replace(problem, m=m), m, caps)
            for _ in range(3):
                run(x, w, ids)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    run(x, w, ids)
                torch.cuda.synchronize()
            kernels: dict[str, list[float]] = {}
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    entry = kernels.setdefault(ev.name[:90], [0.0, 0])
                    entry[0] += ev.device_time / calls
                    entry[1] += 1
            ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
            rows.append({"shape": name, "m": m, "column": col, "hbm_floor_us": round(floor_us, 1),
                         "gpu_us": round(sum(v[0] for v in kernels.values()), 1),
                         "launches": sum(v[1] for v in kernels.values()) // calls,
                         "kernels": [[n, round(v[0], 1), v[1] // calls] for n, v in ranked[:10]]})
            print(json.dumps(rows[-1])[:600], flush=True)
    return rows


PDL_M = (1, 4, 16)
PDL_PREFETCH = (0, 2, 4, 8)


def pdl_ab(name: str, shape: tuple[int, int, int, int], ms: tuple[int, ...] = PDL_M) -> list[dict[str, Any]]:
    """The Triton experts op at decode, the rule's configuration and the fused gate-up on its tile with one
    stage fewer (what the H200 table runs at most decode rows it gives Triton), launched without
    programmatic dependent launch (``off``) and with it, each GEMM asking L2 for its first 0, 2, 4 or 8 K
    steps of weight before its wait (``pdl/prefetch N``): CUDA graphs replayed interleaved, weights rotated
    past the L2, uniform and skewed routing, each time also as a fraction of the HBM floor of the experts
    read. Each column's output is compared bit for bit with ``off``'s."""
    import dataclasses

    import torch

    from fp8select.kernels.moe_config import default_config
    from fp8select.kernels.moe_triton import TritonExperts
    from fp8select.measure.timing import time_graphs
    from fp8select.measure.tune_moe import weight_copies

    e, h, i, k = shape
    sets = [_weights(e, h, i, seed=10 + c) for c in range(weight_copies(e, h, i, k))]
    columns = {"off": [TritonExperts(*w, pdl=False) for w in sets],
               **{f"pdl/prefetch {n}": [TritonExperts(*w, prefetch_k=n) for w in sets] for n in PDL_PREFETCH}}
    rows: list[dict[str, Any]] = []
    for m in ms:
        rule = default_config(m, k, e)
        for config in (rule, dataclasses.replace(rule, FUSED_ACT=1, num_stages=3)):
            for kind in ("uniform", "skewed"):
                w, ids = _routing(m, k, e, kind, seed=m + 7)
                x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
                first = {col: ops[0](x, w, ids, config) for col, ops in columns.items()}
                calls = {col: [functools.partial(op, x, w, ids, config) for op in ops] for col, ops in columns.items()}
                times = time_graphs(calls, replays=20)
                _, floor_us = _hbm_floor(ids, h, i)
                for col, t in times.items():
                    rows.append({"shape": name, "m": m, "routing": kind, "config": config.describe(), "column": col,
                                 **t.to_dict(), "vs_off": round(t.median_us / times["off"].median_us, 4),
                                 "hbm_fraction": round(floor_us / t.median_us, 4),
                                 "same_bits": bool(torch.equal(first[col], first["off"]))})
                print(json.dumps(rows[-1]), flush=True)
    del columns, sets
    torch.cuda.empty_cache()
    return rows


def pdl_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`pdl_ab`'s rows as kept, a line per point (shape, M, routing, configuration): ``off``'s median
    time, each PDL column's time over it, each column's fraction of the HBM floor, whether every output
    was ``off``'s bit for bit."""
    points: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    for r in rows:
        point = points.setdefault((r["shape"], r["m"], r["routing"], r["config"]), {
            "shape": r["shape"], "m": r["m"], "routing": r["routing"], "config": r["config"], "off_us": None,
            "vs_off": {}, "hbm_fraction": {}, "same_bits": True})
        if r["column"] == "off":
            point["off_us"] = r["median_us"]
        else:
            point["vs_off"][r["column"]] = r["vs_off"]
        point["hbm_fraction"][r["column"]] = r["hbm_fraction"]
        point["same_bits"] = point["same_bits"] and r["same_bits"]
    return list(points.values())


def pdl_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per PDL column, shape and gate-up structure (plain or fused), its time over ``off``'s: geometric mean,
    least and most over the points; and whether every output was ``off``'s bit for bit."""
    ratios: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if r["column"] != "off":
            structure = "plain" if " plain" in r["config"] else "fused"
            ratios.setdefault(r["column"], {}).setdefault(f"{r['shape']} {structure}", []).append(r["vs_off"])
    return {"same_bits": all(r["same_bits"] for r in rows),
            **{col: {shape: {"geomean_vs_off": geomean(vs),
                             "min": min(vs), "max": max(vs)} for shape, vs in by_shape.items()}
               for col, by_shape in ratios.items()}}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per point the fastest pinned column and auto's ratio to it; geomean and worst of the ratios."""
    points: dict[tuple[str, int, str], dict[str, float]] = {}
    for r in rows:
        if "median_us" in r:
            points.setdefault((r["shape"], r["m"], r["routing"]), {})[r["column"]] = r["median_us"]
    ratios, best = [], []
    for (shape, m, kind), cols in sorted(points.items()):
        pinned = {c: us for c, us in cols.items() if c != "auto"}
        if not pinned or "auto" not in cols:
            continue
        fastest = min(pinned, key=pinned.__getitem__)
        ratio = cols["auto"] / pinned[fastest]
        ratios.append(ratio)
        best.append({"shape": shape, "m": m, "routing": kind, "fastest": fastest, "auto_ratio": round(ratio, 4)})
    return {"auto_vs_fastest_geomean": geomean(ratios) if ratios else None,
            "auto_vs_fastest_worst": round(max(ratios), 4) if ratios else None, "points": best}


def numerics_worst(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per column, the largest relative errors over the numerics cases it ran, and how many it ran (a case that
    raised is counted in ``errors``)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["m"] == 0:
            continue
        worst = out.setdefault(r["column"], {"rel_err": 0.0, "rel_err_vs_bf16_gemm_outputs": 0.0, "cases": 0})
        if "error" in r:
            worst["errors"] = worst.get("errors", 0) + 1
            continue
        for key in ("rel_err", "rel_err_vs_bf16_gemm_outputs"):
            worst[key] = max(worst[key], float(f"{r[key]:.3g}"))
        worst["cases"] += 1
    return out


def kept(report: dict[str, Any]) -> str:
    """``moe.json`` as results are kept: the header (numerics as each column's worst, whether M 0 held),
    then a timing per line."""
    head = {k: report[k] for k in ("device", "torch", "triton", "packages", "command", "moe_plans", "notes")}
    head["numerics_worst"] = numerics_worst(report["numerics"])
    head["m0_ok"] = all(r["ok"] for r in report["numerics"] if r["m"] == 0)
    return json_lines({**head, "summary": report["summary"], "seconds": report["seconds"]}, {"timing": report["timing"]})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for moe.json")
    parser.add_argument("--quick", action="store_true", help=f"shapes {QUICK_SHAPES}, M {QUICK_M}")
    parser.add_argument("--shapes", help="MoE shape names, comma-separated (default: all, or --quick's)")
    parser.add_argument("--m", help="M values, comma-separated (default: 1-8192, or --quick's)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop timing after this many seconds")
    parser.add_argument("--anatomy", action="store_true",
                        help=f"only each column's kernels at {ANATOMY_SHAPE}, M {ANATOMY_M} (moe_anatomy.json)")
    parser.add_argument("--pdl", action="store_true",
                        help=f"only the Triton op with and without PDL at {QUICK_SHAPES}, M {PDL_M} (moe_pdl.json)")
    args = parser.parse_args(argv)
    from fp8select.errors import Fp8SelectError
    from fp8select.measure import bench

    names = args.shapes.split(",") if args.shapes else QUICK_SHAPES if args.quick else tuple(SHAPES)
    if unknown := [n for n in names if n not in SHAPES]:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    shapes = {n: SHAPES[n] for n in names}
    try:
        ms = tuple(bench.parse_ms(args.m)) if args.m else QUICK_M if args.quick else M_VALUES
    except Fp8SelectError as exc:
        parser.error(str(exc))
    require_cuda("moe")
    import torch
    import triton

    import fp8select

    start = time.monotonic()
    selection = fp8select.resolve(plugins=False)
    command = " ".join(["python -m benchmarks.moe --out DIR", *(["--quick"] if args.quick else []),
                        *([f"--shapes {args.shapes}"] if args.shapes else []), *([f"--m {args.m}"] if args.m else []),
                        *(["--anatomy"] if args.anatomy else []), *(["--pdl"] if args.pdl else []),
                        *([f"--budget-s {args.budget_s:g}"] if not (args.anatomy or args.pdl) else [])])
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "triton": triton.__version__, "packages": dict(selection.capabilities.packages),
                              "command": command, "moe_plans": {}, "numerics": [], "timing": [], "notes": []}
    head = {k: report[k] for k in ("device", "torch", "triton", "packages", "command")}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.anatomy:  # the form results are kept in: the header, then a row per line
        rows = anatomy(selection, ANATOMY_SHAPE, SHAPES[ANATOMY_SHAPE], ANATOMY_M)
        (Path(args.out) / "moe_anatomy.json").write_text(json_lines(head, {"anatomy": rows}), encoding="utf-8")
        return
    if args.pdl:
        rows = [row for name in QUICK_SHAPES for row in pdl_ab(name, SHAPES[name])]
        head["hbm_fraction"] = f"of the floor at {HBM_BYTES_PER_S / 1e12:.1f} TB/s, the H200's copy rate, on every device"
        (Path(args.out) / "moe_pdl.json").write_text(
            json_lines({**head, "summary": pdl_summary(rows)}, {"pdl": pdl_points(rows)}), encoding="utf-8")
        return
    for name, shape in shapes.items():
        report["moe_plans"][name] = selection.moe_plan_for(*shape).describe()
    for name in ("deepseek-v3-e8", "qwen3-30b-a3b"):
        if name in shapes:
            report["numerics"] += numerics(selection, name, SHAPES[name])
    deadline = start + args.budget_s
    for name, shape in shapes.items():
        rows, note = timing(selection, name, shape, ms, deadline)
        report["timing"] += rows
        if note:
            report["notes"].append(note)
            break
    report["summary"] = summarize(report["timing"])
    report["seconds"] = round(time.monotonic() - start, 1)
    out = Path(args.out)
    (out / "moe.json").write_text(kept(report), encoding="utf-8")
    worst = max((r.get("rel_err", 0.0) for r in report["numerics"]), default=0.0)
    print(f"moe: {len(report['timing'])} timings, worst numerics {worst:.2e}, auto vs fastest "
          f"{report['summary']['auto_vs_fastest_geomean']} geomean; {out / 'moe.json'}")


if __name__ == "__main__":
    main()
