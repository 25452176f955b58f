"""JIT kernels compiled in worker processes, side by side: a plan's (``warmup(..., processes=N)``), and the
vendors' at the points load-time measurement times (``FP8SELECT_JIT_PROCESSES``, :mod:`fp8select.measure.loadtime`).

DeepGEMM, FlashInfer and Triton compile a kernel the first time a process calls it at a new shape
(2-5 s each for the vendors on the H200) and keep it in an on-disk cache that later processes read
(``DG_JIT_CACHE_DIR``; FlashInfer's sm90 GEMMs under ``TRTLLM_DG_CACHE_DIR``, by default
``~/.tensorrt_llm``; ``TRITON_CACHE_DIR``). One process compiles one kernel
after another; worker processes, one per backend and layer shape (split by M while processes
would idle: :func:`jit_jobs`), run their compilers at once on separate cores, and the caller's own
warm-up then loads what they wrote. Each worker (:mod:`fp8select.jit_worker`) resolves with that
backend pinned, prepares a random weight of the layer's shape and calls it at each of its Ms, with
the caller's environment, so the same caches. A worker that fails or times out costs only its time:
the caller compiles what is missing itself.

Worth it on cold caches only (a new deployment, new shapes): on warm ones each worker is a process
start (importing torch and the vendors, a CUDA context) for nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from fp8select.capabilities import Capabilities
from fp8select.problem import dtype_name

__all__ = ["ENV_PROCESSES", "JitJob", "compile_in_processes", "jit_jobs", "processes_wanted", "split_jobs"]

ENV_PROCESSES = "FP8SELECT_JIT_PROCESSES"
"""Worker processes to compile in where the caller does not say (warm-up, load-time measurement); unset: none."""

_POLL_S = 0.05
WORKER = "fp8select.jit_worker"
"""The module a worker process runs (it resolves, so it sits above this one and is named, not imported)."""


@dataclass(frozen=True)
class JitJob:
    """One worker's calls: ``backend`` pinned, a ``[n, k]`` weight, called with each of ``ms`` rows of
    ``act_dtype`` on ``device`` in turn."""

    backend: str
    n: int
    k: int
    ms: tuple[int, ...]
    act_dtype: str
    device: str


def processes_wanted(caps: Capabilities) -> int:
    """:data:`ENV_PROCESSES` of the snapshot as a count (0 when unset or not a count)."""
    value = caps.env.get(ENV_PROCESSES, "").strip()
    return int(value) if value.isascii() and value.isdigit() else 0


def jit_jobs(calls: Iterable[tuple[Any, int]], act_dtype: torch.dtype, processes: int) -> list[JitJob]:
    """The jobs of warm-up ``calls`` (``(layer, m)`` of dense layers) whose route's backend compiles
    kernels just in time (:attr:`~fp8select.backends.base.Backend.jit`); e4m3fn weights only (what a
    worker's random weight is): :func:`split_jobs` of their Ms per backend and shape."""
    groups: dict[tuple[str, int, int, str], dict[int, None]] = {}
    for layer, m in calls:
        if layer.weight_dtype != torch.float8_e4m3fn or layer.main_plan.route(m).backend is None:
            continue
        backend = layer.backend_for(m, act_dtype)
        if backend.jit:
            groups.setdefault((backend.name, layer.n, layer.k, str(layer.device)), {})[m] = None
    return split_jobs({key: tuple(ms) for key, ms in groups.items()}, dtype_name(act_dtype), processes)


def split_jobs(calls: Mapping[tuple[str, int, int, str], Sequence[int]], act_dtype: str, processes: int) -> list[JitJob]:
    """One job per ``(backend, n, k, device)`` holding its Ms (each worker start, a few seconds, paid once per
    shape), then the jobs with the most Ms split in halves while there are fewer jobs than ``processes``
    (every process busy)."""
    parts = [(key, tuple(ms)) for key, ms in calls.items() if ms]
    while len(parts) < processes and any(len(ms) > 1 for _, ms in parts):
        key, ms = max(parts, key=lambda part: len(part[1]))
        parts.remove((key, ms))
        parts += [(key, ms[: len(ms) // 2]), (key, ms[len(ms) // 2:])]
    return [JitJob(name, n, k, ms, act_dtype, device) for (name, n, k, device), ms in parts]


def compile_in_processes(jobs: Sequence[JitJob], processes: int, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Run ``jobs``, at most ``processes`` at once, each in a fresh ``python -m fp8select.jit_worker``;
    per job, in order, its fields and ``seconds``, and ``error`` when it failed (the worker's exit status
    and last line, or its time-out: then it is killed)."""
    pending = list(enumerate(jobs))
    running: list[tuple[int, JitJob, subprocess.Popen[bytes], Any, float]] = []
    results: dict[int, dict[str, Any]] = {}
    while pending or running:
        while pending and len(running) < max(processes, 1):
            index, job = pending.pop(0)
            log = tempfile.TemporaryFile()
            worker = subprocess.Popen([sys.executable, "-m", WORKER, json.dumps(asdict(job))],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
            running.append((index, job, worker, log, time.monotonic()))
        time.sleep(_POLL_S)
        for entry in list(running):
            index, job, worker, log, started = entry
            seconds = round(time.monotonic() - started, 2)
            if worker.poll() is None and seconds < timeout_s:
                continue
            running.remove(entry)
            if worker.returncode is None:
                worker.kill()
                worker.wait()
                results[index] = {**asdict(job), "seconds": seconds, "error": f"timed out after {timeout_s:.0f} s"}
            elif worker.returncode == 0:
                results[index] = {**asdict(job), "seconds": seconds}
            else:
                log.seek(0)
                last = (log.read().decode(errors="replace").strip().splitlines() or [""])[-1]
                results[index] = {**asdict(job), "seconds": seconds, "error": f"exit {worker.returncode}: {last[-300:]}"}
            log.close()
    return [results[index] for index in range(len(jobs))]
