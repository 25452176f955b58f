"""Start-up: time to first outputs in fresh processes (GPU only), the ``startup`` phase of
:mod:`benchmarks.host_overhead`.

Three DeepSeek-V3 shapes (or ``--startup-shapes``), first outputs at M 1/64/4096, for auto and each backend
of ``--startup-backends`` pinned, in these states (or those of ``--startup-states``, in that order, a name
repeated for another start): empty JIT caches (a fresh cache folder: the first
calls compile), empty caches with ``warmup(layers, ms, processes=8)`` before the first calls (the
kernels compiled in worker processes side by side), empty caches with ``FP8SELECT_JIT_PROCESSES=16``
(load-time measurement's and warm-up's kernels compiled in worker processes; the warm states after it keep
the variable), warm caches (with ``prepare`` profiled once),
and warm with ``resolve(background=True)`` taken before :data:`STARTUP_LOAD_S` seconds of weight
loading (its side thread imports the vendors meanwhile): ``after_loading_s`` is what is left to
first outputs. Each row says how many rows load-time measurement took per shape (``measured_at_load``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

STARTUP_SHAPES = ((7168, 2048), (4096, 7168), (24576, 1536))
STARTUP_M = (1, 64, 4096)
STARTUP_LOAD_S = 2.0
STARTUP_PROCESSES = 8  # the "empty caches, warmup in worker processes" rows: warmup(..., processes=8)
STARTUP_JIT_PROCESSES = 16  # the "empty-jit" rows: the environment asks for JIT workers (load-time measurement, warmup)


_STARTUP_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.cuda.init()
import fp8select
from fp8select import quantize_weight
backend = sys.argv[1] or None
shapes = json.loads(sys.argv[2]); ms = json.loads(sys.argv[3])
load_s = float(sys.argv[5])  # > 0: resolve(background=True), then an engine's weight loading of load_s seconds
processes = int(sys.argv[6])  # > 0: warmup(layers, ms=ms, processes=...) before the first calls
t1 = time.perf_counter()
future = fp8select.resolve(backend=backend, background=True) if load_s else None
sel = fp8select.resolve(backend=backend) if future is None else None
t2 = time.perf_counter()
gen = torch.Generator(device="cuda").manual_seed(0)
ws = [quantize_weight(torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.05) for n, k in shapes]
torch.cuda.synchronize()
time.sleep(max(0.0, load_s - (time.perf_counter() - t2)))  # (the weights' loading, its time on the clock)
t3 = time.perf_counter()
if future is not None:
    sel = future.result()
wait_s = time.perf_counter() - t3
import cProfile, io, pstats
profile = cProfile.Profile() if sys.argv[4] == "profile" else None
if profile is not None:
    profile.enable()
layers = [sel.prepare(w, s) for w, s in ws]
if profile is not None:
    profile.disable()
t4 = time.perf_counter()
workers = fp8select.warmup(layers, ms=ms, processes=processes).workers if processes else ()
warmup_s = time.perf_counter() - t4
text = io.StringIO()
if profile is not None:
    pstats.Stats(profile, stream=text).sort_stats("cumtime").print_stats(25)
calls = []
for layer, (n, k) in zip(layers, shapes):
    for m in ms:
        start = time.perf_counter()
        layer(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        torch.cuda.synchronize()
        calls.append([n, k, m, layer.backend_for(m).name, round(time.perf_counter() - start, 3)])
t5 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "resolve_s": t2 - t1, "result_wait_s": wait_s, "prepare_s": t4 - t3 - wait_s,
                  "warmup_s": warmup_s, "workers": [[w["backend"], w["n"], w["k"], w["ms"], w.get("error", w["seconds"])]
                                                    for w in workers],
                  "first_calls_s": t5 - t4 - warmup_s, "to_first_outputs_s": (t5 - t0) - (t3 - t2),
                  "after_loading_s": t5 - t3, "tune_at_load": sel.tune_at_load,
                  "measured_at_load": [sum(len(b) for g in sel._memo.measured.get((n, k), {}).get("groups", [])
                                           for b in g["shapes"].values()) for n, k in shapes],
                  "plans": [l.main_plan.summary() for l in layers],
                  "first_calls": calls, "prepare_profile": text.getvalue().splitlines()[4:]}))
"""


STATES = {"empty": "empty", "empty-workers": f"empty, warmup in {STARTUP_PROCESSES} processes",
          "empty-jit": f"empty, FP8SELECT_JIT_PROCESSES={STARTUP_JIT_PROCESSES}", "warm": "warm",
          "warm-profiled": "warm, prepare profiled", "warm-background": f"warm, background, {STARTUP_LOAD_S} s of loading"}
"""``--startup-states``: the short name of each state, in the order they run (an empty one first: its caches
are what the warm ones find)."""


def phase_startup(report: dict[str, Any]) -> None:
    rows = []
    shapes = report.get("startup_shapes") or STARTUP_SHAPES
    states = [STATES[name] for name in report.get("startup_states") or STATES]
    env = dict(os.environ)
    for backend in (b if b != "auto" else "" for b in report["startup_backends"]):
        for state in states:
            if state.startswith("empty"):  # a fresh cache folder: every JIT compiles
                cache = tempfile.mkdtemp(prefix="fp8select-startup-")
                env = {**os.environ, "TRITON_CACHE_DIR": f"{cache}/triton", "DG_JIT_CACHE_DIR": f"{cache}/dg",
                       "FLASHINFER_WORKSPACE_BASE": f"{cache}/fi", "TRTLLM_DG_CACHE_DIR": f"{cache}/fi-kernels",
                       "XDG_CACHE_HOME": f"{cache}/xdg", "FP8SELECT_CACHE_DIR": f"{cache}/fp8select",
                       "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor"}
                if state == STATES["empty-jit"]:  # and the warm states after it: an engine's setting stays
                    env["FP8SELECT_JIT_PROCESSES"] = str(STARTUP_JIT_PROCESSES)
            load = str(STARTUP_LOAD_S) if "background" in state else "0"
            processes = str(STARTUP_PROCESSES) if state == STATES["empty-workers"] else "0"
            done = subprocess.run([sys.executable, "-c", _STARTUP_CHILD, backend, json.dumps(shapes),
                                   json.dumps(STARTUP_M), "profile" if "profiled" in state else "", load, processes],
                                  env=env, capture_output=True, text=True, timeout=240)
            line = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None
            row = {"backend": backend or "auto", "caches": state, **(json.loads(line) if line else
                                                                      {"error": done.stderr[-600:]})}
            rows.append(row)
            print(json.dumps(row), flush=True)
    report["startup"] = rows
