"""CUDA-graph timing of calls: per-call medians over graph replays, several columns interleaved.

What ``bench``, ``tune`` and the benchmark scripts time with (BENCHMARKING.md: CUDA-graph
replay, warm-up first, median with min and max). Several columns are timed together, their
replays interleaved in a shuffled order, so that no column gains from its place in the order.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp8select.guard import PASS_THROUGH, describe

__all__ = ["Timing", "replay_order", "time_graph", "time_graphs"]


@dataclass(frozen=True)
class Timing:
    median_us: float
    min_us: float
    max_us: float

    def to_dict(self) -> dict[str, float]:
        return {"median_us": round(self.median_us, 3), "min_us": round(self.min_us, 3), "max_us": round(self.max_us, 3)}


def time_graph(calls: Sequence[Callable[[], object]], replays: int = 50, *, warmups: int = 2) -> Timing:
    """Per-call time of ``calls`` captured into one CUDA graph, over ``replays`` replays.

    The calls first run ``warmups`` times on a side stream (which also compiles their kernels).
    """
    return time_graphs({"": calls}, replays, warmups=warmups)[""]


def time_graphs(columns: Mapping[str, Sequence[Callable[[], object]]], replays: int = 50, *,
                warmups: int = 2, seed: int = 0, errors: dict[str, str] | None = None) -> dict[str, Timing]:
    """Per-call time of each column's calls, each column captured into its own CUDA graph.

    The graphs are replayed interleaved: every step replays each column once, in an order
    shuffled anew each step (:func:`replay_order`), and each replay is timed alone. Clock,
    power and heat drift then reach every column alike: timed one after another, the same
    work measured up to 11% apart by its place in the order (H200 run 23). The graphs share one
    memory pool, so they hold the largest column's memory, not the sum: their replays never
    overlap, and a column must keep nothing in memory it allocates from one replay to the next
    (what its calls return is dropped). With ``errors``, a column whose warm-up or capture raises
    is left out and its error recorded there; without, the error propagates.
    """
    graphs = {}
    pool = torch.cuda.graph_pool_handle()
    for name, calls in columns.items():
        try:
            graphs[name] = _capture(calls, warmups, pool)
        except PASS_THROUGH:
            raise
        except BaseException as exc:
            if errors is None:
                raise
            errors[name] = describe(exc)
    for graph in graphs.values():
        for _ in range(3):
            graph.replay()
    events: dict[str, list[tuple[Any, Any]]] = {name: [] for name in graphs}
    for order in replay_order(list(graphs), replays, seed):
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    out = {}
    for name, pairs in events.items():
        per_call = [start.elapsed_time(end) * 1e3 / len(columns[name]) for start, end in pairs]
        out[name] = Timing(statistics.median(per_call), min(per_call), max(per_call))
    del graphs
    return out


def replay_order(names: Sequence[str], steps: int, seed: int = 0) -> list[list[str]]:
    """``steps`` orders of ``names``, each shuffled anew (seeded: the same every run)."""
    rng = random.Random(seed)
    return [rng.sample(list(names), len(names)) for _ in range(steps)]


def _capture(calls: Sequence[Callable[[], object]], warmups: int, pool: Any) -> Any:
    """``calls`` captured into one CUDA graph (memory from ``pool``), after ``warmups`` runs on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        for call in calls:
            call()
    return graph
