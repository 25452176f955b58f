"""Measure the backends of a chain on this GPU and write the rows of a tuning table (``fp8select tune``).

Per layer shape (N, K) and M (one per bucket), each backend of the chain except ``reference``
is checked against an fp64 reference; Triton's launch configuration is found by timing a
search (:mod:`fp8select.kernels.triton_search`), starting from the configurations already
known for that point (any version's row, or the nearest measured shape's, fitted to this one), its
fastest few timed again together to pick from. Then the correct
backends are timed together as the whole op a user calls (bf16 in, activation quantization
included), CUDA-graph replay with the weights rotated past the L2, their replays interleaved
(:func:`fp8select.measure.timing.time_graphs`): those times are the table's. A row goes into the
group of its backend at the versions installed here (:func:`~fp8select.measured.table.backend_versions`);
rows the ``known`` table has for the same backend, versions, shape and bucket are skipped
unless ``force``: ``tune`` measures only what is missing; rows the ``done`` table has are skipped even with
``force`` (what a forced run cut short measured already: ``tune --force --resume``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fp8select.backends.base import Backend
from fp8select.buckets import m_bucket
from fp8select.guard import PASS_THROUGH, describe
from fp8select.measure import bench, timing
from fp8select.measured.model import Measurements
from fp8select.measured.table import backend_versions, new_table, shape_key
from fp8select.plan import fitted_config, gate
from fp8select.problem import Problem

__all__ = ["DEFAULT_TUNE_M", "tune", "tune_on_one_rank"]

DEFAULT_TUNE_M: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
BLOCK = (128, 128)
FINALISTS = 3
"""Triton configurations of a search timed again together, interleaved, to pick among (:func:`_search_triton`)."""


def _known_rows(table: Mapping[str, Any] | None) -> set[tuple[str, tuple[tuple[str, str], ...], str, str]]:
    rows: set[tuple[str, tuple[tuple[str, str], ...], str, str]] = set()
    for group in (table or {}).get("groups", ()):
        versions = tuple(sorted(group["versions"].items()))
        for shape, buckets in group["shapes"].items():
            rows.update((group["backend"], versions, shape, bucket) for bucket in buckets)
    return rows


def tune(selection: Any, shapes: Sequence[tuple[int, int]], ms: Sequence[int] = DEFAULT_TUNE_M, *,
         known: Mapping[str, Any] | None = None, force: bool = False, done: Mapping[str, Any] | None = None,
         replays: int = 30, max_configs: int = 10, budget_s: float = math.inf, backends: Sequence[str] | None = None,
         progress: Callable[[str], None] | None = None,
         on_shape: Callable[[dict[str, Any]], None] | None = None, only: Callable[[str, int], bool] | None = None,
         device: torch.device | str = "cuda") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Measure what ``known`` lacks (everything with ``force``) but what ``done`` holds, and return
    ``(table, rows)``.

    ``table`` holds only the new measurements (merge it into the cache's with
    :func:`~fp8select.measured.table.merge_tables`); ``rows`` every timing for the record.
    ``backends`` limits the measurement to those names (default: the chain but ``reference``).
    No new point is started after ``budget_s`` seconds; each point gets a fair share of what
    is left for its Triton search. ``on_shape(table)`` is called after each shape, so a caller
    can save what was measured so far; ``only(backend, m)`` False skips that point.
    """
    start = time.monotonic()
    caps = selection.capabilities
    chain: list[Backend] = [b for b in selection.chain if b.name != "reference"
                            and (backends is None or b.name in backends)]
    table = new_table(caps.device_name or "unknown")
    groups: dict[str, dict[str, Any]] = {}
    skip = _known_rows(done) | (set() if force else _known_rows(known))
    versions = {b.name: backend_versions(caps, b.packages) for b in chain}
    seeds = selection.measurements or (Measurements(caps.device_name or "", [known], versions) if known else None)
    device = torch.device(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    rows: list[dict[str, Any]] = []
    gen = torch.Generator(device=device).manual_seed(1)
    points_left = len(shapes) * len(ms)
    for n, k in shapes:
        todo = {b.name: [m for m in ms if (b.name, tuple(sorted(versions[b.name].items())), shape_key(n, k),
                                          str(m_bucket(m))) not in skip and (only is None or only(b.name, m))]
                for b in chain}
        if not any(todo.values()):
            points_left -= len(ms)
            continue
        base, scale = bench.random_weight(n, k, device, gen)
        reference = bench.reference_for(base, scale, BLOCK)
        weights = bench.rotated(base)
        prepared: dict[str, list[Any]] = {}
        for b in chain:
            if todo[b.name] and gate(b, Problem(n, k, BLOCK), caps).ok:
                try:
                    prepared[b.name] = [b.prepare(w, scale, BLOCK, caps) for w in weights]
                except PASS_THROUGH:
                    raise
                except BaseException as exc:  # noqa: BLE001 - recorded; the other backends go on
                    rows.append({"n": n, "k": k, "backend": b.name, "error": f"prepare: {type(exc).__name__}: {exc}"[:300]})
        for m in ms:
            left = budget_s - (time.monotonic() - start)
            points_left -= 1
            if left <= 0:
                rows.append({"n": n, "k": k, "m": m, "skipped": "budget"})
                continue
            deadline = time.monotonic() + left / (points_left + 1)
            wanted = [b for b in chain if b.name in prepared and m in todo[b.name]
                      and gate(b, Problem(n, k, BLOCK, m), caps).ok]
            if not wanted:
                continue
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
            ref = reference(x)
            found = {}
            for b in wanted:
                candidate = _candidate(b, prepared[b.name], x, ref, n, k, m, caps, replays=replays, sms=sms,
                                       max_configs=max_configs, deadline=deadline, rows=rows, seeds=seeds)
                if candidate is not None:
                    found[b.name] = candidate
            # The table's times: the point's correct backends (Triton at the configuration its search found)
            # timed together, interleaved, so that no backend gains from its place in the order.
            errors: dict[str, str] = {}
            times = timing.time_graphs({name: [functools.partial(call, x) for call in calls]
                                       for name, (calls, _) in found.items()}, replays, errors=errors)
            for name, (_, config) in found.items():
                if name in errors:
                    rows.append({"n": n, "k": k, "m": m, "backend": name, "error": errors[name]})
                    continue
                us = times[name].median_us
                row: dict[str, Any] = {"us": round(us, 3)}
                if config is not None:
                    row["config"] = config.to_dict()
                rows.append({"n": n, "k": k, "m": m, "backend": name, **row, "correct": True, "final": True})
                group = groups.get(name)
                if group is None:
                    group = groups[name] = {"backend": name, "versions": versions[name], "shapes": {}}
                    table["groups"].append(group)
                group["shapes"].setdefault(shape_key(n, k), {})[str(m_bucket(m))] = row
            if progress is not None:
                timed = [r for r in rows if r.get("n") == n and r.get("k") == k and r.get("m") == m and r.get("final")]
                progress(f"N={n} K={k} M={m}: " + ", ".join(f"{r['backend']} {r['us']:.1f}us" for r in timed))
        del prepared, weights, reference
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if on_shape is not None:
            on_shape(table)
    return table, rows


def _candidate(backend: Backend, per_copy: list[Any], x: torch.Tensor, ref: torch.Tensor, n: int, k: int, m: int,
               caps: Any, *, replays: int, sms: int, max_configs: int, deadline: float, rows: list[dict[str, Any]],
               seeds: Measurements | None) -> tuple[list[Callable[[torch.Tensor], torch.Tensor]], Any] | None:
    """One backend at one point: its calls (one per weight copy) and Triton's configuration, when correct."""

    def calls(config: Any = None) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        extra = {} if config is None else {"config": config}
        return [functools.partial(backend.run, p, input_scale=None, bias=None, out_dtype=torch.bfloat16, caps=caps,
                                  **extra) for p in per_copy]

    def timed(config: Any) -> float | None:
        layers = calls(config)
        if bench.checked_call(layers[0], x, ref) is None:
            return None
        return timing.time_graph([functools.partial(layer, x) for layer in layers], replays).median_us

    def together(configs: Sequence[Any], errors: dict[str, str]) -> list[float | None]:
        columns = {str(i): [functools.partial(layer, x) for layer in calls(c)] for i, c in enumerate(configs)}
        times = timing.time_graphs(columns, replays, errors=errors)
        return [times[str(i)].median_us if str(i) in times else None for i in range(len(configs))]

    if backend.name == "triton":
        config = _search_triton(backend, timed, n, k, m, sms=sms, max_configs=max_configs, deadline=deadline, rows=rows,
                                seeds=seeds, device=x.device, together=together)
        return None if config is None else (calls(config), config)
    try:
        correct = bench.checked_call(calls()[0], x, ref) is not None
    except PASS_THROUGH:
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded, the others go on
        rows.append({"n": n, "k": k, "m": m, "backend": backend.name, "error": describe(exc)})
        return None
    if not correct:
        rows.append({"n": n, "k": k, "m": m, "backend": backend.name, "correct": False})
        return None
    return calls(), None


def _search_triton(backend: Backend, timed: Callable[[Any], float | None], n: int, k: int, m: int, *, sms: int,
                   max_configs: int, deadline: float, rows: list[dict[str, Any]],
                   seeds: Measurements | None, device: torch.device,
                   together: Callable[[Sequence[Any], dict[str, str]], list[float | None]] | None = None) -> Any:
    """The fastest Triton configuration (None when none ran correctly): the known ones for this point first,
    then the search's (the wgmma path only where it runs its own kernel: elsewhere it would time the gemm
    path's again). The search times one configuration after another, where the same work moves by several
    percent with its place in the order; so the :data:`FINALISTS` fastest are timed again ``together``
    (interleaved; one that fails there is left out, its error recorded under its index), and the fastest
    there is the pick."""
    from fp8select.kernels import triton_search
    from fp8select.kernels.triton_config import PATHS, TritonConfig
    from fp8select.kernels.triton_device import wgmma_runs

    paths = None if wgmma_runs(device) else tuple(p for p in PATHS if p != "wgmma")

    results: list[tuple[float, TritonConfig]] = []

    def time_config(config: TritonConfig) -> float | None:
        try:
            us = timed(config)
        except PASS_THROUGH:
            raise
        except BaseException as exc:  # noqa: BLE001 - a configuration that fails to compile or launch is skipped
            rows.append({"n": n, "k": k, "m": m, "backend": "triton", "config": config.to_dict(),
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
            return None
        rows.append({"n": n, "k": k, "m": m, "backend": "triton", "config": config.to_dict(), "us": us})
        if us is not None:
            results.append((us, config))
        return us

    known = seeds.estimate("triton", n, k, m_bucket(m)) if seeds is not None else None
    if known is not None and known.config is not None:  # a borrowed one fitted to this shape, as the plan does
        time_config(fitted_config(backend, known, Problem(n, k, BLOCK), m))
    if max_configs > len(results):
        triton_search.search(n, k, m, time_config, sms=sms, max_configs=max_configs - len(results), deadline=deadline,
                             paths=paths)
    finalists = list(dict.fromkeys(config for _, config in sorted(results, key=lambda r: r[0])))[:FINALISTS]
    if together is None or len(finalists) < 2:
        return finalists[0] if finalists else None
    errors: dict[str, str] = {}
    again = together(finalists, errors)
    rows.append({"n": n, "k": k, "m": m, "backend": "triton", "finalists": [
        {"config": config.to_dict(), "us": us, **({"error": errors[str(i)]} if str(i) in errors else {})}
        for i, (config, us) in enumerate(zip(finalists, again, strict=True))]})
    timed_again = [(us, i) for i, us in enumerate(again) if us is not None]
    return finalists[min(timed_again)[1]] if timed_again else finalists[0]


def tune_on_one_rank(selection: Any, shapes: Sequence[tuple[int, int]], group: Any = None, src: int = 0,
                     **kwargs: Any) -> dict[str, Any]:
    """:func:`tune` on rank ``src`` of a ``torch.distributed`` group only; every rank gets its table.

    The GPUs of one node are the same model, so measuring once and broadcasting saves every
    other rank the time and guarantees one set of plans (a collective).
    """
    from fp8select.distributed import measure_on_one_rank

    return measure_on_one_rank(lambda: tune(selection, shapes, **kwargs)[0], group, src)
