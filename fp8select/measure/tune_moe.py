"""Measure the MoE experts backends on this GPU and write the ``moe`` rows of a tuning table (``tune --moe``).

Per MoE layer shape ``(E, H, I, k)`` and M (one per bucket), every backend and layout of the MoE chain
except ``reference`` whose gate accepts the point is checked against the reference backend (relative
Frobenius error below :data:`REL_ERR_MAX`; DeepGEMM's bf16 GEMM outputs cost up to ~3e-2 on a single
token, far less over a batch), then timed as the whole experts op a user calls: bf16 ``x`` in, routing,
activation quantization, both grouped GEMMs, ``silu(gate) * up`` and its quantization, the weighted sum
(:meth:`~fp8select.backends.moe.MoeBackend.bind`). For a backend with launch configurations (Triton) its
candidates (the configuration of the ``known`` table's row for the point first, then
:meth:`~fp8select.backends.moe.MoeBackend.tuning_configs`; at most ``max_configs``: ``--force --max-configs 1``
times the table's rows again as they are) are timed together, interleaved, under the point's uniform routing and under skewed routing
(:func:`~fp8select.kernels.moe_routing.skewed_routing`; checked under both), and the one kept that loses
least to the fastest under either: a small row tile reads a busy expert's weights once per row block,
which uniform routing at decode does not show. Then the point's routes are timed together under CUDA graphs, their replays
interleaved (:func:`fp8select.measure.timing.time_graphs`): those times are the table's.

**Routing**: uniform random top-k (each token's ``k`` distinct experts drawn uniformly, weights a softmax
of random logits), seeded per point: what the rows mean is the expected cost of a batch whose experts are
balanced, the case expert-load balancing aims at. Skewed routing moves time between experts: where a point
has several routes they are also timed together under skewed routing (each row's ``skewed_us``), and the
plan ranks them by the worse of their two standings (:func:`fp8select.moe_plan.build_moe_plan`), as a
route's configuration is chosen above. Every route is checked under both routings. **Weights** are
random (never zero), rotated through enough copies that the experts one call reads exceed the 60 MB L2
three times (:func:`weight_copies`). DeepGEMM's ``masked`` layout holds
``E x M`` rows; points where that working set passes :data:`MAX_MASKED_BYTES` are not timed (the rule runs
``masked`` up to M 64 only).

Rows go into the table's ``moe`` list (:mod:`fp8select.measured.moe`) per backend, layout and that
backend's versions here; rows ``known`` already holds are skipped unless ``force``, rows ``done`` holds
even then (``tune --force --resume``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from fp8select.backends.moe import MoeBackend, MoeLaunch, MoeProblem, MoeWeights
from fp8select.buckets import m_bucket
from fp8select.guard import PASS_THROUGH, describe
from fp8select.kernels.moe_routing import skewed_routing, uniform_routing
from fp8select.measure import timing
from fp8select.measured.moe import moe_shape_key
from fp8select.measured.table import backend_versions, new_table

__all__ = ["MAX_MASKED_BYTES", "REL_ERR_MAX", "random_experts", "tune_moe", "weight_copies"]

REL_ERR_MAX = 3e-2
L2_BYTES = 60e6
MAX_WEIGHT_BYTES = 24e9
MAX_MASKED_BYTES = 8e9
BLOCK = (128, 128)


Experts = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def random_experts(e: int, h: int, i: int, device: torch.device | str,
                   generator: torch.Generator | None = None) -> Experts:
    """Random ``(w13 [E, 2I, H], s13, w2 [E, H, I], s2)``: fp8 weights never zero (|w| up to 440 of e4m3's
    448), positive fp32 block scales; one expert at a time (no fp32 copy of all experts at once)."""

    def one(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.empty((e, n, k), dtype=torch.float8_e4m3fn, device=device)
        for j in range(e):
            w[j] = (torch.randn(n, k, generator=generator, device=device) * 100).clamp(-440, 440).to(w.dtype)
        s = torch.rand(e, -(-n // BLOCK[0]), -(-k // BLOCK[1]), generator=generator, device=device) * 1e-3 + 1e-4
        return w, s

    return (*one(2 * i, h), *one(h, i))


def weight_copies(e: int, h: int, i: int, k: int) -> int:
    """Copies of the experts to rotate through: the ``k`` experts one token reads exceed the L2 three
    times over, within :data:`MAX_WEIGHT_BYTES` of weights in all."""
    per_expert = 3 * h * i
    return max(1, min(math.ceil(3 * L2_BYTES / (min(k, e) * per_expert)), int(MAX_WEIGHT_BYTES // (e * per_expert))))


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = out.double() - ref.double()
    if not bool(torch.isfinite(diff).all()):
        return math.inf
    return float(diff.norm() / ref.double().norm().clamp_min(1e-30))


def _known(table: Mapping[str, Any] | None) -> set[tuple[str, str, tuple[tuple[str, str], ...], str, str]]:
    return {(g["backend"], g["layout"], tuple(sorted(g["versions"].items())), shape, bucket)
            for g in (table or {}).get("moe", ()) for shape, buckets in g["shapes"].items() for bucket in buckets}


def _held_configs(table: Mapping[str, Any] | None, versions: Mapping[str, Mapping[str, str]]) -> dict[tuple[str, str, str, str], Any]:
    """``(backend, layout, shape, bucket)`` -> the ``config`` of ``table``'s row there: the row of the versions
    installed (``versions``: backend -> its versions here) where there is one, else any version's."""
    entries = sorted((table or {}).get("moe", ()), key=lambda g: g["versions"] == versions.get(g["backend"]))
    return {(g["backend"], g["layout"], shape, bucket): row["config"] for g in entries
            for shape, buckets in g["shapes"].items() for bucket, row in buckets.items() if row.get("config") is not None}


def _wanted(backend: MoeBackend, layout: str, names: Sequence[str] | None) -> bool:
    return names is None or backend.name in names or f"{backend.name}/{layout}" in names


def tune_moe(selection: Any, shapes: Sequence[tuple[int, int, int, int]], ms: Sequence[int], *,
             known: Mapping[str, Any] | None = None, force: bool = False, done: Mapping[str, Any] | None = None,
             replays: int = 30, max_configs: int = 4, budget_s: float = math.inf, backends: Sequence[str] | None = None,
             chain: Sequence[MoeBackend] | None = None, progress: Callable[[str], None] | None = None,
             on_shape: Callable[[dict[str, Any]], None] | None = None,
             device: torch.device | str = "cuda", experts: Experts | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Measure what ``known`` lacks (everything with ``force``) but what ``done`` holds, and return
    ``(table, rows)``: ``table`` holds only the new ``moe`` rows; ``rows`` every timing for the record. ``backends``: names or
    ``backend/layout`` routes to measure (default: the MoE chain but ``reference``). No new point starts
    after ``budget_s`` seconds; ``on_shape(table)`` is called after each shape. ``experts``: a layer's own
    weights, the first of the copies rotated through (one shape: load-time measurement, which then
    allocates only the copies beyond them)."""
    from fp8select.moe_select import moe_chain

    start = time.monotonic()
    caps = selection.capabilities
    device = torch.device(device)
    routes = [(b, layout) for b in (chain if chain is not None else moe_chain(selection)) if b.name != "reference"
              for layout in b.layouts if _wanted(b, layout, backends)]
    versions = {b.name: backend_versions(caps, b.packages) for b, _ in routes}
    skip = _known(done) | (set() if force else _known(known))
    held = _held_configs(known, versions)
    table = new_table(caps.device_name or "unknown")
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    gen = torch.Generator(device=device).manual_seed(1)
    for e, h, i, k in shapes:
        key = moe_shape_key(e, h, i, k)
        problem = MoeProblem(e, h, i, k)
        todo = {(b.name, lay): [m for m in ms if (b.name, lay, tuple(sorted(versions[b.name].items())), key,
                                                 str(m_bucket(m))) not in skip]
                for b, lay in routes if b.supports(problem, caps, lay).ok}
        if not any(todo.values()):
            continue
        if time.monotonic() - start > budget_s:
            rows.append({"shape": key, "skipped": "budget"})
            continue
        copies = weight_copies(e, h, i, k) if device.type == "cuda" else 1  # rotated past a GPU's L2 only
        sets = [experts] if experts is not None else []
        sets += [random_experts(e, h, i, device, gen) for _ in range(copies - len(sets))]
        prepared: dict[str, list[Any]] = {}
        for b in dict.fromkeys(b for b, lay in routes if todo.get((b.name, lay))):
            try:
                prepared[b.name] = [b.prepare(MoeWeights(*w, BLOCK), caps) for w in sets]
            except PASS_THROUGH:
                raise
            except BaseException as exc:  # noqa: BLE001 - recorded; the other backends go on
                rows.append({"shape": key, "backend": b.name, "error": f"prepare: {describe(exc)}"})
        for m in ms:
            if time.monotonic() - start > budget_s:
                rows.append({"shape": key, "m": m, "skipped": "budget"})
                continue
            point = replace(problem, m=m)
            wanted = [(b, lay) for b, lay in routes if b.name in prepared and m in todo.get((b.name, lay), ())
                      and b.supports(point, caps, lay).ok]
            if not wanted:
                continue
            weights, ids = uniform_routing(m, k, e, device, gen)
            skewed = skewed_routing(m, k, e, device, torch.Generator(device=device).manual_seed(m))
            x = torch.randn(m, h, generator=gen, device=device).to(torch.bfloat16)
            reference = functools.cache(functools.partial(_reference, x, sets[0]))
            found: dict[str, tuple[list[MoeLaunch], Any]] = {}
            for b, lay in wanted:
                name = f"{b.name}/{lay}"
                if lay == "masked" and e * -(-m // 128) * 128 * (3 * h + 5 * i) > MAX_MASKED_BYTES:
                    rows.append({"shape": key, "m": m, "route": name, "skipped": f"masked working set over "
                                 f"{MAX_MASKED_BYTES / 1e9:.0f} GB"})
                    continue
                best = _best_config(b, lay, prepared[b.name], point, m, x, [(weights, ids), skewed], reference, caps,
                                    replays, max_configs, rows, key, held.get((b.name, lay, key, str(m_bucket(m)))))
                if best is not None:
                    found[name] = best
            errors: dict[str, str] = {}
            times = timing.time_graphs(_calls(found, x, (weights, ids), errors), replays, errors=errors)
            # a choice to make: the routes timed under skewed routing too, which the plan weighs (moe_plan.rank_routes)
            skewed_times = timing.time_graphs(_calls(found, x, skewed, errors), replays, errors=errors) \
                if len(times) > 1 else {}
            for (b, lay) in wanted:
                name = f"{b.name}/{lay}"
                if name in errors:
                    rows.append({"shape": key, "m": m, "route": name, "error": errors[name]})
                if name not in times or name in errors:
                    continue
                row: dict[str, Any] = {"us": round(times[name].median_us, 3)}
                if name in skewed_times:
                    row["skewed_us"] = round(skewed_times[name].median_us, 3)
                config = found[name][1]
                if config is not None and hasattr(config, "to_dict"):
                    row["config"] = config.to_dict()
                rows.append({"shape": key, "m": m, "route": name, **row, "final": True})
                entry = entries.get((b.name, lay))
                if entry is None:
                    entry = entries[(b.name, lay)] = {"backend": b.name, "layout": lay, "versions": versions[b.name],
                                                      "shapes": {}}
                    table.setdefault("moe", []).append(entry)
                entry["shapes"].setdefault(key, {})[str(m_bucket(m))] = row
            if progress is not None:
                timed = [r for r in rows if r.get("shape") == key and r.get("m") == m and r.get("final")]
                progress(f"MoE E={e} H={h} I={i} k={k} M={m}: " + ", ".join(f"{r['route']} {r['us']:.1f}us" for r in timed))
        del prepared, sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if on_shape is not None:
            on_shape(table)
    return table, rows


def _calls(found: Mapping[str, tuple[list[MoeLaunch], Any]], x: torch.Tensor,
           routing: tuple[torch.Tensor, torch.Tensor], failed: Mapping[str, str]) -> dict[str, list[Callable[[], Any]]]:
    """Each route's calls (one per weight copy) on ``x`` under ``routing``, but those that ``failed``."""
    return {name: [functools.partial(run, x, *routing) for run in launches]
            for name, (launches, _) in found.items() if name not in failed}


def _best_config(backend: MoeBackend, layout: str, per_copy: list[Any], point: MoeProblem, m: int, x: torch.Tensor,
                 routings: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 reference: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], caps: Any, replays: int,
                 max_configs: int, rows: list[dict[str, Any]], key: str, held: Any = None) -> tuple[list[MoeLaunch], Any] | None:
    """The route's launches (one per weight copy) at the configuration that loses least to the fastest under
    each of ``routings`` (uniform, then skewed: :func:`_least_loss`), among those correct under each
    (``reference(weights, ids)``: the experts op's output for ``x``), or None. The candidates are timed
    together, interleaved (:func:`fp8select.measure.timing.time_graphs`), once per routing: timed one after
    another, the same work moves by several percent with its place in the order, as much as separates them.
    ``held``: the known table's row's configuration for the point, the first candidate."""
    name = f"{backend.name}/{layout}"
    configs = backend.tuning_configs(point, layout, m_bucket(m))
    first = backend.launch_config(held) if held is not None else None
    if first is not None:
        configs = [first, *(c for c in configs if c != first)]
    configs = configs[:max(1, max_configs)]
    correct: dict[str, tuple[list[MoeLaunch], Any, dict[str, Any]]] = {}
    for config in configs:
        record: dict[str, Any] = {"shape": key, "m": m, "route": name}
        if config is not None and hasattr(config, "to_dict"):
            record["config"] = config.to_dict()
        try:
            launches = [backend.bind(p, layout, config, caps) for p in per_copy]
            err = max(_rel_err(launches[0](x, *routing), reference(*routing)) for routing in routings)
        except PASS_THROUGH:
            raise
        except BaseException as exc:  # noqa: BLE001 - a configuration or backend failing here is a result
            rows.append({**record, "error": describe(exc)})
            continue
        if err >= REL_ERR_MAX:
            rows.append({**record, "correct": False, "rel_err": err})
            continue
        rows.append(row := {**record, "rel_err": err})  # its times added below
        correct[str(len(correct))] = (launches, config, row)
    if len(correct) > 1:
        errors: dict[str, str] = {}
        times = [timing.time_graphs({i: [functools.partial(run, x, *routing) for run in launches]
                                     for i, (launches, _, _) in correct.items() if i not in errors}, replays, errors=errors)
                 for routing in routings]
        for i, (_, _, row) in correct.items():
            row.update({"error": errors[i]} if i in errors else
                       {f"{kind}_us": round(t[i].median_us, 3) for kind, t in zip(("uniform", "skewed"), times, strict=True)})
        timed = [(tuple(t[i].median_us for t in times), launches, config)
                 for i, (launches, config, _) in correct.items() if i not in errors]
    else:
        timed = [((0.0,), launches, config) for launches, config, _ in correct.values()]
    if not timed:
        return None
    _, launches, config = timed[_least_loss([t[0] for t in timed])]
    return launches, config


def _reference(x: torch.Tensor, experts: Experts, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The experts op's output for ``x`` under that routing (the reference kernel)."""
    from fp8select.kernels.moe_reference import experts_reference

    return experts_reference(x, *experts, weights, ids, BLOCK)


def _least_loss(times: Sequence[tuple[float, ...]]) -> int:
    """The index of the candidate whose worst ratio to the fastest, over its times under each routing, is
    least (the first of equals)."""
    fastest = [min(t[j] for t in times) or 1.0 for j in range(len(times[0]))]
    return min(range(len(times)), key=lambda i: max(t / f for t, f in zip(times[i], fastest, strict=True)))
