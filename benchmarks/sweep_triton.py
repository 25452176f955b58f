#!/usr/bin/env python3
"""Sweep launch configurations and paths of the Triton block-FP8 linear on a GPU; write the results as JSON.

Run on the target GPU (H200) from the repository root::

    python -m benchmarks.sweep_triton --out $OUT/sweep.json [--shapes deepseek-v3]
        [--m 1,8,16,64,128,512,2048,8192] [--budget-s 400] [--max-candidates 12]
        [--paths gemm,fused,decode,swap] [--quick]

A kernel engineer's tool: ``python -m fp8select tune`` measures the configurations the library
uses (into the tuning table); this sweep shows, per (N, K, M), the best configuration of every
path next to cuBLAS and bf16, with on-device bitwise checks, and writes nothing the library reads.

For each (N, K) and M bucket it runs :func:`fp8select.kernels.triton_search.search` (the same
search the ``tune`` command uses): every configuration names its path (``gemm``: quantization kernel +
GEMM; ``fused``: GEMM quantizing in its K loop; ``decode``: swap-AB GEMM quantizing in its K
loop, one launch; ``swap``: quantization kernel + swap-AB GEMM), its split-K summation
(``FIXUP``: in-kernel by the last split, or a second kernel) and optionally ``TMA`` tile loads
(shown as ``sk<n>f`` and ``tma`` in the log), and is timed as the WHOLE
linear (bf16 in, quantization included, bf16 out) through ``triton_gemm.linear``, after a check
against an fp32 dequantized reference (relative Frobenius error < 1e-2, output poisoned
first); timings use CUDA-graph replay (median of >= 50 replays, weights rotated through
enough copies to exceed twice the L2). For the fused paths the output is also compared bit
for bit with the same config run on the separately quantized activation (``bitwise_vs_prequant``:
proof on the GPU that the in-kernel quantization equals the quantization kernel's). The best
gemm-path config is also timed on its own on the pre-quantized activation (``gemm_alone``,
comparable with run 1's per-GEMM numbers).

Competitors timed in the same run: cuBLAS block-wise ``torch.nn.functional.scaled_mm``
(1x128 activation scales M-major, 128x128 weight scales as the checkpoint's ``.t()``; M it
rejects is retried padded to a multiple of 16 and reported separately; GEMM only, no
quantization) and bf16 ``torch.matmul`` on the dequantized weight.

``--device cpu`` runs the same driver on tiny shapes under ``TRITON_INTERPRET=1`` (wall-clock
timing, no graphs) to smoke-test it without a GPU; its numbers mean nothing.

The JSON holds the device, versions and per-(N, K, M) results: every configuration tried
(``TritonConfig.to_dict()`` form) with its time or error, the fastest per path, the best
overall, the competitors. It is rewritten after every (shape, M) so a run cut short still
leaves its results. The run stops within
``--budget-s`` (measured from process start), sharing the time fairly between the remaining
units.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda

_T0 = time.monotonic()

DEFAULT_M: tuple[int, ...] = (1, 8, 16, 64, 128, 512, 2048, 8192)
QUICK_SHAPES: list[tuple[int, int]] = [(7168, 2048), (2112, 7168)]
QUICK_M: tuple[int, ...] = (1, 16, 512)
BLOCK_K = 128
RESERVE_S = 10.0  # kept back from the budget for the final write and teardown


# ---------------------------------------------------------------------------------------------
# Pure helpers (no CUDA): parsing. Candidate configs and the search live in
# fp8select.kernels.triton_search (shared with the tune command), the shape set and CUDA-graph
# timing in fp8select.measure.timing, roofline figures in fp8select.roofline.
# ---------------------------------------------------------------------------------------------


def _fp8select(module: str) -> Any:
    """``fp8select.<module>``, imported at first use (the parsers run without torch)."""
    return importlib.import_module(f"fp8select.{module}")


def _search_module() -> Any:
    return _fp8select("kernels.triton_search")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``deepseek-v3`` or a list of ``NxK`` / ``N,K`` pairs separated by commas or spaces."""
    if text.strip().lower() in ("deepseek-v3", "deepseek_v3", "dsv3"):
        return list(_fp8select("measure.bench").SHAPE_SETS["deepseek-v3"])
    numbers = [int(tok) for tok in text.replace("x", ",").replace(";", ",").replace(" ", ",").split(",") if tok]
    if not numbers or len(numbers) % 2:
        raise ValueError(f"--shapes wants 'deepseek-v3' or N,K pairs, got {text!r}")
    return list(zip(numbers[::2], numbers[1::2], strict=True))


def parse_m_list(text: str) -> list[int]:
    """Comma-separated positive M values."""
    values = [int(tok) for tok in text.split(",") if tok.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"--m wants positive integers, got {text!r}")
    return values


def parse_paths(text: str) -> list[str]:
    """Comma-separated subset of the linear paths (``all`` for every path)."""
    paths = _fp8select("kernels.triton_config").PATHS
    if text.strip().lower() == "all":
        return list(paths)
    chosen = [tok.strip() for tok in text.split(",") if tok.strip()]
    unknown = [p for p in chosen if p not in paths]
    if not chosen or unknown:
        raise ValueError(f"--paths wants a subset of {paths}, got {text!r}")
    return chosen


def _describe(config: dict[str, Any]) -> str:
    return str(_fp8select("kernels.triton_config").TritonConfig.from_dict(config).describe())


def _log(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Device side
# ---------------------------------------------------------------------------------------------


class Budget:
    """Wall-clock budget from process start, shared fairly between the remaining units."""

    def __init__(self, total_s: float) -> None:
        self.deadline = _T0 + total_s - RESERVE_S

    def left(self) -> float:
        """Seconds until the deadline (negative once past it)."""
        return self.deadline - time.monotonic()

    def unit_deadline(self, units_left: int) -> float:
        """Deadline for the next unit: an equal share of what is left."""
        return time.monotonic() + max(0.0, self.left()) / max(1, units_left)


class Sweeper:
    """Runs the search on one device; holds what every unit needs.

    ``device`` is ``cuda`` for real runs; ``cpu`` (under ``TRITON_INTERPRET=1``, wall-clock
    timing instead of CUDA graphs) exists only to smoke-test this driver without a GPU.
    """

    def __init__(self, args: argparse.Namespace, device: Any, sms: int, l2_bytes: int) -> None:
        import torch
        import torch.nn.functional as F

        from fp8select import roofline
        from fp8select.backends.reference import dequantize_activation, dequantize_weight
        from fp8select.kernels import triton_gemm, triton_search
        from fp8select.kernels.quant import M_MAJOR, quantize_per_token_group
        from fp8select.kernels.triton_config import TritonConfig
        from fp8select.kernels.triton_quant import quantize_per_token_group_triton
        from fp8select.measure import bench, timing

        self.torch = torch
        self.F = F
        self.args = args
        self.dev = device
        self.cuda = device.type == "cuda"
        self.sms = sms
        self.l2_bytes = l2_bytes
        self.budget = Budget(args.budget_s)
        self.bench = bench
        self.timing = timing
        self.roofline = roofline
        self.dequantize_weight = dequantize_weight
        self.dequantize_activation = dequantize_activation
        self.tg = triton_gemm
        self.search_mod = triton_search
        self.config_type = TritonConfig
        self.paths = parse_paths(args.paths)
        self.quant = quantize_per_token_group
        self.quant_triton = quantize_per_token_group_triton
        self.m_major = M_MAJOR
        self.scaling = getattr(F, "ScalingType", None) or getattr(F, "_ScalingType", None)

    # -- primitives ------------------------------------------------------------------------

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time_calls(self, calls: Sequence[Callable[[], object]]) -> dict[str, float]:
        """Per-call microseconds: median/min/max over ``replays`` replays of all ``calls``.

        On CUDA :func:`fp8select.measure.timing.time_graph` (one warm-up on a side stream, which also
        compiles every kernel, then the calls captured once into a graph, each replay timed
        with events); on the CPU smoke test, wall-clock time.
        """
        replays = self.args.replays
        if not self.cuda:
            for call in calls:
                call()
            per_call = []
            for _ in range(replays):
                t0 = time.perf_counter()
                for call in calls:
                    call()
                per_call.append((time.perf_counter() - t0) * 1e6 / len(calls))
            timing = self.timing.Timing(statistics.median(per_call), min(per_call), max(per_call))
        else:
            timing = self.timing.time_graph(calls, replays, warmups=1)
        return {
            "median_us": round(timing.median_us, 2),
            "min_us": round(timing.min_us, 2),
            "max_us": round(timing.max_us, 2),
            "calls_per_replay": len(calls),
            "replays": replays,
        }

    def rel_err(self, out: Any, ref: Any) -> float:
        """Relative Frobenius error of ``out`` against the fp32 reference."""
        return float((out.float() - ref).norm() / ref.norm())

    def poisoned(self, call: Callable[[], Any], m: int, n: int, split: int) -> Any:
        """Run ``call`` right after freeing NaN-filled blocks of its output (and workspace) size.

        The caching allocator hands those blocks to the kernel's ``torch.empty`` outputs, so
        a kernel that skips part of its output shows up as NaN instead of stale results.
        """
        torch = self.torch
        junk = [torch.full((m, n), float("nan"), device=self.dev, dtype=torch.bfloat16)]
        if split > 1:
            junk.append(torch.full((split, m, n), float("nan"), device=self.dev, dtype=torch.float32))
        del junk
        return call()

    # -- one (N, K, M) ---------------------------------------------------------------------

    def sweep_unit(self, n: int, k: int, m: int, unit_end: float) -> dict[str, Any]:
        """Search paths and configs for one (N, K, M) on the whole op, time the competitors."""
        torch = self.torch
        dev = self.dev
        g_k = math.ceil(k / BLOCK_K)
        copies = self.bench.rotation_copies(n * k + m * k * 2, self.l2_bytes, l2_passes=2)
        if not self.cuda:
            copies = min(copies, 2)
        base_w = (torch.randn(n, k, device=dev) * 64).clamp(-440, 440).to(torch.float8_e4m3fn)
        base_ws = torch.rand(math.ceil(n / 128), g_k, device=dev) * 1e-2 + 1e-3
        w_list = [base_w] + [base_w.clone() for _ in range(copies - 1)]
        ws_list = [base_ws.clone() for _ in range(copies)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        xq, xs = self.quant_triton(x)
        w_deq = self.dequantize_weight(base_w, base_ws, (128, 128))
        ref = self.dequantize_activation(xq, xs, 128) @ w_deq.t()
        del w_deq
        ctx = _Unit(n=n, k=k, m=m, x=x, xq=xq, xs=xs, w_list=w_list, ws_list=ws_list, ref=ref)

        records: list[dict[str, Any]] = []

        def time_config(cfg: Any) -> float | None:
            rec = self.try_config(ctx, cfg)
            records.append(rec)
            status = f"{rec['median_us']:.1f} us" if "median_us" in rec else rec.get("error", "?")
            _log(f"  {cfg.describe()}: {status}")
            return rec.get("median_us")

        deadline = min(unit_end, self.budget.deadline)
        best_cfg, _, _ = self.search_mod.search(
            n, k, m, time_config, sms=self.sms, max_configs=self.args.max_candidates, deadline=deadline,
            paths=self.paths,
        )
        timed = [r for r in records if "median_us" in r]
        paths: dict[str, Any] = {}
        for rec in sorted(timed, key=lambda r: r["median_us"]):
            paths.setdefault(rec["config"]["path"], rec)
        best = next((r for r in timed if best_cfg is not None and r["config"] == best_cfg.to_dict()), None)
        res: dict[str, Any] = {
            "n": n, "k": k, "m": m, "best": best, "paths": paths, "candidates": records, "weight_copies": len(w_list),
        }
        if best:
            self.annotate(res, n, k, m)
        gemm_best = paths.get("gemm")
        if gemm_best and self.budget.left() > 0:
            res["gemm_alone"] = self.time_gemm_alone(ctx, self.config_type.from_dict(gemm_best["config"]))
        if not self.args.no_competitors and self.budget.left() > 0:
            res["cublas"] = self.time_cublas(ctx)
            res["bf16"] = self.time_bf16(ctx, base_w, base_ws)
        return res

    def try_config(self, ctx: _Unit, cfg: Any) -> dict[str, Any]:
        """Check one whole-op configuration against the reference, then time it; errors become data."""
        torch = self.torch
        tg = self.tg
        record: dict[str, Any] = {"config": cfg.to_dict()}
        t0 = time.monotonic()

        def run(i: int) -> Any:
            return tg.linear(ctx.x, ctx.w_list[i], ctx.ws_list[i], (128, 128), out_dtype=torch.bfloat16, config=cfg)

        try:
            out = self.poisoned(lambda: run(0), ctx.m, ctx.n, cfg.SPLIT_K)
            self.sync()
            record["first_call_s"] = round(time.monotonic() - t0, 2)
            err = self.rel_err(out, ctx.ref)
            record["rel_err"] = err
            if cfg.quantizes_in_kernel:
                # Same kernel and config on the quantization kernel's output: equal bits prove
                # the in-kernel quantization matches it on this device.
                pre = tg.w8a8_block_gemm(
                    ctx.xq, ctx.xs, ctx.w_list[0], ctx.ws_list[0], (128, 128), out_dtype=torch.bfloat16, config=cfg
                )
                record["bitwise_vs_prequant"] = bool(torch.equal(out, pre))
            if not math.isfinite(err) or err >= self.bench.REL_ERR_MAX:
                record["error"] = f"wrong result: relative error {err:.3g} >= {self.bench.REL_ERR_MAX}"
            else:
                record.update(self.time_calls([functools.partial(run, i) for i in range(len(ctx.w_list))]))
        except Exception as exc:  # noqa: BLE001 - a failing candidate is data, not a crash
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        record["cost_s"] = round(time.monotonic() - t0, 2)
        return record

    def annotate(self, res: dict[str, Any], n: int, k: int, m: int) -> None:
        """Throughput of the best whole-op config against the H200 ceilings."""
        us = res["best"]["median_us"]
        res["tflops"] = round(2 * m * n * k / us / 1e6, 1)
        hbm_bytes_per_s = self.roofline.HBM_BYTES_PER_S
        res["weight_hbm_frac"] = round(n * k / (us * 1e-6) / hbm_bytes_per_s, 3)
        res["min_bytes_hbm_frac"] = round(self.roofline.min_bytes(n, k, m) / (us * 1e-6) / hbm_bytes_per_s, 3)

    def time_gemm_alone(self, ctx: _Unit, cfg: Any) -> dict[str, Any]:
        """The gemm path's GEMM on the pre-quantized activation (no quantization launch)."""
        torch = self.torch

        def gemm(i: int) -> Any:
            return self.tg.w8a8_block_gemm(
                ctx.xq, ctx.xs, ctx.w_list[i], ctx.ws_list[i], (128, 128), out_dtype=torch.bfloat16, config=cfg
            )

        try:
            return self.time_calls([functools.partial(gemm, i) for i in range(len(ctx.w_list))])
        except Exception as exc:  # noqa: BLE001
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}

    def time_cublas(self, ctx: _Unit) -> dict[str, Any]:
        """cuBLAS block-wise ``scaled_mm`` at M, and at M padded to a multiple of 16 if rejected."""
        torch = self.torch
        F = self.F
        scaling = self.scaling
        if scaling is None or not hasattr(F, "scaled_mm"):
            return {"error": "torch.nn.functional.scaled_mm / ScalingType not available"}
        pad_k = (-math.ceil(ctx.k / BLOCK_K)) % 4  # weight scale padded to a multiple of 4 K blocks
        ws_pad = [F.pad(ws, (0, pad_k)) if pad_k else ws for ws in ctx.ws_list]

        def attempt(rows: int) -> dict[str, Any]:
            try:
                xp = ctx.x if rows == ctx.m else F.pad(ctx.x, (0, 0, 0, rows - ctx.m))
                aq, a_scale = self.quant(xp, layout=self.m_major)

                def call(i: int) -> Any:
                    return F.scaled_mm(
                        aq,
                        ctx.w_list[i].t(),
                        a_scale,
                        scaling.BlockWise1x128,
                        ws_pad[i].t(),
                        scaling.BlockWise128x128,
                        output_dtype=torch.bfloat16,
                    )

                res = call(0)
                self.sync()
                rec: dict[str, Any] = {"rows": rows, "rel_err": self.rel_err(res[: ctx.m], ctx.ref)}
                rec.update(self.time_calls([functools.partial(call, i) for i in range(len(ctx.w_list))]))
                return rec
            except Exception as exc:  # noqa: BLE001 - record what cuBLAS rejects
                return {"rows": rows, "error": f"{type(exc).__name__}: {exc}"[:300]}

        out = {"exact": attempt(ctx.m)}
        if "error" in out["exact"] and ctx.m % 16:
            out["padded"] = attempt(max(16, math.ceil(ctx.m / 16) * 16))
        return out

    def time_bf16(self, ctx: _Unit, w: Any, ws: Any) -> dict[str, Any]:
        """bf16 ``torch.matmul`` on the dequantized weight, copies rotated like the fp8 ones."""
        torch = self.torch
        n, k, m = ctx.n, ctx.k, ctx.m
        try:
            w_bf = self.dequantize_weight(w, ws, (128, 128)).to(torch.bfloat16)
            copies = self.bench.rotation_copies(n * k * 2 + m * k * 2, self.l2_bytes, cap=16 if self.cuda else 2, l2_passes=2)
            w_bfs = [w_bf] + [w_bf.clone() for _ in range(copies - 1)]
            return self.time_calls([functools.partial(torch.matmul, ctx.x, w.t()) for w in w_bfs])
        except Exception as exc:  # noqa: BLE001
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}


@dataclasses.dataclass
class _Unit:
    """Operands and fp32 reference of one (N, K, M)."""

    n: int
    k: int
    m: int
    x: Any
    xq: Any
    xs: Any
    w_list: list[Any]
    ws_list: list[Any]
    ref: Any


def _check_quant_bitwise(sweeper: Sweeper) -> dict[str, Any]:
    """torch and Triton quantizers must agree bit for bit on this device too."""
    torch = sweeper.torch
    from fp8select.kernels.quant import ROW_MAJOR, ScaleLayout

    dev = sweeper.dev
    k = 7168 + 40 if sweeper.cuda else 296
    x = (torch.randn(67, k, device=dev) * torch.exp(torch.randn(67, 1, device=dev) * 3)).to(torch.bfloat16)
    out: dict[str, Any] = {}
    for name, layout in (("row_major", ROW_MAJOR), ("m_major_align4_ue8m0", ScaleLayout(True, 4, True))):
        q_ref, s_ref = sweeper.quant(x, layout=layout)
        q_tri, s_tri = sweeper.quant_triton(x, layout=layout)
        out[name] = {
            "fp8_mismatches": int((q_ref.view(torch.uint8) != q_tri.view(torch.uint8)).sum()),
            "scale_mismatches": int((s_ref != s_tri).sum()),
        }
    return out


def _run(args: argparse.Namespace) -> int:
    """Set up the device, sweep every (shape, M) within the budget, write JSON, print a table."""
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if args.device == "cuda":
        require_cuda("sweep_triton")
        cap = torch.cuda.get_device_capability()
        if cap < (8, 9):
            print(f"sweep_triton: fp8 tl.dot needs compute capability >= 8.9, found {cap}.", file=sys.stderr)
            return 2
    import triton

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        sms, l2_bytes = props.multi_processor_count, int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
        meta: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "capability": list(torch.cuda.get_device_capability(dev))}
    else:
        sms, l2_bytes = 132, 60 * 2**20
        meta = {"device": "cpu (TRITON_INTERPRET smoke test; timings meaningless)", "capability": None}
    meta.update({
        "sm_count": sms,
        "l2_bytes": l2_bytes,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
    })
    sweeper = Sweeper(args, dev, sms, l2_bytes)
    shapes = QUICK_SHAPES if args.quick else parse_shapes(args.shapes)
    ms = list(QUICK_M) if args.quick else parse_m_list(args.m)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        **meta,
        "budget_s": args.budget_s,
        "shapes": [list(s) for s in shapes],
        "m": ms,
        "results": [],
        "skipped": [],
        "complete": False,
    }

    def write() -> None:
        report["elapsed_s"] = round(time.monotonic() - _T0, 1)
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, out_path)

    report["quant_bitwise"] = _check_quant_bitwise(sweeper)
    _log(f"quant torch vs triton mismatches: {report['quant_bitwise']}")
    write()

    units = [(n, k, m) for m in ms for (n, k) in shapes]
    for index, (n, k, m) in enumerate(units):
        if sweeper.budget.left() <= 0:
            report["skipped"] = [{"n": n2, "k": k2, "m": m2, "reason": "budget"} for n2, k2, m2 in units[index:]]
            _log(f"budget exhausted; {len(units) - index} units skipped")
            break
        unit_end = sweeper.budget.unit_deadline(len(units) - index)
        _log(f"unit {index + 1}/{len(units)}: N={n} K={k} M={m} (slice {unit_end - time.monotonic():.1f}s)")
        try:
            report["results"].append(sweeper.sweep_unit(n, k, m, unit_end))
        except torch.OutOfMemoryError as exc:
            report["results"].append({"n": n, "k": k, "m": m, "error": f"OOM: {exc}"[:300]})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        write()
    else:
        report["complete"] = True
    write()
    _print_summary(report)
    return 0


def _cell(value: float | None, width: int = 9, suffix: str = "") -> str:
    return f"{value:{width - len(suffix)}.1f}{suffix}" if value is not None else f"{'-':>{width}}"


def _print_summary(report: dict[str, Any]) -> None:
    """Short fixed-width table on stdout: per (N, K, M) the fastest whole-op time of each path."""
    print(
        f"\n{report['device']}  torch {report['torch']}  triton {report['triton']}  "
        f"elapsed {report['elapsed_s']}s  complete={report['complete']}  skipped={len(report['skipped'])}"
    )
    print(f"quant torch vs triton mismatches: {report.get('quant_bitwise')}")
    paths = _fp8select("kernels.triton_config").PATHS
    head = (
        f"{'N':>6} {'K':>6} {'M':>5} {'best config':34} {'us':>8} {'%HBM(W)':>7} {'TFLOPS':>7} "
        + " ".join(f"{p:>8}" for p in paths)
        + f" {'gemm-only':>9} {'cuBLAS':>8} {'bf16':>8} {'vs cuBLAS':>9}"
    )
    print(head)
    print("-" * len(head))
    for res in report["results"]:
        best = res.get("best")
        cfg = _describe(best["config"]) if best else str(res.get("error", "no valid config"))[:34]
        frac = res.get("weight_hbm_frac")
        cublas = res.get("cublas", {})
        cub_us = cublas.get("exact", {}).get("median_us")
        cub = _cell(cub_us, 8)
        if cub_us is None and "median_us" in cublas.get("padded", {}):
            cub_us = cublas["padded"]["median_us"]
            cub = _cell(cub_us, 8, "p")
        elif cub_us is None and cublas:
            cub = f"{'err':>8}"
        per_path = " ".join(_cell((res.get("paths") or {}).get(p, {}).get("median_us"), 8) for p in paths)
        ratio = cub_us / best["median_us"] if best and cub_us else None
        print(
            f"{res['n']:>6} {res['k']:>6} {res['m']:>5} {cfg:34} "
            f"{_cell(best['median_us'] if best else None, 8)} {_cell(100 * frac if frac else None, 7, '%')} "
            f"{_cell(res.get('tflops'), 7)} {per_path} {_cell(res.get('gemm_alone', {}).get('median_us'))} {cub} "
            f"{_cell(res.get('bf16', {}).get('median_us'), 8)} {_cell(ratio, 9, 'x') if ratio else f'{chr(45):>9}'}"
        )
    print(
        "times in us, whole op (bf16 in, quantization included, bf16 out) per path; gemm-only = the gemm path's "
        "GEMM on a pre-quantized activation; cuBLAS = block-wise scaled_mm GEMM only ('p': M padded to a multiple "
        "of 16); vs cuBLAS = cuBLAS time / best whole-op time; %HBM(W) = weight bytes/s over 4.3 TB/s"
    )


def build_parser() -> argparse.ArgumentParser:
    """Command-line interface."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write (rewritten after every unit)")
    p.add_argument("--shapes", default="deepseek-v3", help="'deepseek-v3' or N,K pairs, e.g. 7168x2048,2112x7168")
    p.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="comma-separated M values (table buckets)")
    p.add_argument("--budget-s", type=float, default=400.0, help="wall-clock budget for the whole run, from start")
    p.add_argument("--quick", action="store_true", help=f"smoke test: shapes {QUICK_SHAPES}, M {QUICK_M}")
    p.add_argument("--max-candidates", type=int, default=12, help="configs (all paths) timed per (shape, M)")
    p.add_argument("--paths", default="all", help="linear paths to search: 'all' or a subset of gemm,fused,decode,swap")
    p.add_argument("--replays", type=int, default=50, help="timed graph replays, median reported (>= 50 on CUDA)")
    p.add_argument("--no-competitors", action="store_true", help="skip cuBLAS and bf16 timings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: driver smoke test under TRITON_INTERPRET=1 with tiny shapes (no meaningful timings)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run; exits 2 with a message when no suitable GPU is present."""
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and args.replays < 50:
        print("sweep_triton: fewer than 50 replays gives unstable medians; using 50", file=sys.stderr)
        args.replays = 50
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
