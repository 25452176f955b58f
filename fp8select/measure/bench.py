"""Measure every accepted backend on this GPU, shape by shape (``python -m fp8select bench``).

Method (BENCHMARKING.md): correctness first (relative Frobenius error against an fp64
dequantized reference below 1e-2, outputs poisoned with NaN beforehand); then CUDA-graph
replay of the whole linear op a user calls (bf16 in, activation quantization included, bf16
out) and separately of the GEMM alone (pre-quantized input), median of >= 50 replays with
min and max, weights rotated through enough copies to exceed the L2 several times. bf16
``torch.matmul`` on the dequantized weight is timed in the same run as a yardstick. A
point's columns are timed together, their replays interleaved in shuffled order
(:func:`fp8select.measure.timing.time_graphs`), not one after another.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch

from fp8select.backends.base import Backend
from fp8select.buckets import M_BUCKETS
from fp8select.errors import Fp8SelectError
from fp8select.guard import PASS_THROUGH, describe
from fp8select.measure import timing
from fp8select.measured.shapes import MODELS, shape_sets
from fp8select.roofline import HBM_BYTES_PER_S, floors_us
from fp8select.selection import Selection

SHAPE_SETS = shape_sets()
DEFAULT_M: tuple[int, ...] = M_BUCKETS
L2_BYTES = 60 * 2**20
REL_ERR_MAX = 1e-2
GEMM = " gemm"  # suffix of a backend's GEMM-alone column
BF16 = "bf16-matmul"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """Shape-set names (:func:`fp8select.measured.shapes.shape_sets`) and ``N,K`` pairs, mixed:
    ``deepseek-v3``, ``qwen3-32b:tp4``, ``2112,7168,4096x7168``, ``deepseek-v3,12288,7168``."""
    tokens = [t for t in re.split(r"[,; ]+", text.strip().lower()) if t]
    shapes: list[tuple[int, int]] = []
    numbers: list[int] = []
    for token in tokens:
        if token in SHAPE_SETS:
            shapes.extend(SHAPE_SETS[token])
            continue
        try:
            numbers.extend(int(part) for part in token.split("x"))
        except ValueError:
            numbers = [-1]
            break
    if (not shapes and not numbers) or len(numbers) % 2 or (numbers and min(numbers) <= 0):
        raise Fp8SelectError(f"--shapes: expected model names ({', '.join(MODELS)}; NAME:tpN for one tensor-parallel "
                             f"degree, NAME:all for every one, served for all of them) and/or positive N,K pairs, "
                             f"found {text!r}")
    shapes.extend(zip(numbers[::2], numbers[1::2], strict=True))
    return list(dict.fromkeys(shapes))


def parse_ms(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise Fp8SelectError(f"--m: expected a comma list of positive integers, found {text!r}")
    return values


def rotation_copies(weight_bytes: int, l2_bytes: int = L2_BYTES, cap: int = 32, *, l2_passes: int = 3) -> int:
    """Weight copies to cycle through so one graph replay reads at least ``l2_passes`` times the L2 from HBM."""
    return max(1, min(cap, math.ceil(l2_passes * l2_bytes / max(weight_bytes, 1))))


def rotated(t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` and the clones of it that a measurement cycles through (:func:`rotation_copies` of its bytes)."""
    return [t] + [t.clone() for _ in range(rotation_copies(t.numel() * t.element_size()) - 1)]


def synchronize(device: torch.device) -> None:
    """Wait for the device (a no-op on the CPU, where calls are synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_weight(n: int, k: int, device: torch.device | str, generator: torch.Generator | None = None,
                  block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """A random fp8 ``[N, K]`` weight (never zero: |w| up to 440 of e4m3's 448) and positive block
    scales, the weight every measurement uses."""
    w = (torch.randn(n, k, device=device, generator=generator) * 100).clamp(-440, 440).to(torch.float8_e4m3fn)
    s = torch.rand(math.ceil(n / block[0]), math.ceil(k / block[1]), device=device, generator=generator) * 1e-3 + 1e-4
    return w, s


def _poison(shape: tuple[int, ...], device: torch.device) -> None:
    """Leave NaN in the allocator's free blocks of an output's size, so unwritten outputs show."""
    junk = [torch.full(shape, float("nan"), device=device, dtype=torch.float32) for _ in range(2)]
    del junk


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = out.to(torch.float64) - ref
    if not bool(torch.isfinite(diff).all()):
        return float("inf")
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def fp64_reference(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    return reference_for(w, s, block)(x)


def reference_for(w: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The fp64 reference of one weight, ``x -> quant(x) @ dequant(w).T``: the weight is dequantized
    once, for every M a measurement checks."""
    from fp8select.backends.reference import dequantize_activation, dequantize_weight
    from fp8select.kernels.quant import quantize_per_token_group

    w64 = dequantize_weight(w, s, block, torch.float64).t()

    def reference(x: torch.Tensor) -> torch.Tensor:
        xq, xs = quantize_per_token_group(x, block[1], dtype=w.dtype)
        return dequantize_activation(xq, xs, block[1], torch.float64) @ w64

    return reference


def checked_call(layer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor | None:
    """``layer(x)`` with its output memory poisoned first; None when it is not within 1e-2 of ``ref``."""
    _poison((x.shape[0], ref.shape[1]), x.device)
    out = layer(x)
    synchronize(x.device)
    return out if _rel_err(out, ref) < REL_ERR_MAX else None


def single_backend(selection: Selection, backend: Backend) -> Selection:
    """A selection whose chain is just ``backend`` (so a call it cannot take fails, not falls back).

    It plans from the selection's measurements with every table the selection measured at load time so far,
    and measures nothing itself, so each backend runs at its tuned best (the Triton configurations found by
    ``tune``, or at load time for the ``auto`` layers), which is what the ``auto`` choice is compared to: a
    pinned selection measuring rows of its own could run another configuration than auto's plan of the same
    backend (an H100 SXM, M 1 of 2048x3072: 7.3 against 8.3 us at the first start, 8.3 against 6.3 at the
    second).
    """
    from fp8select.measured.sources import measurements_for

    measured = selection.measured_at_load()
    tables = (*selection.tables, *measured)
    measurements = measurements_for(selection.capabilities, selection.chain, tables) if measured else \
        selection.measurements
    return replace(selection, backend=backend, source="argument", chain=(backend,), max_weight_copies=None,
                   tables=tables, measurements=measurements, tune_at_load=False)


def measure(selection: Selection, shapes: Iterable[tuple[int, int]], ms: Sequence[int], *,
            backends: Sequence[str] | None = None, replays: int = 50, block: tuple[int, int] = (128, 128),
            progress: Callable[[str], None] | None = None, seed: int = 0, auto: bool = True,
            budget_s: float = math.inf, bf16: bool = True, gemm_alone: bool = True,
            device: torch.device | str = "cuda") -> list[dict[str, Any]]:
    """One row per (N, K, M, backend): correctness, whole-op and GEMM-alone timings, roofline.

    ``backends`` defaults to every backend the selection accepted except ``reference``
    (whose fp32 dequantization is for correctness, not speed). ``bf16`` rows time
    ``torch.matmul`` on the dequantized weight. ``auto`` rows time the layer a user gets from
    ``selection.prepare`` (its plan), with the backend it ran in ``ran``. ``gemm_alone`` adds
    the GEMM on a pre-quantized input; ``bf16`` the yardstick. All of a point's columns are
    timed together, interleaved (:func:`fp8select.measure.timing.time_graphs`). No new shape is started
    after ``budget_s`` seconds.
    """
    start = time.monotonic()
    from fp8select.backends.reference import dequantize_weight

    device = torch.device(device)
    names = list(backends) if backends is not None else [b.name for b in selection.chain if b.name != "reference"]
    by_name = {b.name: b for b in selection.chain}
    rows: list[dict[str, Any]] = []
    gen = torch.Generator(device=device).manual_seed(seed)
    for n, k in shapes:
        if time.monotonic() - start > budget_s:
            rows.append({"n": n, "k": k, "m": 0, "backend": "-", "skipped": "time budget"})
            continue
        base, scale = random_weight(n, k, device, gen, block)
        reference = reference_for(base, scale, block)
        weights = rotated(base)
        layers: dict[str, list[Any]] = {}
        gemm_layers: dict[str, list[Any]] = {}
        skipped: dict[str, str] = {}
        if auto:  # first, as in an engine: its load-time measurement is what the pinned columns plan from too
            try:
                layers["auto"] = [selection.prepare(w, scale, block) for w in weights]
            except Fp8SelectError as exc:
                skipped["auto"] = str(exc).splitlines()[0]
        for name in names:
            backend = by_name.get(name)
            if backend is None:
                skipped[name] = "not accepted on this machine"
                continue
            sel = single_backend(selection, backend)
            try:
                layers[name] = [sel.prepare(w, scale, block) for w in weights]
                if gemm_alone:
                    gemm_layers[name] = [sel.prepare(w, scale, block, out_dtype=torch.bfloat16) for w in weights]
            except Fp8SelectError as exc:
                skipped[name] = str(exc).splitlines()[0]
        bf16_weights: list[torch.Tensor] = []
        if bf16:
            w_bf16 = dequantize_weight(base, scale, block, torch.bfloat16)
            bf16_weights = rotated(w_bf16)
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
            ref = reference(x)
            hbm_us, flop_us = floors_us(n, k, m)
            common = {"n": n, "k": k, "m": m, "hbm_floor_us": round(hbm_us, 3), "fp8_floor_us": round(flop_us, 3)}
            for name, reason in skipped.items():
                rows.append({**common, "backend": name, "skipped": reason})
            timed: dict[str, dict[str, Any]] = {}
            for name, per_copy in layers.items():
                row: dict[str, Any] = {**common, "backend": name}
                rows.append(row)
                try:
                    _poison((m, n), device)
                    out = per_copy[0](x)
                    synchronize(device)
                    row["rel_err"] = _rel_err(out, ref)
                    row["correct"] = row["rel_err"] < REL_ERR_MAX
                    if row["correct"]:
                        timed[name] = row
                except PASS_THROUGH:
                    raise
                except BaseException as exc:  # noqa: BLE001 - a backend failing here is a result, not a crash
                    row["error"] = describe(exc)
            # Every column of the point in one interleaved timing (whole ops, GEMMs alone, the bf16
            # yardstick), so that drift and heat reach them alike (fp8select.measure.timing).
            columns = {name: [functools.partial(layer, x) for layer in layers[name]] for name in timed}
            for name, row in timed.items():
                if gemm_layers.get(name):
                    try:
                        xq, xs = _quantize_for(by_name[name], x)
                    except PASS_THROUGH:
                        raise
                    except BaseException as exc:  # noqa: BLE001
                        row["gemm_error"] = describe(exc)
                        continue
                    columns[name + GEMM] = [functools.partial(layer, xq, input_scale=xs) for layer in gemm_layers[name]]
            if bf16:
                columns[BF16] = [functools.partial(torch.matmul, x, w.t()) for w in bf16_weights]
            errors: dict[str, str] = {}
            times = timing.time_graphs(columns, replays, errors=errors)
            for name, row in timed.items():
                if name + GEMM in errors:
                    row["gemm_error"] = errors[name + GEMM]
                elif name + GEMM in times:
                    row["gemm"] = times[name + GEMM].to_dict()
                if name in errors:
                    row["error"] = errors[name]
                    continue
                median = times[name].median_us
                row["whole"] = times[name].to_dict()
                row["hbm_fraction"] = round(hbm_us / median, 4)
                row["tflops"] = round(2 * m * n * k / median / 1e6, 2)
                if name == "auto":
                    row["ran"] = layers[name][0].backend_for(m).name
                config = layers[name][0].main_plan.route(m).to_dict()["config"]
                if config is not None:  # the launch configuration timed (Triton's)
                    row["config"] = config
            if BF16 in errors:
                rows.append({**common, "backend": BF16, "error": errors[BF16]})
            elif BF16 in times:
                bf = times[BF16]
                rows.append({**common, "backend": BF16, "whole": bf.to_dict(), "gemm": bf.to_dict(),
                             "hbm_fraction": round((n * k * 2 + m * (k + n) * 2) / HBM_BYTES_PER_S * 1e6 / bf.median_us, 4)})
            if progress is not None:
                progress(_progress_line(n, k, m, rows))
            del ref
        del layers, gemm_layers, weights, bf16_weights, reference
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _quantize_for(backend: Backend, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from fp8select.kernels.quant import quantize_per_token_group

    return quantize_per_token_group(x, 128, layout=backend.input_scale_layout)


def _progress_line(n: int, k: int, m: int, rows: Sequence[dict[str, Any]]) -> str:
    mine = [r for r in rows if r["n"] == n and r["k"] == k and r["m"] == m]
    parts = []
    for r in mine:
        if "whole" in r:
            parts.append(f"{r['backend']} {r['whole']['median_us']:.1f}us")
        elif "error" in r or r.get("correct") is False:
            parts.append(f"{r['backend']} FAILED")
    return f"N={n} K={k} M={m}: " + ", ".join(parts)


def winners(rows: Sequence[dict[str, Any]], candidates: Sequence[str] | None = None) -> dict[tuple[int, int, int], str]:
    """The fastest correct backend (whole op, median) per (N, K, M), among ``candidates``."""
    best: dict[tuple[int, int, int], tuple[float, str]] = {}
    for r in rows:
        if "whole" not in r or r["backend"] in (BF16, "auto") or (candidates is not None and r["backend"] not in candidates):
            continue
        key = (r["n"], r["k"], r["m"])
        t = r["whole"]["median_us"]
        if key not in best or t < best[key][0]:
            best[key] = (t, r["backend"])
    return {key: name for key, (_, name) in best.items()}


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table: per (N, K, M) each backend's median time, TFLOP/s, HBM fraction, and the winner."""
    win = winners(rows)
    lines = [f"{'N':>6} {'K':>6} {'M':>5}  {'backend':<15} {'whole us':>9} {'gemm us':>9} {'TFLOP/s':>8} {'HBM%':>6}  note"]
    for r in rows:
        key = (r["n"], r["k"], r["m"])
        if "whole" in r:
            note = "WINNER" if win.get(key) == r["backend"] else ""
            if r["backend"] == "auto":
                note = f"ran {r.get('ran')}"
            gemm = r.get("gemm", {}).get("median_us", float("nan"))
            tflops = 2 * r["m"] * r["n"] * r["k"] / r["whole"]["median_us"] / 1e6
            lines.append(f"{r['n']:>6} {r['k']:>6} {r['m']:>5}  {r['backend']:<15} {r['whole']['median_us']:>9.1f} {gemm:>9.1f} "
                         f"{tflops:>8.1f} {100 * r.get('hbm_fraction', 0):>5.1f}%  {note}")
        else:
            why = r.get("skipped") or r.get("error") or f"rel err {r.get('rel_err')}"
            lines.append(f"{r['n']:>6} {r['k']:>6} {r['m']:>5}  {r['backend']:<15} {'-':>9} {'-':>9} {'-':>8} {'-':>6}  {why[:80]}")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """Device name and versions, for the JSON."""
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def plot(rows: Sequence[dict[str, Any]], path: str) -> None:
    """Time against M per shape, one line per backend (needs matplotlib, the ``plot`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r["n"], r["k"]) for r in rows})
    cols = min(4, len(shapes))
    fig, axes = plt.subplots(math.ceil(len(shapes) / cols), cols, figsize=(4.5 * cols, 3.6 * math.ceil(len(shapes) / cols)),
                             squeeze=False)
    for ax, (n, k) in zip(axes.flat, shapes, strict=False):
        for name in sorted({r["backend"] for r in rows}):
            pts = sorted((r["m"], r["whole"]["median_us"]) for r in rows if (r["n"], r["k"]) == (n, k)
                         and r["backend"] == name and "whole" in r)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"N={n} K={k}")
        ax.set_xlabel("M")
        ax.set_ylabel("us (median, whole op)")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures the performance targets are stated in (ratios from this one run).

    - ``auto_vs_fastest``: geometric mean over (N, K, M) of auto time / fastest backend time
      (1.0 is perfect; the target is <= 1.03);
    - ``triton_vs_auto``: geometric mean of always-Triton time / auto time (target >= 1.4);
    - ``small_m_cublas_vs_triton``: M <= 16, cuBLAS block-wise whole-op time / Triton's
      (target >= 1.15), and ``small_m_min_hbm_fraction`` of Triton for N*K >= 16M (>= 0.6);
    - ``large_m_triton_speed_vs_cublas``: M >= 1024, cuBLAS time / Triton time (target >= 0.8).
    """
    times: dict[tuple[int, int, int], dict[str, float]] = {}
    hbm: dict[tuple[int, int, int], float] = {}
    for r in rows:
        if "whole" in r:
            times.setdefault((r["n"], r["k"], r["m"]), {})[r["backend"]] = r["whole"]["median_us"]
            if r["backend"] == "triton":
                hbm[(r["n"], r["k"], r["m"])] = r.get("hbm_fraction", 0.0)
    auto_ratio: list[float] = []
    triton_ratio: list[float] = []
    small: list[float] = []
    large: list[float] = []
    for (_, _, m), t in times.items():
        real = {b: v for b, v in t.items() if b not in ("auto", BF16)}
        if "auto" in t and real:
            auto_ratio.append(t["auto"] / min(real.values()))
            if "triton" in t:
                triton_ratio.append(t["triton"] / t["auto"])
        if "triton" in t and "cuda-scaled-mm" in t:
            (small if m <= 16 else large if m >= 1024 else []).append(t["cuda-scaled-mm"] / t["triton"])
    small_hbm = [f for (n, k, m), f in hbm.items() if m <= 16 and n * k >= 16_000_000]
    out = {
        "auto_vs_fastest": _geomean(auto_ratio),
        "auto_vs_fastest_worst": max(auto_ratio) if auto_ratio else None,
        "triton_vs_auto": _geomean(triton_ratio),
        "small_m_cublas_vs_triton": _geomean(small),
        "small_m_min_hbm_fraction": min(small_hbm) if small_hbm else None,
        "large_m_triton_speed_vs_cublas": _geomean(large),
        "large_m_triton_speed_vs_cublas_worst": min(large) if large else None,
        "points": len(times),
    }
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}
