"""What fp8select costs on the CPU per eager call, next to the raw kernels it launches (GPU only).

Phases (``--phases``, default all but startup), one JSON report:

* ``host``: host microseconds per eager call, launch-bound (small weights; the GPU never sets
  the pace), as ``perf_counter`` over a few hundred calls with no synchronize inside, median of
  rounds: bf16 ``F.linear``, torch block-wise ``F.scaled_mm`` / raw DeepGEMM / raw sgl_kernel on a
  pre-quantized input, raw FlashInfer (quantizes inside), fp8select's activation quantizer
  alone, its Triton launches alone (quantizer + GEMM), and fp8select's layer pinned to each
  accepted backend and auto, the module, the drop-in ``linear`` on the same tensors.
* ``compile``: the module under ``torch.compile`` (default mode, no CUDA graphs) against eager.
* ``stack``: eager end to end, 8 DeepSeek-V3 dense projections in a row at M 16/128/512/4096:
  fp8select auto; the same plan's backends called raw (what each layer's route runs, without
  fp8select around it); a hand-written dispatch over the vendors (FlashInfer below M 32, else
  sgl_kernel's quantizer + DeepGEMM); and fp8select under a CUDA graph (its GPU time, the floor).
* ``profile``: where the host time goes: cProfile of each path's calls (the quantizer, the layer
  pinned, the eager stack at M 16 against its raw routes) and the stack's GPU timeline (torch's
  profiler: kernels, busy time and span per pass).
* ``startup``: time to first outputs in fresh processes (:mod:`benchmarks._startup`).

Usage: ``python -m benchmarks.host_overhead --out DIR [--phases host,compile,stack,startup]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda
from benchmarks._startup import STATES, phase_startup

HOST_SHAPES = ((1024, 1024), (7168, 2048))
HOST_M = 16
STACK = ((7168, 2048), (4096, 7168), (24576, 1536), (7168, 16384), (4608, 7168), (2112, 7168), (32768, 512),
         (7168, 18432))
STACK_M = (16, 128, 512, 4096)
STACK_ROUNDS = 41  # rounds of 20 passes per path (a pass at M 16 is about 0.2 ms; the host's noise is larger)
"""The weight loading an engine does between ``resolve(background=True)`` and ``result()`` in the
background start-up state (far less than a DeepSeek-V3 checkpoint takes): what the side thread's
vendor imports overlap with."""


def _round_us(fn: Callable[[], object], calls: int = 300) -> float:
    """Host microseconds per call of ``fn`` over one round of ``calls``, no synchronize inside."""
    import torch

    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _interleaved(fns: dict[str, Callable[[], object]], round_of: Callable[[Callable[[], object]], float],
                 rounds: int = 9, mins: dict[str, float] | None = None, digits: int = 2,
                 each: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """The median over ``rounds`` of ``round_of(fn)`` for each of ``fns``, the rounds taken in turn (fn 1, fn 2,
    ..., fn 1, ...) so that a shared host's drift touches every one alike, with the garbage collector paused
    (as ``timeit`` does: a collection landing in one round is noise). A fn that raises is reported so.
    ``mins``: filled with each fn's fastest round (a busy host only adds time, so the fastest round is the
    steadiest estimate of what a call costs; the median, of what it costs on this host as it was). ``each``:
    filled with every round's figure, in order. ``digits``: what the figures are rounded to (2 for
    microseconds per call, 4 for milliseconds per pass)."""
    import gc

    import torch

    out: dict[str, Any] = {}
    times: dict[str, list[float]] = {}
    for name, fn in fns.items():
        try:
            for _ in range(30):
                fn()
            torch.cuda.synchronize()
            times[name] = []
        except Exception as exc:  # noqa: BLE001 - a vendor call that fails here is a finding
            out[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name in times:
                times[name].append(round_of(fns[name]))
    finally:
        if collecting:
            gc.enable()
    if each is not None:
        each |= times
    if mins is not None:
        mins |= {name: round(min(t), digits) for name, t in times.items()}
    return {name: round(statistics.median(t), digits) for name, t in times.items()} | out


def _host_us(fn: Callable[..., object], *args: Any) -> float:
    """Median host microseconds per call of ``fn(*args)`` (one path alone; :func:`_interleaved` for several)."""
    return float(_interleaved({"fn": lambda: fn(*args)}, _round_us)["fn"])


def _pass_ms(fn: Callable[[], object], passes: int = 20, rounds: int = 5) -> float:
    """Median wall milliseconds per pass of ``fn`` (synchronized at both ends of a round)."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(passes):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / passes * 1e3)
    return round(statistics.median(times), 4)


def _graph_ms(fn: Callable[[], object], replays: int = 50) -> float:
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / replays * 1e3)
    return round(statistics.median(times), 4)


def _weights(n: int, k: int, seed: int) -> tuple[Any, Any]:
    import torch

    from fp8select import quantize_weight

    gen = torch.Generator(device="cuda").manual_seed(seed)
    return quantize_weight(torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.05)


def _raw_calls(n: int, k: int, w: Any, s: Any, x: Any) -> dict[str, Callable[[], object]]:
    """The vendors' and torch's own calls on this weight (those installed), inputs prepared outside."""
    import torch
    import torch.nn.functional as F

    from fp8select.kernels.quant import M_MAJOR, ScaleLayout
    from fp8select.kernels.triton_quant import TritonQuantizer

    calls: dict[str, Callable[[], object]] = {}
    dense = (w.to(torch.bfloat16) * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k].to(torch.bfloat16))
    calls["bf16 F.linear"] = lambda: F.linear(x, dense)
    m_major = TritonQuantizer(k, dtype=torch.float8_e4m3fn, layout=M_MAJOR, device=x.device)
    calls["fp8select quantizer alone"] = lambda: m_major(x)
    xq, xs = m_major(x)
    if hasattr(F, "scaled_mm"):
        st = F.ScalingType
        kb = s.shape[1]
        padded = torch.zeros((s.shape[0], -(-kb // 4) * 4), dtype=torch.float32, device="cuda")
        padded[:, :kb] = s
        wt, sb = w.t(), padded.t()
        calls["torch scaled_mm (pre-quantized)"] = lambda: F.scaled_mm(
            xq, wt, xs, st.BlockWise1x128, sb, st.BlockWise128x128, output_dtype=torch.bfloat16)
    try:
        import deep_gemm

        dq, ds = TritonQuantizer(k, dtype=torch.float8_e4m3fn, layout=ScaleLayout(mn_major=True, m_align=4),
                                 device=x.device)(x)
        out = torch.empty((x.shape[0], n), dtype=torch.bfloat16, device="cuda")
        calls["raw deep_gemm.fp8_gemm_nt (pre-quantized)"] = lambda: deep_gemm.fp8_gemm_nt((dq, ds), (w, s), out)
        calls["raw deep_gemm, new output each call"] = lambda: deep_gemm.fp8_gemm_nt(
            (dq, ds), (w, s), torch.empty((x.shape[0], n), dtype=torch.bfloat16, device="cuda"))
    except ImportError:
        pass
    try:
        from flashinfer.gemm import fp8_blockscale_gemm_sm90

        calls["raw flashinfer fp8_blockscale_gemm_sm90"] = lambda: fp8_blockscale_gemm_sm90(
            x, w, None, s, out_dtype=torch.bfloat16)
    except ImportError:
        pass
    try:
        import sgl_kernel

        wt_c, st_c = w.t(), s.t()
        calls["raw sgl_kernel fp8_blockwise_scaled_mm (pre-quantized)"] = lambda: sgl_kernel.fp8_blockwise_scaled_mm(
            xq, wt_c, xs, st_c, torch.bfloat16)
        if hasattr(sgl_kernel, "sgl_per_token_group_quant_fp8"):
            q = torch.empty_like(x, dtype=torch.float8_e4m3fn)
            qs = torch.empty((x.shape[0], k // 128), dtype=torch.float32, device="cuda")
            calls["raw sgl_kernel quantizer"] = lambda: sgl_kernel.sgl_per_token_group_quant_fp8(
                x, q, qs, 128, 1e-10, -448.0, 448.0, False)
    except ImportError:
        pass
    return calls


def _launch_all(launches: list[tuple[Any, Any, Any]], stream: int) -> None:
    """Each compiled kernel's launcher called with its every value prebuilt (no launch hooks)."""
    for kernel, grid, values in launches:
        kernel.launcher(grid[0], grid[1], grid[2], stream, kernel.function, kernel.metadata, None, None, None, *values)


def _prebuilt_launches(linear: Any, x: Any) -> tuple[list[tuple[Any, Any, Any]], tuple[Any, ...]]:
    """The compiled-kernel launches of ``linear(x)`` (a BoundLinear that replays at this M) with every argument
    filled in, and the output and workspace they write (keep them alive while timing): its Triton floor."""
    import torch

    linear(x)
    replay = linear._replays.get((x.shape[0], x.dtype))
    if replay is None:
        return [], ()
    out = torch.empty((x.shape[0], linear._n), dtype=torch.bfloat16, device=x.device)
    work = torch.empty(max(replay.nbytes, 1), dtype=torch.uint8, device=x.device)
    launches = [(kernel, grid, tuple(values))
                for kernel, grid, values in replay.launches((x.data_ptr(), out.data_ptr(), work.data_ptr()))]
    return launches, (out, work)


def phase_host(report: dict[str, Any]) -> None:
    import fp8select

    auto = fp8select.resolve()
    report["chain"] = [b.name for b in auto.chain]
    rows = []
    for n, k in HOST_SHAPES:
        row = _host_row(auto, n, k)
        rows.append(row)
        print(json.dumps(row), flush=True)
    report["host"] = rows


def _host_row(auto: Any, n: int, k: int) -> dict[str, Any]:
    """Every path's host microseconds per call at one shape, timed interleaved."""
    import torch

    import fp8select
    from fp8select.nn import BlockFp8Linear

    w, s = _weights(n, k, n + k)
    x = torch.randn(HOST_M, k, device="cuda", dtype=torch.bfloat16)
    row: dict[str, Any] = {"n": n, "k": k, "m": HOST_M}
    paths = _raw_calls(n, k, w, s, x)
    keep = []
    for backend in [b.name for b in auto.chain if b.name != "reference"]:
        layer = fp8select.resolve(backend=backend).prepare(w, s)
        if backend == "triton":
            from fp8select.kernels.triton_gemm import BoundLinear

            route = layer.main_plan.route(HOST_M)
            launches = BoundLinear(w, s, (128, 128), route.config, out_dtype=torch.bfloat16,
                                   counters=layer.prepared["triton"].extra.get("fixup_counters"))

            def bound_launches(launches: Any = launches) -> object:
                return launches(x)
            paths["fp8select Triton launches alone (bound)"] = bound_launches
            prebuilt, written = _prebuilt_launches(launches, x)
            keep.append(written)
            stream = torch.cuda.current_stream().cuda_stream

            def prebuilt_launches(prebuilt: list[tuple[Any, Any, Any]] = prebuilt, stream: int = stream) -> None:
                _launch_all(prebuilt, stream)
            paths["Triton compiled launches alone (arguments prebuilt)"] = prebuilt_launches
            row["triton_launches"] = len(prebuilt)

        def pinned(layer: Any = layer) -> object:
            return layer(x)
        paths[f"layer pinned {backend}"] = pinned
    auto_layer = auto.prepare(w, s)
    row["auto_plan"] = auto_layer.main_plan.summary()
    paths["layer auto"] = lambda: auto_layer(x)
    module = BlockFp8Linear(k, n, bias=False, selection=auto, device="cuda")
    module.load_state_dict({"weight": w, "weight_scale_inv": s})
    paths["module auto (grad mode)"] = lambda: module(x)
    paths["drop-in sel.linear auto"] = lambda: auto.linear(x, w, [128, 128], s)
    row["min_us"] = {}
    row["us"] = _interleaved(paths, _round_us, mins=row["min_us"])
    with torch.no_grad():
        row["us"] |= _interleaved({"module auto (no_grad)": lambda: module(x), "layer auto, no_grad": lambda: auto_layer(x)},
                                  _round_us, mins=row["min_us"])
    with torch.inference_mode():
        row["us"] |= _interleaved({"layer auto, inference_mode": lambda: auto_layer(x)}, _round_us, mins=row["min_us"])
    return row


def phase_compile(report: dict[str, Any]) -> None:
    import torch

    import fp8select
    from fp8select.nn import BlockFp8Linear
    from fp8select.ops import HANDLE_ATTR, OUT_DTYPES

    auto = fp8select.resolve()
    out = []
    for n, k in HOST_SHAPES:
        w, s = _weights(n, k, n + k)
        module = BlockFp8Linear(k, n, bias=False, selection=auto, device="cuda")
        module.load_state_dict({"weight": w, "weight_scale_inv": s})
        x = torch.randn(HOST_M, k, device="cuda", dtype=torch.bfloat16)
        compiled = torch.compile(module)
        with torch.no_grad():
            start = time.perf_counter()
            compiled(x)
            compile_s = time.perf_counter() - start
            eager = _host_us(module, x)
            graph = _host_us(compiled, x)
            layer = module.fp8_layer
            if layer is None:
                raise RuntimeError(f"host_overhead: {module} is not prepared")
            layer_us = _host_us(layer, x)
            handle = getattr(layer, HANDLE_ATTR)
            op_us = _host_us(torch.ops.fp8select.linear.default, x, None, None, handle, n, OUT_DTYPES.index(torch.bfloat16))
            equal = bool(torch.equal(compiled(x), module(x)))
        row = {"n": n, "k": k, "m": HOST_M, "eager_module_us": eager, "compiled_module_us": graph,
               "eager_layer_us": layer_us, "custom_op_direct_us": op_us,
               "custom_op_own_us": round(op_us - layer_us, 2), "compiled_wrapper_us": round(graph - op_us, 2),
               "compile_s": round(compile_s, 2), "bitwise_equal": equal}
        out.append(row)
        print(json.dumps(row), flush=True)
    report["compile"] = out


def _route_raw(layer: Any, m: int) -> Callable[[Any], object]:
    """The raw kernels of the route ``layer`` runs at ``m`` rows, without fp8select's layer around them."""
    import torch

    route = layer.main_plan.route(m)
    name = route.backend
    prepared = layer.prepared[name]
    n, k = layer.n, layer.k
    if name == "deepgemm":
        import deep_gemm

        from fp8select.kernels.quant import ScaleLayout
        from fp8select.kernels.triton_quant import TritonQuantizer

        quant = TritonQuantizer(k, dtype=torch.float8_e4m3fn, layout=ScaleLayout(mn_major=True, m_align=4),
                                device=torch.device("cuda"))

        def run_deepgemm(x: Any) -> object:
            out = torch.empty((x.shape[0], n), dtype=torch.bfloat16, device="cuda")
            deep_gemm.fp8_gemm_nt(quant(x), (prepared.weight, prepared.scale), out)
            return out
        return run_deepgemm
    if name == "flashinfer":
        from flashinfer.gemm import fp8_blockscale_gemm_sm90

        return lambda x: fp8_blockscale_gemm_sm90(x, prepared.weight, None, prepared.scale, out_dtype=torch.bfloat16)
    if name == "triton":
        from fp8select.kernels.triton_gemm import BoundLinear

        return BoundLinear(prepared.weight, prepared.scale, (128, 128), route.config, out_dtype=torch.bfloat16,
                           counters=prepared.extra.get("fixup_counters"))
    launch = layer._launches[torch.bfloat16][layer.main_plan.routes.index(route)]
    return lambda x: launch(x, None)


def _stack_passes(layers: list[Any], m: int) -> tuple[Callable[[], None], Callable[[], None], list[Any]]:
    """One eager pass over ``layers`` at ``m`` rows through fp8select, the same through each layer's raw
    route (:func:`_route_raw`), and the inputs both take."""
    import torch

    xs = [torch.randn(m, layer.k, device="cuda", dtype=torch.bfloat16) for layer in layers]
    raws = [_route_raw(layer, m) for layer in layers]

    def fp8select_pass() -> None:
        for layer, x in zip(layers, xs, strict=True):
            layer(x)

    def raw_pass() -> None:
        for raw, x in zip(raws, xs, strict=True):
            raw(x)

    return fp8select_pass, raw_pass, xs


def phase_stack(report: dict[str, Any]) -> None:
    import fp8select

    auto = fp8select.resolve()
    weights = [_weights(n, k, i) for i, (n, k) in enumerate(STACK)]
    layers = [auto.prepare(w, s) for w, s in weights]
    hand = _hand_written(weights)
    rows = []
    for m in STACK_M:
        fp8select_pass, raw_pass, xs = _stack_passes(layers, m)
        row: dict[str, Any] = {"m": m, "plans": [layer.main_plan.route(m).backend for layer in layers]}
        passes: dict[str, Callable[[], object]] = {"fp8select_eager_ms": fp8select_pass, "raw_routes_eager_ms": raw_pass}
        if hand is not None:
            calls = hand(m)

            def hand_pass(xs: list[Any] = xs, calls: list[Callable[[Any], object]] = calls) -> list[object]:
                return [f(x) for f, x in zip(calls, xs, strict=True)]
            passes["hand_written_eager_ms"] = hand_pass
        fastest: dict[str, float] = {}
        each: dict[str, list[float]] = {}
        row |= _interleaved(passes, lambda fn: _pass_ms(fn, rounds=1), rounds=STACK_ROUNDS, mins=fastest, digits=4,
                            each=each)
        row["fastest_round_ms"] = fastest
        row["fp8select_graphed_ms"] = _graph_ms(fp8select_pass)
        row["ratio_vs_raw_routes"] = round(row["fp8select_eager_ms"] / row["raw_routes_eager_ms"], 3)
        row["fastest_ratio_vs_raw_routes"] = round(fastest["fp8select_eager_ms"] / fastest["raw_routes_eager_ms"], 3)
        # Each round against the raw routes' round right after it: what a drift of the host touches alike.
        row["paired_ratio_vs_raw_routes"] = round(statistics.median(
            a / b for a, b in zip(each["fp8select_eager_ms"], each["raw_routes_eager_ms"], strict=True)), 3)
        if hand is not None:
            row["ratio_vs_hand_written"] = round(row["fp8select_eager_ms"] / row["hand_written_eager_ms"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    report["stack"] = rows


def _hand_written(weights: list[tuple[Any, Any]]) -> Callable[[int], list[Callable[[Any], object]]] | None:
    """An engine's dispatch by hand: FlashInfer's sm90 GEMM below M 32, else sgl_kernel's quantizer + DeepGEMM."""
    import torch

    try:
        import deep_gemm
        import sgl_kernel
        from flashinfer.gemm import fp8_blockscale_gemm_sm90
    except ImportError:
        return None
    from deep_gemm import get_mn_major_tma_aligned_tensor

    def calls(m: int) -> list[Callable[[Any], object]]:
        out: list[Callable[[Any], object]] = []
        for w, s in weights:
            n, k = w.shape
            if m < 32:
                def fi(x: Any, w: Any = w, s: Any = s) -> object:
                    return fp8_blockscale_gemm_sm90(x, w, None, s, out_dtype=torch.bfloat16)
                out.append(fi)
                continue

            def dg(x: Any, w: Any = w, s: Any = s, n: int = n, k: int = k) -> object:
                q = torch.empty_like(x, dtype=torch.float8_e4m3fn)
                qs = torch.empty((x.shape[0], k // 128), dtype=torch.float32, device="cuda")
                sgl_kernel.sgl_per_token_group_quant_fp8(x, q, qs, 128, 1e-10, -448.0, 448.0, False)
                y = torch.empty((x.shape[0], n), dtype=torch.bfloat16, device="cuda")
                deep_gemm.fp8_gemm_nt((q, get_mn_major_tma_aligned_tensor(qs)), (w, s), y)
                return y
            out.append(dg)
        return out
    return calls


def phase_profile(report: dict[str, Any]) -> None:
    """Where a call's host time goes: cProfile of a few hundred calls of each path, top functions by own time."""
    import cProfile
    import io
    import pstats

    import torch

    import fp8select
    from fp8select.kernels.quant import M_MAJOR
    from fp8select.kernels.triton_quant import TritonQuantizer

    n, k = HOST_SHAPES[0]
    w, s = _weights(n, k, 1)
    x = torch.randn(HOST_M, k, device="cuda", dtype=torch.bfloat16)
    quantizer = TritonQuantizer(k, dtype=torch.float8_e4m3fn, layout=M_MAJOR, device=x.device)
    paths: dict[str, Callable[[], object]] = {"quantizer": lambda: quantizer(x)}
    for backend in ("triton", "deepgemm", "cuda-scaled-mm"):
        try:
            layer = fp8select.resolve(backend=backend).prepare(w, s)
        except Exception:  # noqa: BLE001 - a backend this machine lacks
            continue

        def pinned(layer: Any = layer) -> object:
            return layer(x)
        paths[f"layer {backend}"] = pinned
    # The eager stack at its smallest M, where the host sets the pace: fp8select's pass against its raw routes'.
    auto = fp8select.resolve()
    stack = [auto.prepare(*_weights(n, k, i)) for i, (n, k) in enumerate(STACK)]
    paths[f"stack M {STACK_M[0]}"], paths[f"stack M {STACK_M[0]}, raw routes"], _ = _stack_passes(stack, STACK_M[0])
    out = {}
    for name, fn in paths.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(300):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
        out[name] = text.getvalue().splitlines()[4:]
        print(name, "\n".join(out[name]), sep="\n", flush=True)
    report["profile"] = out
    report["stack_gpu_timeline"] = {name: _gpu_timeline(paths[name]) for name in paths if name.startswith("stack")}
    print(json.dumps(report["stack_gpu_timeline"]), flush=True)


def _gpu_timeline(fn: Callable[[], object], passes: int = 50) -> dict[str, Any]:
    """What the GPU does during ``passes`` eager passes (torch's profiler, CUDA activity): per pass, the
    kernels launched, their summed time, and the wall time from the first kernel's start to the last's end
    (the difference is the GPU waiting between launches), with the kernels by name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {"error": "no CUDA events recorded"}
    start = min(e.time_range.start for e in kernels)
    end = max(e.time_range.end for e in kernels)
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    names: dict[str, int] = {}
    for e in kernels:
        names[e.name[:60]] = names.get(e.name[:60], 0) + 1
    return {"kernels_per_pass": round(len(kernels) / passes, 2), "busy_us_per_pass": round(busy / passes, 1),
            "span_us_per_pass": round((end - start) / passes, 1),
            "idle_fraction": round(1 - busy / max(end - start, 1e-9), 3),
            "kernels": dict(sorted(names.items(), key=lambda kv: -kv[1])[:16])}


PHASES = {"profile": phase_profile, "host": phase_host, "compile": phase_compile, "stack": phase_stack, "startup": phase_startup}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for host_overhead.json")
    parser.add_argument("--phases", default="host,compile,stack", help=f"comma-separated, of {','.join(PHASES)}")
    parser.add_argument("--startup-backends", default="auto,deepgemm,flashinfer",
                        help="startup: auto and/or the backends pinned, comma-separated")
    parser.add_argument("--startup-shapes", default="", help="startup: the layer shapes (as bench --shapes takes them; "
                        "default three DeepSeek-V3 ones)")
    parser.add_argument("--startup-states", default="", help=f"startup: of {','.join(STATES)} (default all)")
    args = parser.parse_args(argv)
    require_cuda("host_overhead")
    import torch
    import triton

    from fp8select.measure.bench import parse_shapes

    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "triton": triton.__version__, "startup_backends": args.startup_backends.split(","),
                              "startup_shapes": [list(s) for s in parse_shapes(args.startup_shapes)] if args.startup_shapes else None,
                              "startup_states": args.startup_states.split(",") if args.startup_states else None}
    args.out.mkdir(parents=True, exist_ok=True)
    for phase in args.phases.split(","):
        start = time.perf_counter()
        try:
            PHASES[phase](report)
        except Exception as exc:  # noqa: BLE001 - keep what the other phases measured
            report[f"{phase}_error"] = f"{type(exc).__name__}: {exc}"
            print(f"phase {phase} failed: {exc!r}", file=sys.stderr, flush=True)
        report[f"{phase}_s"] = round(time.perf_counter() - start, 1)
        (args.out / "host_overhead.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
