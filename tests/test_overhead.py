"""fp8select's own per-call host cost, against a backend that does nothing but allocate its output.

fp8select's own cost is a call's time less the backend's ``run()`` time. As ratios measured in
one process (the best of several interleaved rounds), so a slow or busy machine slows both sides
alike: for the prepared layer at most 1.5x the backend's ``run()`` (inference mode and not), for
the module 1.8x, for the drop-in ``linear`` on the same tensors 2x. Before the call path was bound
at prepare time these were about 6x, 9x and 190x.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch
from fp64_reference import random_problem
from matrix import MATRIX

from fp8select import Backend, Placement, PreparedWeight, hookimpl, resolve
from fp8select.nn import BlockFp8Linear
from fp8select.probes import DeviceKind, Probe

CPU = MATRIX["cpu-only"][0]
N, K, M = 256, 512, 16


class DoNothing(Backend):
    """Runs anywhere on CPU and returns an uninitialised output, allocated as a real adapter allocates
    it (on the input's device): what is left is fp8select's own cost."""

    name = "do-nothing"
    requires: ClassVar[tuple[Probe, ...]] = (DeviceKind(("cpu",)),)
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Any) -> torch.Tensor:
        return torch.empty((x.shape[0], prepared.n), dtype=out_dtype, device=x.device)


class _Plugin:
    @hookimpl
    def fp8select_backends(self) -> list[object]:
        return [Placement(DoNothing(), before="reference")]


def _own_cost(candidate: Callable[[], object], baseline: Callable[[], object], attempts: int = 3) -> float:
    """The least of ``attempts`` measurements of :func:`_own_ratio`: a regression shows in every one, a busy
    machine's disturbance rarely in all (on a busy two-core machine one in a dozen measurements of the
    drop-in came out at 2.5x against a typical 1.2x)."""
    return min(_own_ratio(candidate, baseline) for _ in range(attempts))


def _own_ratio(candidate: Callable[[], object], baseline: Callable[[], object], calls: int = 400, rounds: int = 15) -> float:
    """``candidate``'s time less ``baseline``'s, over ``baseline``'s: best of rounds, rounds interleaved, with
    the garbage collector paused while they run (as ``timeit`` does: a collection landing in one side's
    round moved the module's ratio between 0.8 and 1.85 on a busy two-core machine)."""
    def per_call(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - start

    for fn in (candidate, baseline):  # warm up (the first calls of a dtype build its plan)
        per_call(fn)
    best_c = best_b = float("inf")
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            best_c = min(best_c, per_call(candidate))
            best_b = min(best_b, per_call(baseline))
    finally:
        if collecting:
            gc.enable()
    return (best_c - best_b) / best_b


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    selection = resolve(CPU, plugins=[_Plugin()])
    assert selection.backend.name == "do-nothing"
    w, s = random_problem(N, K, seed=1)
    layer = selection.prepare(w, s)
    assert layer.backends == ("do-nothing",)
    backend, prepared = selection.backend, layer.prepared["do-nothing"]
    x = torch.randn(M, K, dtype=torch.bfloat16)

    def run() -> torch.Tensor:
        return backend.run(prepared, x, input_scale=None, bias=None, out_dtype=torch.bfloat16, caps=CPU)

    module = BlockFp8Linear(K, N, bias=False, selection=selection)
    module.load_state_dict({"weight": w, "weight_scale_inv": s})
    return {"selection": selection, "layer": layer, "module": module, "x": x, "w": w, "s": s, "run": run}


@pytest.mark.parametrize("inference_mode", [False, True])
def test_a_layer_call_costs_at_most_1_5x_the_backend_run_more(setup: dict[str, Any], inference_mode: bool) -> None:
    layer, x = setup["layer"], setup["x"]
    with torch.inference_mode(inference_mode):
        assert layer(x).shape == (M, N)
        ratio = _own_cost(lambda: layer(x), setup["run"])
    assert ratio <= 1.5, f"a layer call's own cost {ratio:.2f}x the backend's run()"


def test_a_module_call_costs_at_most_1_8x_the_backend_run_more(setup: dict[str, Any]) -> None:
    module, x = setup["module"], setup["x"]
    with torch.no_grad():
        assert module(x).shape == (M, N)
        ratio = _own_cost(lambda: module(x), setup["run"])
    assert ratio <= 1.8, f"a module call's own cost {ratio:.2f}x the backend's run()"


def test_the_drop_in_call_costs_at_most_2x_the_backend_run_more(setup: dict[str, Any]) -> None:
    selection, x, w, s = setup["selection"], setup["x"], setup["w"], setup["s"]
    block = [128, 128]
    assert selection.linear(x, w, block, s).shape == (M, N)
    ratio = _own_cost(lambda: selection.linear(x, w, block, s), setup["run"])
    assert ratio <= 2.0, f"a drop-in linear call's own cost {ratio:.2f}x the backend's run()"


def test_the_checked_path_is_what_the_fast_path_would_have_run(setup: dict[str, Any]) -> None:
    """An input the fast path declines (non-contiguous) still runs, through the full checks."""
    layer = setup["layer"]
    x = torch.randn(K, M, dtype=torch.bfloat16).t()
    assert not x.is_contiguous() and layer(x).shape == (M, N)
