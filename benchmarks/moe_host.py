"""What the MoE experts layer costs eagerly, next to the launches its plan binds (GPU only).

Usage (repository root): ``python -m benchmarks.moe_host --out DIR``; writes ``DIR/moe_host.json``.

* ``host``: host microseconds per eager call at M 16 (``perf_counter`` over a few hundred calls with no
  synchronize inside, median of rounds taken in turn, as ``benchmarks.host_overhead`` times the dense
  layer): the layer as prepared (its ids' check reads a flag back, so a call also waits for the GPU),
  the layer with ``check_ids=False``, and the bucket's bound launch called directly (what the layer runs,
  without it around); and the op's GPU time under a CUDA graph.
* ``triton_replay``: the Triton route pinned at M 1 / 16 / 64 (whatever the plan runs), host microseconds per
  call (rounds of :data:`REPLAY_CALLS` calls) replayed (:class:`fp8select.kernels.call_replay.CallReplays`)
  and with its launches made afresh through Triton's dispatcher (as before the op replayed them), and its
  GPU time under a CUDA graph.
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
from typing import Any

from benchmarks._cuda import require_cuda
from benchmarks.distill_limits import json_lines
from benchmarks.host_overhead import _graph_ms, _interleaved, _pass_ms, _round_us
from benchmarks.moe import SHAPES, _routing, _weights

HOST_SHAPES = ("qwen3-30b-a3b", "deepseek-v3-e32")
HOST_M = 16
STACK_SHAPE = "deepseek-v3-e32"
STACK_LAYERS = 4
STACK_M = (16, 128, 512)
STACK_ROUNDS = 21
REPLAY_M = (1, 16, 64)
REPLAY_CALLS = 20
"""Calls per round of ``triton_replay``: their launches (six a call) stay well within what CUDA queues, so that
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
    calls = {"layer": functools.partial(checked, x, w, ids),
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


def triton_replay(selection: Any, name: str) -> list[dict[str, Any]]:
    """The Triton route pinned (its default configuration per M), whatever the plan runs: host microseconds per
    call replayed (the op's own path from its third call at an M) and with its launches made afresh through
    Triton's dispatcher (as before the op replayed them), and its GPU time under a CUDA graph."""
    import torch

    from fp8select.backends.moe import MoeProblem, TritonMoe
    from fp8select.kernels.moe_triton import TritonExperts

    e, h, i, k = SHAPES[name]
    experts = TritonExperts(*_weights(e, h, i, seed=3))
    rows = []
    for m in REPLAY_M:
        w, ids = _routing(m, k, e, "uniform", seed=5)
        x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
        config = TritonMoe().default_config(MoeProblem(e, h, i, k), "sorted", m)
        calls = {"replayed": functools.partial(experts, x, w, ids, config),
                 "launched afresh": functools.partial(experts._launch, x, w, ids, config, None)}
        fastest: dict[str, float] = {}
        per_round = functools.partial(_round_us, calls=REPLAY_CALLS)
        row: dict[str, Any] = {"shape": name, "m": m, "host_us": _interleaved(calls, per_round, rounds=STACK_ROUNDS,
                                                                              mins=fastest),
                               "fastest_round_us": fastest,
                               "graphed_gpu_us": round(_graph_ms(calls["replayed"]) * 1e3, 2)}
        row["replayed_vs_afresh"] = round(row["host_us"]["replayed"] / row["host_us"]["launched afresh"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    del experts
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

        passes = {"layer_eager_ms": functools.partial(_run, [checked for checked, _ in layers], x, w, ids),
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
    import torch
    import triton

    import fp8select

    start = time.monotonic()
    selection = fp8select.resolve(plugins=False)
    head = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "packages": dict(selection.capabilities.packages), "command": "python -m benchmarks.moe_host --out DIR"}
    hosts = [host(selection, name) for name in HOST_SHAPES]
    replays = [row for name in HOST_SHAPES for row in triton_replay(selection, name)]
    stacks = stack(selection)
    head["seconds"] = round(time.monotonic() - start, 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    sections = {"host": hosts, "triton_replay": replays, "stack": stacks}
    (Path(args.out) / "moe_host.json").write_text(json_lines(head, sections), encoding="utf-8")


if __name__ == "__main__":
    main()
