"""Measured per-shape choices: find the tuning table for this machine, route calls by it, and tune.

A tuning table (schema in :mod:`fp8select.tuning_cache`) says, for each layer shape (N, K)
and M bucket (next power of two), which backend was fastest on one device and software
stack, the best Triton launch configuration, and the times measured. :func:`find_table`
looks for the table whose fingerprint matches the snapshot: an explicit file
(``FP8SELECT_TUNING_TABLE``), the cache directory (``FP8SELECT_CACHE_DIR``, else XDG), then
the tables shipped in the package (``fp8select/data``, measured on the lent H200). A table
that is corrupt or from another device or stack is ignored with one warning.

The layer object (:class:`fp8select.layer.Fp8Linear`) uses :func:`routes_for` at ``prepare``
to choose, per M bucket, between its primary and its fallback backend (they share the
prepared weight), and hands the Triton configuration to the Triton backend.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8select.capabilities import Capabilities
from fp8select.kernels.triton_search import m_bucket  # pure python: no torch, no triton
from fp8select.tuning_cache import cache_dir, load_table, new_table, table_path

ENV_TABLE = "FP8SELECT_TUNING_TABLE"
SHIPPED_DIR = Path(__file__).parent / "data"
DEFAULT_TUNE_M: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def stack_versions(caps: Capabilities) -> dict[str, str | None]:
    """What a measurement depends on besides the device: torch, CUDA, Triton, vendor packages."""
    versions: dict[str, str | None] = {"torch": caps.torch_version, "triton": caps.packages.get("triton"),
                                       "cuda": caps.cuda_version, "hip": caps.hip_version}
    versions.update({name: v for name, v in caps.packages.items() if name != "triton"})
    return versions


def table_fingerprint(caps: Capabilities) -> str:
    return str(new_table(caps.device_name or "unknown", stack_versions(caps))["fingerprint"])


def find_table(caps: Capabilities) -> dict[str, Any] | None:
    """The tuning table measured for this device and stack, or None (see the module docstring)."""
    if caps.device_kind == "cpu" or not caps.device_name:
        return None
    fp = table_fingerprint(caps)
    versions = {k: v for k, v in stack_versions(caps).items() if v is not None}
    explicit = caps.env.get(ENV_TABLE, "").strip()
    candidates = [Path(explicit)] if explicit else []
    candidates += [table_path(cache_dir(caps.env), fp), SHIPPED_DIR / f"tuning-{fp}.json"]
    for path in candidates:
        table = load_table(path, fp, device_name=caps.device_name, versions=versions)
        if table is not None:
            table["_path"] = str(path)
            return table
    return None


@dataclass(frozen=True)
class Routes:
    """The table's entries for one layer shape, by M bucket (``exact`` False: a nearby shape's)."""

    shape: str
    exact: bool
    entries: Mapping[int, Mapping[str, Any]]

    def entry(self, m: int) -> Mapping[str, Any] | None:
        """The entry of the nearest measured bucket (log2 distance, ties to the smaller)."""
        if not self.entries:
            return None
        bucket = m_bucket(m)
        best = min(self.entries, key=lambda b: (abs(math.log2(b) - math.log2(bucket)), b))
        return self.entries[best]


def routes_for(table: Mapping[str, Any] | None, n: int, k: int) -> Routes | None:
    """Routes for an (N, K) layer: its own entries, else those of the shape with the nearest
    weight size (N*K within 2x), since the crossover between backends follows the weight bytes."""
    if not table:
        return None
    entries: Mapping[str, Mapping[str, Any]] = table.get("entries", {})
    key = f"{n},{k}"
    exact = key in entries
    if not exact:
        sizes = {s: int(s.split(",")[0]) * int(s.split(",")[1]) for s in entries}
        near = [s for s, size in sizes.items() if 0.5 <= size / (n * k) <= 2.0]
        if not near:
            return None
        key = min(near, key=lambda s: abs(math.log(sizes[s] / (n * k))))
    return Routes(key, exact, {int(b): e for b, e in entries[key].items()})


# ----------------------------------------------------------------------------------------------
# tune: measure, choose, write
# ----------------------------------------------------------------------------------------------


def tune(selection: Any, shapes: Sequence[tuple[int, int]], ms: Sequence[int] = DEFAULT_TUNE_M, *,
         replays: int = 30, max_configs: int = 10, budget_s: float = math.inf,
         progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Measure, per (N, K, M bucket), every backend sharing the primary's weight layout and the
    best Triton configuration (correct first, then timed), and build a tuning table.

    Returns (table, rows); rows hold every timing for the record. Stops starting new units
    after ``budget_s`` seconds.
    """
    import torch

    from fp8select import bench

    start = time.monotonic()
    caps = selection.capabilities
    table = new_table(caps.device_name or "unknown", stack_versions(caps))
    primary = selection.chain[0]
    backends = [b for b in selection.chain if b.name != "reference" and b.layout == primary.layout]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict[str, Any]] = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    points_left = len(shapes) * len(ms)
    for n, k in shapes:
        base = (torch.randn(n, k, device="cuda", generator=gen) * 100).clamp(-440, 440).to(torch.float8_e4m3fn)
        scale = torch.rand(math.ceil(n / 128), math.ceil(k / 128), device="cuda", generator=gen) * 1e-3 + 1e-4
        weights = [base] + [base.clone() for _ in range(bench.rotation_copies(n * k) - 1)]
        layers = {b.name: [bench.single_backend(selection, b).prepare(w, scale) for w in weights] for b in backends}
        for m in ms:
            left = budget_s - (time.monotonic() - start)
            points_left -= 1
            if left <= 0:
                rows.append({"n": n, "k": k, "m": m, "skipped": "budget"})
                continue
            # each remaining point gets a fair share of the budget for its Triton search
            deadline = time.monotonic() + left / (points_left + 1)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            ref = bench.fp64_reference(x, base, scale, (128, 128))
            entry = _tune_point(layers, x, ref, n, k, m, replays=replays, max_configs=max_configs, sms=sms, rows=rows,
                                deadline=deadline)
            if entry is not None:
                table["entries"].setdefault(f"{n},{k}", {})[str(m_bucket(m))] = entry
                if progress is not None:
                    parts = ", ".join(f"{b} {t:.1f}us" for b, t in sorted(entry["timings"].items(), key=lambda kv: kv[1]))
                    progress(f"N={n} K={k} M={m}: {parts} -> {entry['backend']}")
        torch.cuda.empty_cache()
    return table, rows


def _tune_point(layers: Mapping[str, list[Any]], x: Any, ref: Any, n: int, k: int, m: int, *, replays: int,
                max_configs: int, sms: int, rows: list[dict[str, Any]], deadline: float = math.inf) -> dict[str, Any] | None:
    """Time every backend (Triton over a configuration search) at one (N, K, M); the table entry."""
    from fp8select import bench
    from fp8select.kernels import triton_search

    def timed(name: str) -> float | None:
        per_copy = layers[name]
        if bench.checked_call(per_copy[0], x, ref) is None:
            return None
        return bench.time_graph([functools.partial(layer, x) for layer in per_copy], replays).median_us

    bucket = m_bucket(m)
    timings: dict[str, float] = {}
    triton_best: dict[str, Any] | None = None
    for name in layers:
        if name == "triton":
            def time_config(cfg: dict[str, Any]) -> float | None:
                for layer in layers["triton"]:
                    layer.prepared["triton"].extra["tuned"] = {bucket: {"config": cfg}}
                try:
                    return timed("triton")
                except Exception:  # noqa: BLE001 - a config that fails to compile or launch is skipped
                    return None

            cfg, us, tried = triton_search.search(n, k, m, time_config, sms=sms, max_configs=max_configs, deadline=deadline)
            rows.extend({"n": n, "k": k, "m": m, "backend": "triton", "config": t.get("config"), "us": t.get("us")} for t in tried)
            for layer in layers["triton"]:
                layer.prepared["triton"].extra.pop("tuned", None)
            if cfg is not None:
                timings["triton"] = us
                triton_best = {"config": cfg, "us": round(us, 3)}
            continue
        try:
            us_or_none = timed(name)
        except Exception as exc:  # noqa: BLE001 - recorded, the others go on
            rows.append({"n": n, "k": k, "m": m, "backend": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        rows.append({"n": n, "k": k, "m": m, "backend": name, "us": us_or_none, "correct": us_or_none is not None})
        if us_or_none is not None:
            timings[name] = us_or_none
    if not timings:
        return None
    winner = min(timings, key=lambda name: timings[name])
    entry: dict[str, Any] = {"backend": winner, "config": triton_best["config"] if winner == "triton" and triton_best else None,
                             "us": round(timings[winner], 3), "timings": {b: round(t, 3) for b, t in timings.items()}}
    if triton_best is not None:
        entry["triton"] = triton_best
    return entry


def tune_on_one_rank(selection: Any, shapes: Sequence[tuple[int, int]], group: Any = None, src: int = 0,
                     **kwargs: Any) -> dict[str, Any]:
    """:func:`tune` on rank ``src`` of a ``torch.distributed`` group only; every rank gets its table.

    The GPUs of one node are the same model, so measuring once and broadcasting saves every
    other rank the time and guarantees one set of decisions (a collective).
    """
    from fp8select.distributed import measure_on_one_rank

    return measure_on_one_rank(lambda: tune(selection, shapes, **kwargs)[0], group, src)
