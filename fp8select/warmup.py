"""Warm-up: run every kernel a layer's plan can use once, so CUDA-graph capture and serving never compile.

DeepGEMM and FlashInfer compile a kernel the first time they see a shape (2-5 s each on the
H200), Triton the first time it sees a launch configuration; with ``processes`` (default
``FP8SELECT_JIT_PROCESSES``, else none) the dense layers' compilers run in that many worker processes at
once first (:mod:`fp8select.jit_processes`). :func:`warmup` calls each
distinct layer (same shape, dtype, device and plan: the kernels are the same) with the
activation sizes of every route of its plan: by default both ends of each M bucket, or the
``ms`` an engine will capture. It logs ``fp8select.warmup_progress`` every few seconds on long
runs and one ``fp8select.warmup`` event with the totals.

A JIT library may pick different kernels for different M inside one bucket (DeepGEMM chooses
its tile by M); pass the exact batch sizes your engine captures as ``ms`` to cover them all.

MoE experts layers (:class:`~fp8select.moe.Fp8MoE`, or a :class:`~fp8select.nn.BlockFp8MoE` in the
module) are warmed the same way, per distinct shape and plan, with uniform random top-k routing at the
plan's top-k: every kernel a route of the plan launches (DeepGEMM's masked and contiguous GEMMs, the
Triton kernels at each bucket's configuration) is compiled before an engine captures its decode buckets.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp8select._log import get_logger
from fp8select.buckets import bucket_range
from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.jit_processes import compile_in_processes, jit_jobs, processes_wanted
from fp8select.kernels.moe_routing import uniform_routing
from fp8select.layer import Fp8Linear
from fp8select.moe import Fp8MoE

__all__ = ["WarmupReport", "warmup"]


@dataclass(frozen=True)
class WarmupReport:
    layers: int  # layers given
    distinct: int  # distinct (shape, dtype, device, plan): the ones actually run
    calls: int
    seconds: float
    workers: tuple[dict[str, Any], ...] = ()  # with processes: each worker's job and seconds or error


Layer = Fp8Linear | Fp8MoE


def _layers(target: Any) -> list[Layer]:
    if isinstance(target, Layer):
        return [target]
    if isinstance(target, torch.nn.Module):
        found = [getattr(m, name, None) for m in target.modules() for name in ("fp8_layer", "fp8_moe")]
        return [layer for layer in found if isinstance(layer, Layer)]
    if isinstance(target, Iterable) and not isinstance(target, (str, bytes)):
        items = list(target)
        if all(isinstance(t, Layer) for t in items):
            return items
    raise InvalidDtypeError(f"target: expected an Fp8Linear or Fp8MoE, an iterable of them or an nn.Module holding "
                            f"them, found {type(target).__name__}")


def _device_bytes(device: torch.device) -> int | None:
    """The memory of ``device`` (a GPU's, or the host's for the CPU), None where it is not known."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    return None


def _check_fits(layer: Layer, m: int, dtype: torch.dtype) -> None:
    """A typed error, before anything is allocated, for an M whose activation and output alone would
    not fit in the layer's device: no call of the layer could have that many rows."""
    total = _device_bytes(layer.device)
    if isinstance(layer, Fp8MoE):
        need, shape = 2 * m * layer.hidden * dtype.itemsize, f"H={layer.hidden}"
    else:
        need, shape = m * (layer.k * dtype.itemsize + layer.n * (layer.out_dtype or dtype).itemsize), \
            f"N={layer.n}, K={layer.k}"
    if total is not None and need > total:
        raise InvalidInputError(f"ms: expected sizes whose activation and output fit in {layer.device} "
                                f"({total / 2**30:.1f} GiB), found M={m}: {need / 2**30:.1f} GiB for {shape}")


def _same(layer: Layer) -> tuple[Any, ...]:
    """What makes two layers run the same kernels: shape, dtypes (the output's too), device and plan."""
    if isinstance(layer, Fp8MoE):
        plan = json.dumps(layer.main_plan.to_dict(), sort_keys=True, default=str)
        return ("moe", layer.experts, layer.hidden, layer.intermediate, layer.block_size, str(layer.device), plan)
    return (layer.n, layer.k, layer.block_size, layer.weight_dtype, layer.out_dtype, str(layer.device),
            layer.main_plan.fingerprint())


def _width(layer: Layer) -> int:
    return layer.hidden if isinstance(layer, Fp8MoE) else layer.k


def bucket_ms(buckets: Iterable[int]) -> list[int]:
    """The sizes a warm-up calls for ``buckets``: both ends of each (the last, unbounded one at its key)."""
    ms: set[int] = set()
    for bucket in buckets:
        lo, hi = bucket_range(bucket)
        ms.update((lo, hi if hi is not None else bucket))
    return sorted(ms)


def _default_ms(layer: Layer) -> list[int]:
    return bucket_ms(route.bucket for route in layer.main_plan.routes if route.backend is not None)


def warmup(target: Any, *, ms: Sequence[int] | None = None, dtype: torch.dtype = torch.bfloat16,
           progress: Callable[[str], None] | None = None, every_s: float = 5.0, processes: int | None = None) -> WarmupReport:
    """Call every distinct layer of ``target`` at each M of ``ms`` (default: both ends of every M bucket
    its plan routes) with ``dtype`` activations; returns what was run and how long it took.

    ``processes`` > 0: first compile the dense calls' JIT kernels (DeepGEMM, FlashInfer, Triton) in up
    to that many worker processes at once (:mod:`fp8select.jit_processes`; for cold caches), then
    make the calls here, which load them from the caches; None: ``FP8SELECT_JIT_PROCESSES`` of the
    layers' snapshot, else none."""
    if ms is not None and (not ms or not all(isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in ms)):
        raise InvalidInputError(f"ms: expected positive integers, found {ms!r}")
    if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 0):
        raise InvalidInputError(f"processes: expected an int >= 0, found {processes!r}")
    layers = _layers(target)
    if processes is None:
        processes = max((processes_wanted(layer.caps) for layer in layers if isinstance(layer, Fp8Linear)), default=0)
    if ms is not None:
        for layer in layers:
            _check_fits(layer, max(ms), dtype)
    distinct: dict[tuple[Any, ...], Layer] = {}
    for layer in layers:
        distinct.setdefault(_same(layer), layer)
    todo = [(layer, m) for layer in distinct.values() for m in (ms or _default_ms(layer))]
    log = get_logger()
    start = last = time.perf_counter()
    workers: tuple[dict[str, Any], ...] = ()
    if processes:
        jobs = jit_jobs(((layer, m) for layer, m in todo if isinstance(layer, Fp8Linear)), dtype, processes)
        workers = tuple(compile_in_processes(jobs, processes))
        log.info("fp8select.warmup_workers", jobs=len(jobs), failed=sum("error" in w for w in workers),
                 seconds=round(time.perf_counter() - start, 3))
    rows: dict[tuple[int, str], int] = {}
    for layer, m in todo:
        key = (_width(layer), str(layer.device))
        rows[key] = max(rows.get(key, 0), m)
    inputs: dict[tuple[int, str], torch.Tensor] = {}  # one activation per K (H) and device, sliced per M
    for done, (layer, m) in enumerate(todo, 1):
        key = (_width(layer), str(layer.device))
        if key not in inputs:
            inputs[key] = torch.randn(rows[key], key[0], device=layer.device, dtype=dtype)
        x = inputs[key]
        with torch.no_grad():
            if isinstance(layer, Fp8MoE):
                top_k = layer.main_plan.problem.top_k or 1
                weights, ids = uniform_routing(m, top_k, layer.experts, layer.device)  # -1 past E local experts
                layer.forward(x[:m], weights, ids)
            else:
                layer.forward(x[:m])
        now = time.perf_counter()
        if now - last >= every_s:
            last = now
            log.info("fp8select.warmup_progress", done=done, total=len(todo), seconds=round(now - start, 1))
            if progress is not None:
                progress(f"warm-up: {done}/{len(todo)} calls, {now - start:.1f} s")
    if todo and todo[0][0].device.type == "cuda":
        torch.cuda.synchronize()
    report = WarmupReport(len(layers), len(distinct), len(todo), time.perf_counter() - start, workers)
    log.info("fp8select.warmup", layers=report.layers, distinct=report.distinct, calls=report.calls,
             seconds=round(report.seconds, 3))
    return report
