"""Start-up cost, prepare() cost and NaN/inf semantics on the GPU, written as one JSON.

    python -m benchmarks.h200_checks --out checks.json [--cache-dir DIR] [--label vendors]

* ``startup``: in fresh processes (CUDA initialised first, as an engine has it), the seconds of
  ``import fp8select``, ``detect_capabilities()``, the plugin scan, the first ``resolve()``, the
  background verification it starts (and the share of pure-Python work the main thread still
  gets meanwhile) and a second resolve; once with empty caches (verification compiles its
  kernels) and once again (the passes are remembered); and the shipped table's size, its JSON parse
  and the whole read ``resolve()`` makes of the tables (best of seven each).
* ``prepare``: per DeepSeek-V3 shape, ``selection.prepare()`` time against the backends' own
  ``prepare`` (layout work) for the backends its plan uses: the difference is the plan's cost.
* ``nonfinite``: per accepted backend (pinned) and M, whether a NaN or an inf in one activation
  row gives a non-finite output row there and finite, correct rows elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._cuda import require_cuda

_STARTUP = r"""
import json, time
t0 = time.perf_counter()
import torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t1 = time.perf_counter()
import fp8select
t2 = time.perf_counter()
from fp8select.detect import detect_capabilities, forget_detected
caps = detect_capabilities()
t3 = time.perf_counter()
from fp8select.plugins import load_plugins
load_plugins()
t4 = time.perf_counter()
forget_detected()

def spin(until):  # pure-Python work (the worst case for sharing the GIL); iterations done
    n = 0
    while not until():
        for _ in range(1000):
            n += 1
    return n

s0 = time.perf_counter(); idle = spin(lambda: time.perf_counter() - s0 > 0.3); idle_rate = idle / (time.perf_counter() - s0)
t5 = time.perf_counter()
future = fp8select.resolve(background=True)
t6 = time.perf_counter()
background = not future.done()
s0 = time.perf_counter(); busy = spin(future.done); busy_s = time.perf_counter() - s0
sel = future.result()
t7 = time.perf_counter()
fp8select.resolve()
t8 = time.perf_counter()
from fp8select.measured.sources import find_tables, measurements_for
from fp8select.measured.table import SHIPPED_DIR, table_path

def fastest(call):  # the least of seven, in seconds
    times = []
    for _ in range(7):
        s = time.perf_counter(); call(); times.append(time.perf_counter() - s)
    return min(times)

shipped = table_path(SHIPPED_DIR, sel.capabilities.device_name or "none")
table = {"bytes": shipped.stat().st_size, "parse_s": fastest(lambda: json.loads(shipped.read_text())),
         "read_s": fastest(lambda: measurements_for(sel.capabilities, sel.chain, [t for _, t in find_tables(sel.capabilities)]))
         } if shipped.exists() else None
print(json.dumps({"cuda_init_s": t1 - t0, "import_s": t2 - t1, "detect_s": t3 - t2, "plugins_s": t4 - t3,
                  "first_resolve_s": t6 - t5, "background": background,
                  "verification_s": t7 - t6 if background else None,  # it starts as resolve() returns
                  "resolve_to_verified_s": t7 - t5,
                  "main_thread_python_rate_while_verifying": busy / busy_s / idle_rate if busy_s > 0.05 else None,
                  "second_resolve_s": t8 - t7, "table": table, "chain": [b.name for b in sel.chain], "notes": list(sel.notes)}))
"""


def startup(cache_dir: str) -> dict[str, Any]:
    """Fresh processes on empty caches (fp8select's, Triton's, DeepGEMM's and FlashInfer's), then again."""
    env = {**os.environ, "FP8SELECT_CACHE_DIR": cache_dir, "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"),
           "DG_JIT_CACHE_DIR": os.path.join(cache_dir, "deep_gemm"), "FLASHINFER_WORKSPACE_BASE": cache_dir}
    os.makedirs(env["DG_JIT_CACHE_DIR"], exist_ok=True)
    out = {}
    for run in ("empty_cache", "remembered"):
        proc = subprocess.run([sys.executable, "-c", _STARTUP], env=env, capture_output=True, text=True, timeout=300)
        try:
            out[run] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            out[run] = {"error": (proc.stderr or proc.stdout)[-2000:]}
    return out


def prepare_cost(shapes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    import torch

    import fp8select
    from fp8select.measure.bench import random_weight

    sel = fp8select.resolve()
    rows = []
    for n, k in shapes:
        w, s = random_weight(n, k, "cuda")
        layer = sel.prepare(w, s)  # first: vendor imports, entry points
        whole, own = [], []
        for _ in range(7):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            layer = sel.prepare(w, s)
            torch.cuda.synchronize()
            whole.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for b in sel.chain:
                if b.name in layer.prepared:
                    b.prepare(w, s, (128, 128), sel.capabilities)
            torch.cuda.synchronize()
            own.append(time.perf_counter() - t0)
        rows.append({"n": n, "k": k, "plan": layer.main_plan.summary(), "prepare_ms": round(statistics.median(whole) * 1e3, 3),
                     "layout_ms": round(statistics.median(own) * 1e3, 3),
                     "plan_ms": round((statistics.median(whole) - statistics.median(own)) * 1e3, 3)})
    return rows


def nonfinite() -> list[dict[str, Any]]:
    import torch

    import fp8select
    from fp8select.measure.bench import fp64_reference, random_weight

    sel = fp8select.resolve()
    n, k = 2112, 7168
    w, s = random_weight(n, k, "cuda")
    rows = []
    for backend in sel.chain:
        layer = fp8select.resolve(backend=backend.name, plugins=False, verify=False).prepare(w, s)
        for m in (1, 16, 256):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            bad = {0: float("nan")} if m == 1 else {1: float("nan"), m - 2: float("inf"), m // 2: -float("inf")}
            for row, value in bad.items():
                x[row, 300 + row] = value
            try:
                if layer.backend_for(m).name != backend.name:
                    continue
                y = layer(x).float()
                nonfinite_rows = sorted(int(i) for i in (~torch.isfinite(y)).any(dim=1).nonzero().flatten())
                clean = [i for i in range(m) if i not in bad]
                err = None
                if clean:
                    ref = fp64_reference(x[clean], w, s, (128, 128))
                    err = float((y[clean].double() - ref).norm() / ref.norm())
                rows.append({"backend": backend.name, "m": m, "bad_rows": sorted(bad), "nonfinite_rows": nonfinite_rows,
                             "propagates": nonfinite_rows == sorted(bad), "clean_rel_err": err})
            except Exception as exc:  # noqa: BLE001 - recorded
                rows.append({"backend": backend.name, "m": m, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--skip", default="", help="comma list of sections to skip: startup, prepare, nonfinite")
    args = parser.parse_args(argv)
    require_cuda("h200_checks")
    skip = set(args.skip.split(","))
    from fp8select.measure.bench import SHAPE_SETS

    result: dict[str, Any] = {"label": args.label}
    sections = {"startup": lambda: startup(tempfile.mkdtemp(prefix="fp8select-cache-")),
                "prepare": lambda: prepare_cost(list(SHAPE_SETS["deepseek-v3"])),
                "nonfinite": nonfinite}
    for name, fn in sections.items():
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, the next section goes on
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
        print(f"{name}: {time.perf_counter() - t0:.1f} s", json.dumps(result[name])[:3000], flush=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
