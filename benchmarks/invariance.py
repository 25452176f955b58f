"""Batch invariance on this GPU: which backends give a row the same bits whatever its batch, and what the
invariant plans cost against the normal ones (GPU only).

Phases, one JSON report (``DIR/invariance.json``):

* ``rows``: every accepted backend pinned (Triton with each candidate configuration for every M:
  the shipped table's configurations of the first shape at M buckets 1, 64 and 8192), on each
  shape, for M in ``--m``: a probe row placed first, in the middle and last of a batch of M
  random rows, compared bitwise with the probe computed alone (M 1, twice: run to run). Each
  (backend, configuration) becomes a record (:mod:`fp8select.measured.invariance`) at this
  device and the installed versions; ``--write-record FILE`` merges them into that records file
  (the shipped one is ``fp8select/data/invariance-nvidia-h200.json``).
* ``moe-rows``: the same for the MoE experts op (``--moe-shapes``, named shapes): each MoE backend and
  layout but the reference, one configuration for every M, a probe token (its own experts and weights,
  one id -1) among tokens routed at random; records with a ``layout``.
* ``cost``: per shape and M bucket 1..8192, the layer of ``resolve()`` against the layer of
  ``resolve(batch_invariant=True)`` planned from the records just measured, each timed as the
  whole op under CUDA graphs (:func:`fp8select.measure.timing.time_graphs`, replays interleaved,
  weights rotated past the L2); the geometric mean of invariant / normal over shapes x M, and the
  points where the invariant plan costs more than 10%.
* ``moe-cost`` (no GPU): the same question for the MoE experts op, from the tuning table's MoE rows
  and the records file (``--table``, ``--records``; the shipped H200 ones by default): per MoE shape,
  the route a batch-invariant plan runs (the qualifying record whose route has the least summed log
  time over the M buckets, as :mod:`fp8select.moe_plan` chooses; a Triton record only where the
  table timed its configuration at every bucket) against the fastest measured route per bucket.

Usage: ``python -m benchmarks.invariance --out DIR [--write-record FILE] [--shapes 7168,2048,...]
[--m 1,2,...] [--phases rows,moe-rows,cost,moe-cost] [--moe-shapes deepseek-v3-e8,...]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda
from benchmarks._stats import geomean
from fp8select.measured.table import SHIPPED_DIR

SHAPES = ((7168, 2048), (2112, 7168), (24576, 1536))
MOE_SHAPES = ("deepseek-v3-e8", "qwen3-30b-a3b")
MS = (1, 2, 3, 7, 16, 17, 64, 300, 2048, 8192)
CANDIDATE_BUCKETS = (1, 64, 8192)
BUDGET = 1.10


def positions(m: int) -> dict[str, int]:
    """The probe row's places in a batch of ``m`` rows, by the names records use."""
    return {"first": 0, "middle": m // 2, "last": m - 1}


def check_rows(layer: Callable[[Any], Any], k: int, ms: Sequence[int], device: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Where ``layer`` gives a probe row other bits inside a batch than alone: ``{"m", "position",
    "max_rel"}`` per difference (M 1 twice: run to run); empty when it never does."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    rows = torch.randn(max(ms), k, device=device, generator=g).to(torch.bfloat16)
    probe = torch.randn(k, device=device, generator=g).to(torch.bfloat16)  # a row the batches hold only where placed

    def row_at(m: int, at: int) -> Any:
        batch = rows[:m].clone()
        batch[at] = probe
        return layer(batch)[at]

    return _differences(layer(probe[None])[0].clone(), row_at, ms)


def _differences(alone: Any, row_at: Callable[[int, int], Any], ms: Sequence[int]) -> list[dict[str, Any]]:
    """Where ``row_at(m, at)``, the probe's output in a batch of ``m`` with the probe at ``at``, is not
    ``alone`` bitwise, at each position of :func:`positions` (M 1 once more: run to run)."""
    import torch

    differs = []
    for m in ms:
        for name, at in (positions(m).items() if m > 1 else [("first", 0)]):
            row = row_at(m, at)
            if not torch.equal(row, alone):
                diff = (row.double() - alone.double()).abs().max() / alone.double().abs().max().clamp_min(1e-30)
                differs.append({"m": m, "position": name, "max_rel": float(diff) if math.isfinite(diff) else None})
    return differs


def candidate_schedules(selection: Any, backend: Any, shape: tuple[int, int]) -> list[tuple[tuple[int, Any], ...]]:
    """The configuration schedules to measure ``backend`` with: none for a backend without launch
    configurations; for Triton, each distinct configuration of the tables at ``shape``'s buckets
    :data:`CANDIDATE_BUCKETS` (or the kernels' heuristic there), used for every M."""
    if backend.name != "triton":
        return [((1, None),)]
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.kernels.triton_search import heuristic_config

    configs = []
    for bucket in CANDIDATE_BUCKETS:
        est = selection.measurements.estimate("triton", *shape, bucket) if selection.measurements is not None else None
        config = TritonConfig.from_dict(est.config) if est is not None and est.config else heuristic_config(*shape, bucket, "gemm")
        configs.append(json.dumps(config.to_dict(), sort_keys=True))
    return [((1, json.loads(c)),) for c in dict.fromkeys(configs)]


def _layer(selection: Any, backend: Any, schedule: Any, w: Any, s: Any, record: Any) -> Any:
    """``backend`` pinned with ``schedule`` for every M, through the plan an invariant selection makes;
    a backend whose gate takes only some M (FlashInfer's sm90 route) pinned by an ordinary plan instead,
    measured where it runs. Raises UnsupportedProblemError for a shape it does not take at all."""
    from fp8select.errors import BatchInvariantError
    from fp8select.layer import Fp8Linear
    from fp8select.measured.invariance import Invariance, merge_records

    caps = selection.capabilities
    data = merge_records(None, [replace(record, invariant=True)], caps.device_name or "cpu")
    try:
        return Fp8Linear([backend], caps, w, s, measurements=selection.measurements, explicit=backend.name,
                         invariance=Invariance(caps, [backend], [("candidate", data)]))
    except BatchInvariantError:
        return Fp8Linear([backend], caps, w, s, measurements=selection.measurements, explicit=backend.name)


def measure_rows(selection: Any, shapes: Sequence[tuple[int, int]], ms: Sequence[int]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Every accepted backend's (and Triton configuration's) records over ``shapes`` and ``ms``, and the raw results."""
    import torch

    from fp8select.errors import UnsupportedProblemError
    from fp8select.measure.bench import random_weight
    from fp8select.measured.invariance import POSITIONS, Record
    from fp8select.measured.table import backend_versions

    caps, device = selection.capabilities, torch.device("cuda")
    records, raw = [], []
    for backend in selection.chain:
        for schedule in candidate_schedules(selection, backend, shapes[0]):
            record = Record(backend.name, backend_versions(caps, backend.packages), schedule, tuple(shapes),
                            (min(ms), max(ms)), POSITIONS, True)
            differs: list[dict[str, Any]] = []
            measured, runs = [], set(ms)
            for n, k in shapes:
                w, s = random_weight(n, k, device, torch.Generator(device=device).manual_seed(n + k))
                start = time.perf_counter()
                try:
                    layer = _layer(selection, backend, schedule, w, s, record)
                except UnsupportedProblemError as exc:
                    raw.append({"backend": backend.name, "shape": [n, k], "skipped": str(exc).splitlines()[-1][:200]})
                    continue
                here = [m for m in ms if layer.main_plan.route(m).backend is not None]
                try:
                    found = check_rows(layer, k, here, device)
                except Exception as exc:  # noqa: BLE001 - a backend that fails a call is a finding, not a crash
                    raw.append({"backend": backend.name, "schedule": schedule, "shape": [n, k], "error": repr(exc)[:300]})
                    found = [{"m": 0, "position": "error", "max_rel": None}]  # (JSON has no inf)
                measured.append((n, k))
                runs &= set(here)
                differs += [{"shape": f"{n},{k}", **d} for d in found]
                raw.append({"backend": backend.name, "schedule": schedule, "shape": [n, k], "m": here, "differs": found,
                            "s": round(time.perf_counter() - start, 2)})
                print(f"rows {backend.name:<15} {n}x{k}: {'invariant' if not found else f'{len(found)} differ'}", flush=True)
            if measured and runs:
                records.append(replace(record, shapes=tuple(measured), m=(min(runs), max(runs)), invariant=not differs,
                                       differs=tuple(differs[:10])))
    return records, raw


def check_moe_rows(launch: Callable[[Any, Any, Any], Any], shape: tuple[int, int, int, int], ms: Sequence[int],
                   device: Any, seed: int = 0) -> list[dict[str, Any]]:
    """:func:`check_rows` for the experts op: a probe token with its own experts and weights (one id -1)
    among tokens routed at random, against the probe alone."""
    import torch

    e, h, _, k = shape
    g = torch.Generator(device=device).manual_seed(seed)
    top = max(ms)
    rows = torch.randn(top, h, device=device, generator=g).to(torch.bfloat16)
    ids = torch.rand(top, e, device=device, generator=g).topk(k, dim=1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(top, k, device=device, generator=g), dim=-1)
    probe = torch.randn(h, device=device, generator=g).to(torch.bfloat16)
    probe_ids = torch.randperm(e, device=device, generator=g)[:k].to(torch.int32)
    probe_ids[-1] = -1
    probe_weights = torch.softmax(torch.randn(k, device=device, generator=g), dim=-1)

    def row_at(m: int, at: int) -> Any:
        x, w, i = rows[:m].clone(), weights[:m].clone(), ids[:m].clone()
        x[at], w[at], i[at] = probe, probe_weights, probe_ids
        return launch(x, w, i)[at]

    return _differences(launch(probe[None], probe_weights[None], probe_ids[None])[0].clone(), row_at, ms)


def measure_moe_rows(selection: Any, names: Sequence[str], ms: Sequence[int]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Every MoE backend and layout of the MoE chain but the reference (invariant by construction), each with
    one configuration for every M (Triton: its default at buckets :data:`CANDIDATE_BUCKETS`, each a
    candidate), on the named MoE shapes: its records (with ``layout``) and the raw results."""
    import torch

    from fp8select.backends.moe import MoeProblem, MoeWeights
    from fp8select.measure.tune_moe import MAX_MASKED_BYTES, random_experts
    from fp8select.measured.invariance import POSITIONS, Record
    from fp8select.measured.moe import MOE_SHAPES as NAMED
    from fp8select.measured.table import backend_versions
    from fp8select.moe_select import moe_chain

    caps, device = selection.capabilities, torch.device("cuda")
    shapes = [NAMED[name] for name in names]
    weights = {shape: random_experts(shape[0], shape[1], shape[2], device,
                                     torch.Generator(device=device).manual_seed(sum(shape))) for shape in shapes}
    records: list[Any] = []
    raw: list[dict[str, Any]] = []
    for backend in moe_chain(selection):
        if backend.name == "reference":
            continue
        for layout in backend.layouts:
            configs = [backend.default_config(MoeProblem(*shapes[0]), layout, bucket) for bucket in CANDIDATE_BUCKETS]
            schedules = list(dict.fromkeys(json.dumps(None if c is None else c.to_dict(), sort_keys=True) for c in configs))
            for text in schedules:
                config = json.loads(text)
                differs: list[dict[str, Any]] = []
                measured, runs = [], set(ms)
                for shape in shapes:
                    e, h, i, k = shape
                    here = [m for m in ms if backend.supports(MoeProblem(e, h, i, k, m=m), caps, layout).ok
                            and not (layout == "masked" and e * m * (3 * h + 5 * i) > MAX_MASKED_BYTES)]
                    if not here:
                        raw.append({"backend": f"{backend.name}/{layout}", "shape": list(shape), "skipped": "no M"})
                        continue
                    start = time.perf_counter()
                    launch = backend.bind(backend.prepare(MoeWeights(*weights[shape], (128, 128)), caps), layout,
                                          None if config is None else backend.launch_config(config), caps)
                    try:
                        found = check_moe_rows(launch, shape, here, device)
                    except Exception as exc:  # noqa: BLE001 - a backend that fails a call is a finding
                        raw.append({"backend": f"{backend.name}/{layout}", "shape": list(shape), "error": repr(exc)[:300]})
                        found = [{"m": 0, "position": "error", "max_rel": None}]
                    measured.append(shape)
                    runs &= set(here)
                    differs += [{"shape": ",".join(map(str, shape)), **d} for d in found]
                    raw.append({"backend": f"{backend.name}/{layout}", "config": config, "shape": list(shape), "m": here,
                                "differs": found, "s": round(time.perf_counter() - start, 2)})
                    print(f"moe rows {backend.name}/{layout} {'x'.join(map(str, shape))}: "
                          f"{'invariant' if not found else f'{len(found)} differ'}", flush=True)
                if measured and runs:
                    records.append(Record(backend.name, backend_versions(caps, backend.packages), ((1, config),),
                                          tuple(measured), (min(runs), max(runs)), POSITIONS, not differs,
                                          tuple(differs[:10]), layout=layout))
    return records, raw


def measure_cost(selection: Any, records: Sequence[Any], shapes: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The invariant plans' time against the normal plans', per shape and M bucket (the module docstring)."""
    import torch

    from fp8select.buckets import M_BUCKETS
    from fp8select.errors import BatchInvariantError
    from fp8select.measure.bench import random_weight, rotated
    from fp8select.measure.timing import time_graphs
    from fp8select.measured.invariance import Invariance, merge_records

    caps, device = selection.capabilities, torch.device("cuda")
    data = merge_records(None, records, caps.device_name or "cuda")
    invariant = replace(selection, batch_invariant=True, invariance=Invariance(caps, selection.chain, [("measured", data)]))
    points: list[dict[str, Any]] = []
    for n, k in shapes:
        w, s = random_weight(n, k, device, torch.Generator(device=device).manual_seed(n * k))
        weights = rotated(w)
        try:
            layers = {"normal": [selection.prepare(wi, s) for wi in weights],
                      "invariant": [invariant.prepare(wi, s) for wi in weights]}
        except BatchInvariantError as exc:
            points.append({"shape": [n, k], "error": str(exc).splitlines()[0]})
            continue
        plans = {mode: ls[0].main_plan.summary() for mode, ls in layers.items()}
        for m in M_BUCKETS:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            columns = {mode: [functools_call(layer, x) for layer in ls] for mode, ls in layers.items()}
            t = time_graphs(columns, replays=30)
            points.append({"shape": [n, k], "m": m, "normal_us": round(t["normal"].median_us, 2),
                           "invariant_us": round(t["invariant"].median_us, 2),
                           "ratio": round(t["invariant"].median_us / t["normal"].median_us, 4), "plans": plans})
        print(f"cost {n}x{k}: {plans}", flush=True)
    ratios = [p["ratio"] for p in points if "ratio" in p]
    return {"points": points, **_against_budget(ratios),
            "costs_more_than_10_percent": [p for p in points if p.get("ratio", 0) > BUDGET]}


def moe_table_cost(table: dict[str, Any], records: dict[str, Any]) -> dict[str, Any]:
    """The batch-invariant MoE plans' time against the fastest route per M bucket, from measured rows
    alone (the module docstring's ``moe-cost``)."""
    from fp8select.buckets import M_BUCKETS

    timed: dict[tuple[str, tuple[int, ...]], dict[int, tuple[float, Any]]] = {}
    for entry in table.get("moe", ()):
        for key, rows in entry["shapes"].items():
            shape = tuple(int(v) for v in key.split(","))
            timed[(f"{entry['backend']}/{entry['layout']}", shape)] = {
                int(b): (row["us"], row.get("config")) for b, row in rows.items()}
    qualifying = [(f"{r['backend']}/{r['layout']}", r["schedule"][0]["config"]) for r in records.get("records", ())
                  if r.get("layout") and r.get("invariant") and r["m"][0] <= 1 and r["m"][-1] >= M_BUCKETS[-1]
                  and len(r["schedule"]) == 1]
    shapes: dict[str, Any] = {}
    ratios: list[float] = []
    for shape in sorted({shape for (_, shape) in timed}):
        times = [rows for (_, s), rows in timed.items() if s == shape]
        best = {b: min(rows[b][0] for rows in times if b in rows) for b in M_BUCKETS if any(b in rows for rows in times)}
        options = []
        for route, config in qualifying:
            rows = timed.get((route, shape), {})
            if all(b in rows and rows[b][1] == config for b in best):
                options.append((sum(math.log(rows[b][0] / best[b]) for b in best), route, config))
        if not options:
            shapes[",".join(map(str, shape))] = {"error": "no qualifying route timed at every bucket"}
            continue
        _, route, config = min(options, key=lambda o: o[0])
        per = {b: timed[(route, shape)][b][0] / best[b] for b in best}
        ratios += per.values()
        shapes[",".join(map(str, shape))] = {
            "invariant_route": route if config is None else f"{route} {config}",
            "geomean_ratio": geomean(per.values()),
            "worst": [max(per, key=per.__getitem__), round(max(per.values()), 4)]}
    return {"shapes": shapes, **_against_budget(ratios)}


def _against_budget(ratios: Sequence[float]) -> dict[str, Any]:
    """The geometric mean of invariant / normal ratios (None without any) and whether it is within :data:`BUDGET`."""
    overall = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    return {"geomean_ratio": None if overall is None else round(overall, 4),
            "within_budget": overall is not None and overall <= BUDGET}


def functools_call(layer: Any, x: Any) -> Callable[[], object]:
    return lambda: layer(x)


def write_record(path: Path, device_name: str, records: Sequence[Any], shapes: Sequence[tuple[int, int]],
                 ms: Sequence[int]) -> None:
    """Merge ``records`` into the records file at ``path`` (made when missing; checked before writing)."""
    from fp8select.measured.invariance import merge_records, validate_records
    from fp8select.measured.table import write_json

    base = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    if base is not None and (validate_records(base) or base["device_name"] != device_name):
        raise SystemExit(f"invariance: error: {path} is not a records file of {device_name}; not overwritten")
    note = (f"Measured by benchmarks/invariance.py on {device_name} ({datetime.date.today().isoformat()}): each "
            f"accepted backend pinned (Triton with each candidate configuration for every M), shapes "
            f"{', '.join(f'{n}x{k}' for n, k in shapes)}, a probe row first, in the middle and last of batches of "
            f"M {', '.join(map(str, ms))}, compared bitwise with the row alone; the MoE experts op's backends and "
            f"layouts (records with a layout) the same way, a probe token among tokens routed at random.")
    data = merge_records(base, records, device_name, note)
    assert validate_records(data) is None
    write_json(path, data)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.invariance", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for invariance.json")
    parser.add_argument("--write-record", metavar="FILE", help="merge the measured records into this records file")
    parser.add_argument("--shapes", default=";".join(f"{n},{k}" for n, k in SHAPES), help="N,K pairs (; between)")
    parser.add_argument("--m", default=",".join(map(str, MS)), help="comma list of M (include 1 and 8192 for a record "
                                                                     "that qualifies)")
    parser.add_argument("--phases", default="rows,moe-rows,cost", help="rows, moe-rows, cost, moe-cost (comma-separated)")
    parser.add_argument("--table", default=str(SHIPPED_DIR / "tuning-nvidia-h200.json"), help="moe-cost: tuning table")
    parser.add_argument("--records", default=str(SHIPPED_DIR / "invariance-nvidia-h200.json"),
                        help="moe-cost: invariance records")
    parser.add_argument("--moe-shapes", default=",".join(MOE_SHAPES), help="named MoE shapes for moe-rows")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    if phases == {"moe-cost"}:  # from measured rows alone: no GPU
        report: dict[str, Any] = {"moe_cost": moe_table_cost(json.loads(Path(args.table).read_text(encoding="utf-8")),
                                                             json.loads(Path(args.records).read_text(encoding="utf-8")))}
        print(json.dumps(report, indent=1))
        return 0
    require_cuda("invariance")
    from fp8select import resolve
    from fp8select.measure.bench import environment

    shapes = [(int(n), int(k)) for n, k in (p.split(",") for p in args.shapes.split(";") if p)]
    ms = sorted({int(m) for m in args.m.split(",") if m})
    start = time.perf_counter()
    selection = resolve(plugins=False)
    report = {"environment": environment(), "chain": [b.name for b in selection.chain], "shapes": shapes, "m": ms}
    records: list[Any] = []
    if "rows" in phases:
        records, report["rows"] = measure_rows(selection, shapes, ms)
        report["records"] = [r.to_dict() for r in records]
        report["rows_s"] = round(time.perf_counter() - start, 1)
    if "moe-rows" in phases:
        moe_records, report["moe_rows"] = measure_moe_rows(selection, args.moe_shapes.split(","), ms)
        report["moe_records"] = [r.to_dict() for r in moe_records]
        report["moe_rows_s"] = round(time.perf_counter() - start, 1)
    else:
        moe_records = []
    if "cost" in phases:
        if not records:
            from fp8select.measured.invariance import find_records, invariance_for

            records = list(invariance_for(selection.capabilities, selection.chain).records)
            report["records_from"] = [source for source, _ in find_records(selection.capabilities)]
        report["cost"] = measure_cost(selection, records, shapes)
        print(f"cost: geomean invariant/normal {report['cost']['geomean_ratio']} (budget {BUDGET})", flush=True)
    report["total_s"] = round(time.perf_counter() - start, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "invariance.json").write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    if args.write_record and (records or moe_records):
        write_record(Path(args.write_record), selection.capabilities.device_name or "cuda", [*records, *moe_records],
                     shapes, ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
