"""What the MoE experts layer costs eagerly, next to the launches its plan binds (GPU only).

Usage (repository root): ``python -m benchmarks.moe_host --out DIR``; writes ``DIR/moe_host.json``.

* ``host``: host microseconds per eager call at M 16 (``perf_counter`` over a few hundred calls with no
  synchronize inside, median of rounds taken in turn, as ``benchmarks.host_overhead`` times the dense
  layer): the layer as prepared (its ids' check reads a flag back, so a call also waits for the GPU),
  the layer with ``check_ids=False``, and the bucket's bound launch called directly (what the layer runs,
  without it around); and the op's GPU time under a CUDA graph.
* ``pinned``: every accepted route pinned at M 1 / 16 / 64 (whatever the plan runs), host microseconds per
  call (rounds of :data:`PINNED_CALLS` calls) as the library runs it (every route replayed,
  :class:`fp8select.kernels.call_replay.CallReplays`; every Triton launch bound, ``triton_launch.launch``)
  and made afresh with every Triton launch through Triton's dispatcher (as before either), and its GPU time
  under a CUDA graph.
* ``stack``: eager end to end, :data:`STACK_LAYERS` MoE layers of one shape in a row (their own weights,
  one routing), milliseconds per pass: the same three paths, and the layers under a CUDA graph (their GPU
  time, the floor). Each checked layer waits for the work queued before it, so the GPU idles while the host
  launches what follows; unchecked, the host runs ahead.

Uniform routing; bf16 activations; the shipped table's plans. The kept run:
``benchmarks/results/moe_host.json`` (docs/moe.md, "Host time").
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from benchmarks._cuda import require_cuda, run_head
from benchmarks.distill_limits import json_lines
from benchmarks.host_overhead import _graph_ms, _interleaved, _pass_ms, _round_us
from benchmarks.moe import SHAPES, _routing, _weights

HOST_SHAPES = ("qwen3-30b-a3b", "deepseek-v3-e32")
HOST_M = 16
STACK_SHAPE = "deepseek-v3-e32"
STACK_LAYERS = 4
STACK_M = (16, 128, 512)
STACK_ROUNDS = 21
PINNED_M = (1, 16, 64)
PINNED_CALLS = 20
"""Calls per round of ``pinned``: their launches (six to eight a call) stay well within what CUDA queues, so that
the host is not held back by a GPU that takes longer per call (a round of 300 calls at DeepSeek-V3's M 16 was)."""


def _paths(selection: Any, weights: Any, top_k: int) -> tuple[Any, Any]:
    """The layer as ``prepare_moe`` makes it, and the same weights with ``check_ids=False``."""
    return selection.prepare_moe(*weights, top_k=top_k), selection.prepare_moe(*weights, top_k=top_k, check_ids=False)


def _bound(layer: Any, x: Any, top_k: int) -> Callable[..., Any]:
    """The launch ``layer`` binds to ``x``'s M bucket (what its eager call runs after its checks)."""
    from fp8select.buckets import bucket_index

    return layer._launches[(x.dtype, top_k)][bucket_index(x.shape[0])]


def _route(layer: Any, m: int) -> str:
    route = layer.main_plan.route(m)
    return f"{route.backend}/{route.layout}"


def host(selection: Any, name: str) -> dict[str, Any]:
    import torch

    e, h, i, k = SHAPES[name]
    checked, unchecked = _paths(selection, _weights(e, h, i, seed=3), k)
    w, ids = _routing(HOST_M, k, e, "uniform", seed=5)
    x = torch.randn(HOST_M, h, device="cuda").to(torch.bfloat16)
    launch = _bound(unchecked, x, k)
    calls: dict[str, Callable[[], object]] = {
        "layer": functools.partial(checked, x, w, ids),
        "layer, check_ids=False": functools.partial(unchecked, x, w, ids),
        "bound launch alone": functools.partial(launch, x, w, ids)}
    fastest: dict[str, float] = {}
    row: dict[str, Any] = {"shape": name, "m": HOST_M, "route": _route(unchecked, HOST_M),
                           "host_us": _interleaved(calls, _round_us, mins=fastest), "fastest_round_us": fastest,
                           "graphed_gpu_us": round(_graph_ms(calls["bound launch alone"]) * 1e3, 2)}
    print(json.dumps(row), flush=True)
    del checked, unchecked
    torch.cuda.empty_cache()
    return row


def _dispatcher_round(fn: Callable[[], object]) -> float:
    """:func:`_round_us` of ``fn`` with every Triton launch of fp8select's made through Triton's dispatcher (as
    before ``triton_launch.launch`` bound them): its bound kernels set aside for the round."""
    from fp8select.kernels import triton_launch

    kept, most = triton_launch._BOUND, triton_launch.LAUNCHES_MAX
    triton_launch._BOUND, triton_launch.LAUNCHES_MAX = {}, 0
    try:
        return _round_us(fn, calls=PINNED_CALLS)
    finally:
        triton_launch._BOUND, triton_launch.LAUNCHES_MAX = kept, most


def _its_figure(round_of: Callable[[], object]) -> float:
    """What a round that times itself returns (its microseconds per call)."""
    return cast(float, round_of())


def pinned(selection: Any, name: str) -> list[dict[str, Any]]:
    """Every accepted route pinned at :data:`PINNED_M` (its default configuration per M), whatever the plan
    runs: host microseconds per call as the library runs it (every route replayed from its third call at an M,
    every Triton launch bound) and made afresh with every Triton launch through Triton's dispatcher, and its
    GPU time under a CUDA graph."""
    import torch

    from benchmarks.moe import _columns, _launch
    from fp8select.backends.moe import MoeProblem, Replayed

    e, h, i, k = SHAPES[name]
    problem = MoeProblem(e, h, i, k)
    columns = _columns(selection, problem, _weights(e, h, i, seed=3), selection.capabilities, with_reference=False)
    rows = []
    for m in PINNED_M:
        w, ids = _routing(m, k, e, "uniform", seed=5)
        x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
        for route, column in columns.items():
            launch = _launch(column, problem, m, selection.capabilities)
            call = functools.partial(launch, x, w, ids)
            # Every route's calls made afresh: the path of a replay's first call.
            if route == "triton/sorted":
                backend, prepared, layout = column
                afresh = functools.partial(prepared._launch, x, w, ids, backend.default_config(problem, layout, m), None)
            else:
                afresh = functools.partial(launch._launch, x, w, ids, None) if isinstance(launch, Replayed) else call
            calls: dict[str, Callable[[], object]] = {
                "library": functools.partial(_round_us, call, calls=PINNED_CALLS),
                "through the dispatcher": functools.partial(_dispatcher_round, afresh)}
            fastest: dict[str, float] = {}
            row: dict[str, Any] = {"shape": name, "m": m, "route": route,
                                   "host_us": _interleaved(calls, _its_figure, rounds=STACK_ROUNDS, mins=fastest),
                                   "fastest_round_us": fastest,
                                   "graphed_gpu_us": round(_graph_ms(call) * 1e3, 2)}
            row["library_vs_dispatcher"] = round(row["host_us"]["library"] / row["host_us"]["through the dispatcher"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    del columns
    torch.cuda.empty_cache()
    return rows


def _run(calls: list[Callable[..., Any]], *args: Any) -> list[Any]:
    return [call(*args) for call in calls]


def stack(selection: Any) -> list[dict[str, Any]]:
    import torch

    e, h, i, k = SHAPES[STACK_SHAPE]
    layers = [_paths(selection, _weights(e, h, i, seed=20 + j), k) for j in range(STACK_LAYERS)]
    rows = []
    for m in STACK_M:
        w, ids = _routing(m, k, e, "uniform", seed=m + 7)
        x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
        bound = [_bound(unchecked, x, k) for _, unchecked in layers]

        passes: dict[str, Callable[[], object]] = {
            "layer_eager_ms": functools.partial(_run, [checked for checked, _ in layers], x, w, ids),
            "unchecked_eager_ms": functools.partial(_run, [unchecked for _, unchecked in layers], x, w, ids),
            "bound_launches_eager_ms": functools.partial(_run, bound, x, w, ids)}
        fastest: dict[str, float] = {}
        row: dict[str, Any] = {"shape": STACK_SHAPE, "layers": STACK_LAYERS, "m": m,
                               "route": _route(layers[0][1], m)}
        row |= _interleaved(passes, lambda fn: _pass_ms(fn, rounds=1), rounds=STACK_ROUNDS, mins=fastest, digits=4)
        row["fastest_round_ms"] = fastest
        row["graphed_ms"] = _graph_ms(passes["unchecked_eager_ms"])
        row["layer_vs_unchecked"] = round(row["layer_eager_ms"] / row["unchecked_eager_ms"], 3)
        row["unchecked_vs_bound_launches"] = round(row["unchecked_eager_ms"] / row["bound_launches_eager_ms"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    del layers
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_host", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for moe_host.json")
    args = parser.parse_args(argv)
    require_cuda("moe_host")

    import fp8select

    start = time.monotonic()
    selection = fp8select.resolve(plugins=False)
    head = run_head(selection, "python -m benchmarks.moe_host --out DIR")
    hosts = [host(selection, name) for name in HOST_SHAPES]
    pins = [row for name in HOST_SHAPES for row in pinned(selection, name)]
    stacks = stack(selection)
    head["seconds"] = round(time.monotonic() - start, 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    sections = {"host": hosts, "pinned": pins, "stack": stacks}
    (Path(args.out) / "moe_host.json").write_text(json_lines(head, sections), encoding="utf-8")


if __name__ == "__main__":
    main()
