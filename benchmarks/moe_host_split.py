"""Where an eager MoE route's host time goes, step by step (GPU only).

Usage (repository root): ``python -m benchmarks.moe_host_split --out DIR``; writes ``DIR/moe_host_split.json``.

Every accepted route pinned at M 1 / 16 / 64 of Qwen3-30B-A3B and DeepSeek-V3 with 32 experts (uniform
routing, bf16, each route's default configuration), as ``benchmarks.moe_host``'s ``pinned`` phase runs
them: host microseconds per call (the median of :data:`ROUNDS` rounds of :data:`CALLS` calls, no
synchronize inside), then the same routes prepared and bound again with each step wrapped in a timer
(:data:`STEPS`), timed over :data:`WRAPPED_ROUNDS` rounds:
the routing, the helpers the vendor routes run around their GEMMs (slot quantization, silu*up, the
weighted sum), each Triton launch made through a bound kernel (``bound:`` and the kernel's name), each
vendor entry point (``vendor:``) and torch's allocations (``torch.``). A step's time includes what it calls
(a helper's includes its launch and its allocations), and each wrapped call adds the wrapper's own cost
(``wrapper_us``, measured): the split says where a call's time goes, the unwrapped rounds what it costs. A
replayed call (every route's from its third at an M) runs none of the routing or helpers, so its split holds
the vendor's calls and torch's allocations only.
The kept run: ``benchmarks/results/moe_host_split.json`` (docs/moe-measurements.md, "Host time").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda, run_head
from benchmarks.distill_limits import json_lines
from benchmarks.host_overhead import _round_us
from benchmarks.moe import SHAPES, _columns, _launch, _routing, _weights

SPLIT_SHAPES = ("qwen3-30b-a3b", "deepseek-v3-e32")
SPLIT_M = (1, 16, 64)
CALLS = 20
"""Calls per round: as ``moe_host``'s pinned rounds, few enough that CUDA's queue never holds the host back."""
ROUNDS = 9
WRAPPED_ROUNDS = 5

STEPS = {
    "fp8select.backends.moe_deepgemm": ("route", "row_of_slot", "row_experts", "masked_rows", "masked_counts",
                                        "empty_scale", "_masked_scale"),
    "fp8select.kernels.moe_triton": ("quantize_slots", "silu_mul_quant", "weighted_sum"),
    "torch": ("empty", "empty_strided", "full", "zeros"),
}
"""The functions timed, by module: looked up by the routes at call time (the helpers when a route is bound), so
wrapping the module's attribute times every call."""


class Steps:
    """Inclusive host seconds and calls of wrapped callables, counted while :attr:`on`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.on = False

    def add(self, label: str, seconds: float) -> None:
        self.seconds[label] += seconds
        self.calls[label] += 1

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed under ``label``."""
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - start)
        return timed

    def per_call(self, calls: int) -> dict[str, dict[str, float]]:
        """Microseconds and calls of each step per call of the route (``calls`` of them counted), the most first."""
        order = sorted(self.seconds, key=lambda label: -self.seconds[label])
        return {"split_us": {label: round(self.seconds[label] / calls * 1e6, 2) for label in order},
                "calls": {label: round(self.calls[label] / calls, 2) for label in order}}

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()


@contextlib.contextmanager
def wrapped(steps: Steps, modules: dict[str, tuple[str, ...]]) -> Iterator[None]:
    """``modules``' functions, each bound kernel's launch and each vendor entry point a route prepares (the MoE
    vendor backends' ``require``) timed by ``steps`` while inside; every attribute put back after."""
    import importlib

    from fp8select.backends import _vendor
    from fp8select.kernels import triton_launch

    saved: list[tuple[Any, str, Any]] = []

    def put(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def require(module: str, names: Any, *args: Any, **kwargs: Any) -> Any:
        entry = _vendor.require(module, names, *args, **kwargs)
        if not callable(entry.fn) or isinstance(entry.fn, type):
            return entry
        return _vendor.EntryPoint(steps.wrap(f"vendor:{entry.name}", entry.fn), entry.name, entry.module)

    launch = triton_launch.BoundKernel.__call__

    def bound(self: Any, *args: Any, **kwargs: Any) -> None:
        if not steps.on:
            return launch(self, *args, **kwargs)
        start = time.perf_counter()
        try:
            return launch(self, *args, **kwargs)
        finally:
            steps.add(f"bound:{self._fn.fn.__name__}", time.perf_counter() - start)

    try:
        for module_name, names in modules.items():
            module = importlib.import_module(module_name)
            for name in names:
                if hasattr(module, name):
                    put(module, name, steps.wrap(f"{module_name.rsplit('.', 1)[-1]}.{name}", getattr(module, name)))
        for vendor in ("fp8select.backends.moe_deepgemm", "fp8select.backends.moe_cutlass"):
            put(importlib.import_module(vendor), "require", require)
        put(triton_launch.BoundKernel, "__call__", bound)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def wrapper_us(steps: Steps, calls: int = 20000) -> float:
    """Microseconds one wrapped call adds (a wrapped no-op, counted)."""
    nop = steps.wrap("nop", lambda: None)
    steps.on = True
    start = time.perf_counter()
    for _ in range(calls):
        nop()
    elapsed = time.perf_counter() - start
    steps.on = False
    steps.clear()
    return round(elapsed / calls * 1e6, 3)


def split(selection: Any, name: str, steps: Steps) -> list[dict[str, Any]]:
    """The rows of one shape: every route at every M timed as the library runs it, then prepared and bound
    again inside :func:`wrapped` and timed step by step."""
    import torch

    from fp8select.backends.moe import MoeProblem

    e, h, i, k = SHAPES[name]
    problem, caps = MoeProblem(e, h, i, k), selection.capabilities
    weights = _weights(e, h, i, seed=3)
    inputs = {}
    for m in SPLIT_M:
        w, ids = _routing(m, k, e, "uniform", seed=5)
        inputs[m] = (torch.randn(m, h, device="cuda").to(torch.bfloat16), w, ids)

    def calls(columns: dict[str, Any]) -> Iterator[tuple[tuple[int, str], Callable[[], Any]]]:
        for m in SPLIT_M:
            for route, column in columns.items():
                call = functools.partial(_launch(column, problem, m, caps), *inputs[m])
                for _ in range(3):  # compiled, bound, and (the Triton route) recorded for its replay
                    call()
                yield (m, route), call

    rows: dict[tuple[int, str], dict[str, Any]] = {}
    columns = _columns(selection, problem, weights, caps, with_reference=False)
    for (m, route), call in calls(columns):
        host = [_round_us(call, calls=CALLS) for _ in range(ROUNDS)]
        rows[m, route] = {"shape": name, "m": m, "route": route, "host_us": round(statistics.median(host), 1),
                          "fastest_round_us": round(min(host), 1)}
    del columns
    with wrapped(steps, STEPS):
        columns = _columns(selection, problem, weights, caps, with_reference=False)
        for key, call in calls(columns):
            steps.clear()
            steps.on = True
            timed = [_round_us(call, calls=CALLS) for _ in range(WRAPPED_ROUNDS)]
            steps.on = False
            rows[key] |= {"wrapped_us": round(statistics.median(timed), 1), **steps.per_call(CALLS * WRAPPED_ROUNDS)}
            print(rows[key], flush=True)
        del columns
    torch.cuda.empty_cache()
    return list(rows.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_host_split", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for moe_host_split.json")
    args = parser.parse_args(argv)
    require_cuda("moe_host_split")

    import fp8select

    start = time.monotonic()
    steps = Steps()
    selection = fp8select.resolve(plugins=False)
    head = run_head(selection, "python -m benchmarks.moe_host_split --out DIR") | {"wrapper_us": wrapper_us(steps)}
    rows = [row for name in SPLIT_SHAPES for row in split(selection, name, steps)]
    head["seconds"] = round(time.monotonic() - start, 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "moe_host_split.json").write_text(json_lines(head, {"routes": rows}), encoding="utf-8")


if __name__ == "__main__":
    main()
