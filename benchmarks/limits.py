"""How far the Triton block-FP8 linear is from the H200's limits: decode vs HBM, quantization cost, prefill vs cuBLAS.

    python -m benchmarks.limits --budget-s 240 --out limits.json    # --dry-run: the plan, no CUDA

Measured with fp8select.measure.bench's helpers by the recipe of docs/measurements.md (CUDA graphs, median of >= 50 replays, weights
rotated past the L2, fp64-reference check on poisoned outputs before timing), the Triton op timed whole (bf16 in):

1. decode, M 1..16 on DeepSeek-V3 weights of >= 16M elements: the shipped table's config and the best of a sweep
   wider than ``tune``'s (split-K to 64, 2..8 stages, BLOCK_N 16..256, 2..8 warps, four paths, FIXUP and TMA),
   as fractions of the HBM floor (weight and scale bytes / 4.3 TB/s), next to the fastest vendor; and graphs of
   trivial kernels (the launch floor). Per M: the table's families, then ranked and seeded-random ones
   alternating with hill-climbing from the best (geomean over shapes); each family tries several split-Ks.
2. quantization, M 1024 and 4096: whole op / GEMM alone on a prequantized input, triton, deepgemm, cuBLAS.
3. prefill, M 1024..4096: Triton (table config, best large-tile config) against cuBLAS and DeepGEMM whole ops.

Kernels compile first in ``--warm-procs`` worker processes (Triton's, DeepGEMM's and FlashInfer's caches are on
disk). The budget counts from process start; the JSON is rewritten after every step (and on SIGTERM).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import os
import random
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path
from typing import Any

from benchmarks._cuda import require_cuda
from fp8select import roofline
from fp8select.buckets import m_bucket
from fp8select.kernels.triton_config import SCALE_GROUP_K, TritonConfig
from fp8select.kernels.triton_search import SMEM_LIMIT_BYTES, fill_split, smem_bytes
from fp8select.measure import bench, timing
from fp8select.measured.table import SHIPPED_DIR, load_table, table_path

_T0 = time.monotonic()

Point = tuple[int, int, int]
DECODE_M = (1, 16, 4, 2, 8)  # the ends of the range first, should the budget run out
PREFILL_M = (1024, 2048, 4096)
QUANT_M = (1024, 4096)
VENDORS = ("deepgemm", "flashinfer", "cutlass", "cuda-scaled-mm")
PREFILL_VENDORS = ("deepgemm", "cuda-scaled-mm")
JIT_VENDORS = ("deepgemm", "flashinfer")  # compile each new shape at its first call: warmed in the workers
SPLIT_MAX, STAGES_MAX, PRUNE, RESERVE_S = 64, 8, 1.08, 6.0
PHASE_WEIGHTS = {"decode-vendors": 1.0, "decode-sweep": 3.0, "prefill-vendors": 2.0, "prefill-sweep": 2.0}
SIBLING = {"decode": "swap", "swap": "gemm", "gemm": "fused", "fused": "decode"}
_DECODE_RANKED = (  # (path, BLOCK_N, num_warps, num_stages, FIXUP, TMA): beyond tune's search, most telling first
    ("decode", 64, 4, 8, 1, 1), ("decode", 128, 4, 6, 1, 1), ("decode", 32, 2, 8, 1, 1), ("gemm", 32, 2, 6, 1, 1),
    ("decode", 256, 8, 4, 1, 1), ("swap", 64, 4, 8, 1, 1), ("gemm", 64, 4, 6, 1, 1), ("decode", 128, 2, 5, 1, 1),
    ("fused", 64, 4, 5, 1, 0), ("decode", 64, 8, 6, 0, 1), ("gemm", 128, 8, 5, 1, 1), ("decode", 16, 2, 8, 1, 0),
)
_PREFILL_RANKED = (  # (BLOCK_M, BLOCK_N, num_warps, num_stages, GROUP_M, TMA, PERSISTENT) of the gemm path
    (64, 128, 4, 4, 8, 1, 2), (128, 64, 4, 4, 8, 1, 2), (128, 128, 8, 3, 8, 1, 1), (128, 128, 8, 4, 8, 1, 1),
    (128, 256, 8, 3, 8, 1, 0), (256, 128, 8, 3, 8, 1, 0), (128, 128, 8, 5, 8, 1, 0), (128, 256, 8, 4, 8, 1, 0),
    (128, 128, 8, 4, 16, 1, 0), (64, 256, 8, 4, 8, 1, 0), (256, 128, 8, 4, 16, 1, 0), (128, 128, 8, 3, 8, 1, 0),
    (128, 256, 8, 3, 16, 0, 0), (128, 128, 8, 4, 8, 0, 0), (256, 64, 8, 4, 8, 1, 0), (128, 128, 4, 4, 8, 1, 0),
    (64, 128, 4, 3, 8, 1, 2), (128, 64, 4, 3, 8, 1, 3), (64, 128, 4, 5, 16, 1, 2), (256, 64, 8, 4, 8, 1, 1),
)


def _log(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _geomean(values: list[float]) -> float | None:
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 4) if values else None


def _cfg(path: str, bm: int, bn: int, warps: int, stages: int, fixup: int, tma: int, group: int = 8,
         persistent: int = 0) -> TritonConfig:
    return TritonConfig(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=SCALE_GROUP_K, GROUP_M=group, SPLIT_K=1, num_warps=warps,
                        num_stages=stages, path=path, FIXUP=fixup, TMA=0 if path == "fused" else tma,
                        PERSISTENT=persistent)


def _fits(cfg: TritonConfig) -> bool:
    return 2 <= cfg.num_stages <= STAGES_MAX and 2 <= cfg.num_warps <= 8 and smem_bytes(cfg) <= SMEM_LIMIT_BYTES


def canonical(cfg: TritonConfig, k: int) -> TritonConfig:
    """The config as launched: SPLIT_K as the launch uses it (:meth:`TritonConfig.split_for`), FIXUP the
    path default when unsplit (it is ignored then), no TMA on the fused path (likewise)."""
    split = cfg.split_for(k)
    return replace(cfg, SPLIT_K=split, FIXUP=cfg.FIXUP if split > 1 else int(cfg.swap), TMA=0 if cfg.path == "fused" else cfg.TMA)


def concrete(fam: TritonConfig, n: int, k: int, m: int, extra: tuple[int, ...] = ()) -> list[TritonConfig]:
    """A family's configs at one point: split-K around the one that fills the SMs (x1/2 .. x4), plus ``extra``."""
    fill = fill_split(n, k, m, fam.BLOCK_M, fam.BLOCK_N)
    splits = (max(1, fill // 2), fill, 2 * fill, 4 * fill, *extra)
    return list(dict.fromkeys(canonical(replace(fam, SPLIT_K=s), k) for s in splits if s <= SPLIT_MAX))


def neighbours(fam: TritonConfig) -> list[TritonConfig]:
    """Families one step away: stages, BLOCK_N, warps, FIXUP, TMA, path."""
    out = []
    for step in ({"num_stages": fam.num_stages + 1}, {"num_stages": fam.num_stages - 1}, {"BLOCK_N": fam.BLOCK_N * 2},
                 {"BLOCK_N": fam.BLOCK_N // 2}, {"num_warps": fam.num_warps * 2}, {"num_warps": fam.num_warps // 2},
                 {"FIXUP": 1 - fam.FIXUP}, {"TMA": 1 - fam.TMA}, {"path": SIBLING[fam.path]}):
        try:
            cfg = replace(fam, **step)  # type: ignore[arg-type]
        except ValueError:  # BLOCK_N below 16
            continue
        cfg = replace(cfg, TMA=0) if cfg.path == "fused" else cfg
        if cfg.BLOCK_N <= 256 and _fits(cfg) and cfg != fam:
            out.append(cfg)
    return out


@dataclass(frozen=True)
class Work:
    """What a run will do, decided before any device is touched (what ``--dry-run`` prints)."""

    decode_shapes: tuple[tuple[int, int], ...]
    prefill_shapes: tuple[tuple[int, int], ...]
    table: dict[Point, TritonConfig]  # the shipped H200 table, (N, K, bucket) -> canonical config
    decode_families: dict[int, list[TritonConfig]]  # per M: the table's, ranked, random (before climbing)
    prefill_configs: list[TritonConfig]


def plan_work(seed: int, random_families: int, random_prefill: int) -> Work:
    shipped = load_table(table_path(SHIPPED_DIR, "NVIDIA H200")) or {"groups": []}
    table = {(n, k, int(b)): canonical(TritonConfig.from_dict(row["config"]), k)
             for g in shipped["groups"] if g["backend"] == "triton" for shape, rows in g["shapes"].items()
             for n, k in [map(int, shape.split(","))] for b, row in rows.items() if "config" in row}
    shapes = bench.SHAPE_SETS["deepseek-v3"]
    decode_shapes = tuple(s for s in shapes if s[0] * s[1] >= 16 * 2**20)
    grid = [c for args in product(SIBLING, (16, 32, 64, 128, 256), (2, 4, 8), range(2, STAGES_MAX + 1), (0, 1), (0, 1))
            if _fits(c := _cfg(args[0], 16, *args[1:]))]
    families = {}
    for m in DECODE_M:
        fams = [replace(table[(n, k, m)], SPLIT_K=1) for n, k in decode_shapes if (n, k, m) in table]
        fams += [_cfg(p, 16, *rest) for p, *rest in _DECODE_RANKED]
        rest = list(dict.fromkeys(c for c in grid if c not in fams))
        random.Random(seed * 1000 + m).shuffle(rest)
        families[m] = list(dict.fromkeys(c for c in fams + rest[:random_families] if _fits(c)))
    ranked = [_cfg("gemm", bm, bn, w, s, 0, t, g, p) for bm, bn, w, s, g, t, p in _PREFILL_RANKED]
    rest = [c for bm, bn, w, s, g, t, p in product((64, 128, 256), (64, 128, 256), (4, 8), (3, 4, 5), (4, 8, 16), (0, 1),
                                                   (0, 1, 2))
            if 64 * 128 <= bm * bn <= 128 * 256 and (t or not p)
            and _fits(c := _cfg("gemm", bm, bn, w, s, 0, t, g, p)) and c not in ranked]
    random.Random(seed).shuffle(rest)
    return Work(decode_shapes, shapes, table, families, [c for c in ranked if _fits(c)] + rest[:random_prefill])


def warm_tasks(work: Work, vendors: tuple[str, ...], phases: set[str]) -> list[tuple[Any, ...]]:
    """Compile jobs: vendor JIT per (backend, shape) first (the longest), then one launch per distinct Triton
    kernel (M matters only through the swap kernel's QUANT_ROWS, SPLIT_K only as 1 or more)."""
    tasks: list[tuple[Any, ...]] = []
    for backend in (v for v in JIT_VENDORS if v in vendors):
        if "prefill" in phases and backend in PREFILL_VENDORS:
            tasks += [("layer", backend, n, k, PREFILL_M) for n, k in work.prefill_shapes]
        tasks += [("layer", backend, n, k, DECODE_M) for n, k in work.decode_shapes if "decode" in phases]
    n, k = work.decode_shapes[0]
    kernels: dict[tuple[TritonConfig, int], int] = {}  # (config with SPLIT_K 1 or 2, QUANT_ROWS or 0) -> an M
    for m, fams in work.decode_families.items() if "decode" in phases else ():
        for cfg in (c for f in fams for shape in work.decode_shapes for c in concrete(f, *shape, m)):
            cfg = canonical(replace(cfg, SPLIT_K=min(2, cfg.SPLIT_K)), k)
            kernels.setdefault((cfg, min(m, cfg.BLOCK_M) if cfg.swap else 0), m)
    tasks += [("triton", cfg.to_dict(), n, k, (m,)) for (cfg, _), m in kernels.items()]
    return tasks + [("triton", c.to_dict(), 7168, 2048, (1024,)) for c in work.prefill_configs if "prefill" in phases]


def _warm_task(task: tuple[Any, ...]) -> tuple[str, str | None]:
    """Worker: run one kernel once so that its compiled form lands in the on-disk caches."""
    import torch

    from fp8select.kernels import triton_gemm

    kind, what, n, k, ms = task
    try:
        torch.cuda.set_device(0)
        w, s = _worker_weight(n, k)
        if kind == "triton":
            triton_gemm.linear(torch.randn(ms[0], k, device="cuda", dtype=torch.bfloat16), w, s, (128, 128),
                               out_dtype=torch.bfloat16, config=TritonConfig.from_dict(what),
                               counters=triton_gemm.fixup_counters(n, "cuda"))
        else:
            selection = _worker_selection()
            layer = bench.single_backend(selection, next(b for b in selection.chain if b.name == what)).prepare(w, s)
            for m in ms:
                layer(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        torch.cuda.synchronize()
        return f"{kind} {n}x{k}", None
    except Exception as exc:  # noqa: BLE001 - the timed run meets the same failure and records it
        return f"{kind} {n}x{k}", f"{type(exc).__name__}: {exc}"[:200]


@functools.cache
def _worker_weight(n: int, k: int) -> Any:
    return bench.random_weight(n, k, "cuda")


@functools.cache
def _worker_selection() -> Any:
    import fp8select

    return fp8select.resolve(plugins=False, verify=False)


class Harness:
    """Triton configs timed on a set of (N, K) weights at several M; per point the table's time and the best."""

    def __init__(self, shapes: tuple[tuple[int, int], ...], ms: tuple[int, ...], table: dict[Point, TritonConfig],
                 replays: int, seed: int, errors: Counter[str]) -> None:
        import torch

        from fp8select.kernels import triton_gemm

        self.torch, self.tg, self.replays, self.errors = torch, triton_gemm, replays, errors
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.units: dict[tuple[int, int], dict[str, Any]] = {}
        self.points: dict[Point, dict[str, Any]] = {}
        self.times: dict[TritonConfig, dict[Point, float | None]] = {}
        for n, k in shapes:
            w, s = bench.random_weight(n, k, "cuda", gen)
            reference = bench.reference_for(w, s, (128, 128))
            xs = {m: torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen) for m in ms}
            self.units[(n, k)] = {"w": bench.rotated(w), "s": s, "x": xs,
                                  "ref": {m: reference(x) for m, x in xs.items()}, "counters": triton_gemm.fixup_counters(n, "cuda")}
            del reference
            self.points.update({(n, k, m): {"table_config": table.get((n, k, m_bucket(m))), "tried": 0, "failed": 0} for m in ms})

    def time(self, n: int, k: int, m: int, cfg: TritonConfig) -> float | None:
        """Median microseconds of the whole op with ``cfg``; None when it failed or was wrong (reason counted)."""
        point, unit, seen = self.points[(n, k, m)], self.units[(n, k)], self.times.setdefault(cfg, {})
        if (n, k, m) in seen:
            return seen[(n, k, m)]
        run = functools.partial(self.tg.linear, block_size=(128, 128), out_dtype=self.torch.bfloat16, config=cfg,
                                counters=unit["counters"])
        point["tried"] += 1
        seen[(n, k, m)] = None
        try:
            if bench.checked_call(lambda x: run(x, unit["w"][0], unit["s"]), unit["x"][m], unit["ref"][m]) is None:
                raise ValueError(f"relative error >= {bench.REL_ERR_MAX} (or not finite)")
            us = timing.time_graph([functools.partial(run, unit["x"][m], w, unit["s"]) for w in unit["w"]], self.replays).median_us
        except Exception as exc:  # noqa: BLE001 - a config that fails to compile or is wrong is data
            point["failed"] += 1
            self.errors[f"{cfg.describe()}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:200]] += 1
            try:  # a sticky error (illegal address, ...) loses the context: nothing later could run
                self.torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                raise KeyboardInterrupt(f"CUDA context lost after {cfg.describe()}: {exc}"[:300]) from exc
            return None
        seen[(n, k, m)] = us
        if cfg == point["table_config"]:
            point["table"] = {"us": round(us, 3), "config": cfg.to_dict()}
        if us < point.get("best", {}).get("us", math.inf):
            point["best"] = {"us": round(us, 3), "config": cfg.to_dict()}
        return us

    def score(self, times: dict[Point, float | None], keys: list[Point]) -> float:
        """Geomean over ``keys`` of time / the table's time there (inf unless every point ran)."""
        ratios = [t / self.points[p].get("table", self.points[p].get("best", {})).get("us", math.inf)
                  for p in keys if (t := times.get(p)) is not None]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if len(ratios) == len(keys) else math.inf


def decode_sweep(h: Harness, work: Work, deadline: float) -> dict[int, int]:
    """Per M: the table's families, then ranked/random families alternating with hill-climbing from the best."""
    timed = {}
    for i, m in enumerate(DECODE_M):
        m_end = time.monotonic() + (deadline - time.monotonic()) / (len(DECODE_M) - i)
        keys = [(n, k, m) for n, k in work.decode_shapes]
        explore, climb, seen, best = deque(work.decode_families[m]), deque[TritonConfig](), set[TritonConfig](), math.inf
        tables = {replace(c, SPLIT_K=1) for p in keys if (c := h.points[p]["table_config"]) is not None} & set(explore)
        while (explore or climb) and time.monotonic() < m_end:
            fam = explore.popleft() if not climb or (explore and (tables - seen or len(seen) % 2)) else climb.popleft()
            if fam in seen:
                continue
            seen.add(fam)
            times: dict[Point, float | None] = {}
            for n, k, _ in keys:
                table = h.points[(n, k, m)]["table_config"]
                extra = (table.SPLIT_K,) if table is not None and replace(table, SPLIT_K=1) == fam else ()
                for cfg in concrete(fam, n, k, m, extra):
                    if time.monotonic() < m_end and (us := h.time(n, k, m, cfg)) is not None:
                        times[(n, k, m)] = min(us, times.get((n, k, m)) or math.inf)
            if (score := h.score(times, keys)) < best:
                best = score
                climb.extendleft(reversed([c for c in neighbours(fam) if c not in seen]))
        timed[m] = len(seen)
        _log(f"decode M={m}: {len(seen)} families, best geomean vs table {best:.3f}")
    return timed


def prefill_sweep(h: Harness, work: Work, deadline: float) -> dict[str, Any]:
    """Each point's table config, then each large-tile config at M 4096 and, unless > PRUNE x the table, below."""
    order = [(n, k, m) for m in sorted(PREFILL_M, reverse=True) for n, k in work.prefill_shapes]
    for p in order:
        if (table := h.points[p]["table_config"]) is not None and time.monotonic() < deadline:
            h.time(*p, table)
    tried = 0
    for cfg in work.prefill_configs:
        tried += time.monotonic() < deadline
        for stage in (order[: len(work.prefill_shapes)], order[len(work.prefill_shapes):]):
            for p in (p for p in stage if time.monotonic() < deadline):
                h.time(*p, cfg)
            if h.score(h.times.get(cfg, {}), stage) > PRUNE:
                break
    return _uniform(h, order, tried)


def _uniform(h: Harness, keys: list[Point], tried: int) -> dict[str, Any]:
    """The one config best over every point (geomean against the table), if any ran everywhere."""
    best = min(h.times, key=lambda c: h.score(h.times[c], keys), default=None)
    score = h.score(h.times[best], keys) if best is not None else math.inf
    return {"configs_tried": tried, "best_uniform": {"config": best.to_dict(), "time_vs_table": round(score, 4)}
            if best is not None and score < math.inf else None}


def weight_floor_us(n: int, k: int) -> float:
    """Weight and block-scale bytes over the HBM rate: what a decode call cannot beat."""
    return roofline.weight_bytes(n, k) / roofline.HBM_BYTES_PER_S * 1e6


def vendor_rows(rows: list[dict[str, Any]], skipped: dict[str, str]) -> dict[Point, dict[str, dict[str, float]]]:
    """``bench.measure`` rows as point -> backend -> {"whole", "gemm"} medians; reasons of failures into ``skipped``."""
    out: dict[Point, dict[str, dict[str, float]]] = {}
    for r in rows:
        if "whole" in r:
            out.setdefault((r["n"], r["k"], r["m"]), {})[r["backend"]] = {
                "whole": r["whole"]["median_us"], **({"gemm": r["gemm"]["median_us"]} if "gemm" in r else {})}
        elif r.get("skipped") or r.get("error") or r.get("correct") is False:
            skipped.setdefault(r["backend"], r.get("skipped") or r.get("error") or f"rel_err {r.get('rel_err')}")
    return out


def points(h: Harness, vendors: dict[Point, dict[str, dict[str, float]]], decode: bool) -> list[dict[str, Any]]:
    """Per point: table and sweep-best (time, config; at decode the HBM fraction), the vendors, the Triton layer.

    At prefill, Triton against the vendors is the layer's time next to theirs (one interleaved timing,
    ``bench.measure``); the sweep's times come from another phase, so only its gain over the table is kept."""
    out = []
    for (n, k, m), p in sorted(h.points.items()):
        floor, v = weight_floor_us(n, k), {b: t["whole"] for b, t in vendors.get((n, k, m), {}).items()}
        layer = v.pop("triton", None)
        e: dict[str, Any] = {"n": n, "k": k, "m": m, **({"floor_us": round(floor, 3)} if decode else {}), "tried": p["tried"],
                             "failed": p["failed"], "triton_layer_us": layer}
        for key, name in (("table", "table"), ("best", "sweep")):
            if key in p:
                e[name] = {**p[key], **({"frac": round(floor / p[key]["us"], 4)} if decode else {})}
        if "table" in e and "sweep" in e:
            e["sweep_gain"] = round(e["table"]["us"] / e["sweep"]["us"], 4)
        if decode and v:
            best = min(v, key=lambda b: v[b])
            e["vendor"] = {"name": best, "us": v[best], "frac": round(floor / v[best], 4), "all_us": v}
        elif v:
            e["vendors_us"] = v
            if layer:
                e["layer_speed_vs"] = {b: round(t / layer, 4) for b, t in v.items()}
        out.append(e)
    return out


def quant_points(vendors: dict[Point, dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """Per point and backend, whole op / GEMM alone; and ``floor_ratio``: the fastest backend's GEMM alone plus
    its quantizer at the HBM rate, over that GEMM: the least ratio a quantizer outside the GEMM can give."""
    out = []
    for (n, k, m), by in sorted(vendors.items()):
        ratios = {b: {"whole_us": t["whole"], "gemm_us": t["gemm"], "ratio": round(t["whole"] / t["gemm"], 4)}
                  for b, t in by.items() if m in QUANT_M and "gemm" in t}
        if ratios:
            fastest = min(ratios, key=lambda b: ratios[b]["whole_us"])
            gemm, quant = ratios[fastest]["gemm_us"], roofline.quant_bytes(m, k) / roofline.HBM_BYTES_PER_S * 1e6
            out.append({"n": n, "k": k, "m": m, "backends": ratios, "fastest": fastest,
                        "fastest_ratio": ratios[fastest]["ratio"], "floor_ratio": round((gemm + quant) / gemm, 4)})
    return out


def _stats(values: list[float], name: str) -> dict[str, Any]:
    return {f"{name}_geomean": _geomean(values), f"{name}_min": min(values, default=None), f"{name}_max": max(values, default=None)}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    dec, quant, pre = (report.get(key, {}).get("points", []) for key in ("decode", "quant", "prefill"))
    d: dict[str, Any] = {"points": len(dec)}
    for name in ("table", "sweep", "vendor"):
        fr = [p[name]["frac"] for p in dec if name in p]
        d.update(_stats(fr, f"{name}_frac"), **{f"{name}_points_at_0.75": sum(f >= 0.75 for f in fr)})
    gains = [p["sweep_gain"] for p in dec if "sweep_gain" in p]
    d.update(_stats(gains, "sweep_gain"), sweep_beats_table_by_2pct=sum(g > 1.02 for g in gains))
    q: dict[str, Any] = {"points": len(quant), "fastest": dict(Counter(p["fastest"] for p in quant))}
    for b in ("triton", *PREFILL_VENDORS):
        q.update(_stats([p["backends"][b]["ratio"] for p in quant if b in p["backends"]], f"{b}_whole_over_gemm"))
    q.update(_stats([p["fastest_ratio"] for p in quant], "fastest_whole_over_gemm"),
             fastest_within_5pct=sum(p["fastest_ratio"] <= 1.05 for p in quant),
             floor_within_5pct=sum(p["floor_ratio"] <= 1.05 for p in quant))
    layer = {(p["n"], p["k"], p["m"]): p["layer_speed_vs"]["cuda-scaled-mm"] for p in pre
             if "cuda-scaled-mm" in p.get("layer_speed_vs", {})}
    gain = {(p["n"], p["k"], p["m"]): p["sweep_gain"] for p in pre if "sweep_gain" in p}
    pf: dict[str, Any] = {"points": len(pre), **_stats(list(layer.values()), "layer_speed_vs_cublas"),
                          **_stats(list(gain.values()), "sweep_gain"),
                          # the sweep's best config in the layer: the layer's ratio times the sweep's gain over the table
                          **_stats([round(r * gain[key], 4) for key, r in layer.items() if key in gain],
                                   "sweep_projected_vs_cublas")}
    pf["layer_reaches_0_85"] = (pf["layer_speed_vs_cublas_geomean"] or 0) >= 0.85
    return {"decode": d, "quant": q, "prefill": pf}


def markdown(report: dict[str, Any]) -> str:
    d, q, p = (report["summary"][key] for key in ("decode", "quant", "prefill"))
    floor = report.get("launch_floor", {})

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def pair(s: dict[str, Any], name: str) -> str:
        return f"{f(s.get(name + '_geomean'))} ({f(s.get(name + '_min'))})"

    return "\n".join([
        f"## Triton limits on {report.get('environment', {}).get('device', '?')} ({report['elapsed_s']} s, "
        f"complete: {report['complete']})", "",
        f"Launch floor: graph of 1 kernel {f(floor.get('graph_of_1_kernel', {}).get('median_us'))} us, per kernel in a "
        f"graph of 16 {f(floor.get('per_kernel_in_graph_of_16', {}).get('median_us'))} us.", "",
        "| geomean (min) | table config | best of sweep | fastest vendor |", "|---|---|---|---|",
        f"| decode HBM fraction, {d['points']} points | {pair(d, 'table_frac')} | {pair(d, 'sweep_frac')} | {pair(d, 'vendor_frac')} |",
        f"| prefill speed vs cuBLAS, {p['points']} points | {pair(p, 'layer_speed_vs_cublas')} (the layer) | "
        f"{pair(p, 'sweep_projected_vs_cublas')} (projected) | - |", "",
        f"Sweep over table: decode geomean {f(d['sweep_gain_geomean'])}, max {f(d['sweep_gain_max'])} "
        f"({d['sweep_beats_table_by_2pct']} points > 2%); prefill geomean {f(p['sweep_gain_geomean'])}, max {f(p['sweep_gain_max'])}.",
        f"Quantization, fastest whole op / its GEMM alone: geomean {f(q['fastest_whole_over_gemm_geomean'])}, max "
        f"{f(q['fastest_whole_over_gemm_max'])}; within 5% at {q['fastest_within_5pct']} of {q['points']} points "
        f"(fastest: {q['fastest']}); a quantizer at the HBM rate could be at {q['floor_within_5pct']}."])


def run(args: argparse.Namespace, work: Work, report: dict[str, Any], write: Any) -> None:
    import torch

    vendors, phases = tuple(args.vendors.split(",")), set(args.phases.split(","))
    tasks = warm_tasks(work, vendors, phases) if args.warm_procs > 0 else []
    pool = multiprocessing.get_context("spawn").Pool(args.warm_procs) if tasks else None
    done, errs = 0, Counter[str]()
    try:  # the workers compile while this process resolves; nothing is timed until they are gone
        results = pool.imap_unordered(_warm_task, tasks) if pool is not None else None
        torch.cuda.set_device(0)  # the first of CUDA_VISIBLE_DEVICES
        import fp8select

        selection = fp8select.resolve(plugins=False, verify=False)
        report.update(environment=bench.environment(), chain=[b.name for b in selection.chain])
        while results is not None and time.monotonic() < _T0 + args.warm_s:
            try:
                label, err = results.next(timeout=max(0.1, _T0 + args.warm_s - time.monotonic()))
            except (StopIteration, multiprocessing.TimeoutError):
                break
            done += 1
            errs.update([f"{label}: {err}"] if err else [])
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    report["warm"] = {"jobs": len(tasks), "done": done, "until_s": round(time.monotonic() - _T0, 1), "errors": dict(errs.most_common(10))}
    _log(f"warm-up: {done}/{len(tasks)} compile jobs done; chain {report['chain']}")
    if "floor" in phases:
        t = torch.zeros(1, device="cuda")
        report["launch_floor"] = {"graph_of_1_kernel": timing.time_graph([t.zero_], args.replays).to_dict(),
                                  "per_kernel_in_graph_of_16": timing.time_graph([t.zero_] * 16, args.replays).to_dict()}
    write()
    end, errors, order = _T0 + args.budget_s - RESERVE_S, Counter[str](), [p for p in PHASE_WEIGHTS if p.split("-")[0] in phases]
    report["skipped_backends"] = {}

    def deadline(phase: str) -> float:
        share = PHASE_WEIGHTS[phase] / sum(PHASE_WEIGHTS[p] for p in order[order.index(phase):])
        return time.monotonic() + max(0.0, end - time.monotonic()) * share

    def measure(phase: str, shapes: tuple[tuple[int, int], ...], ms: tuple[int, ...], names: list[str]) -> Any:
        rows = bench.measure(selection, shapes, sorted(ms), backends=names, replays=args.replays, seed=args.seed, auto=False,
                             bf16=False, gemm_alone=phase.startswith("prefill"), budget_s=deadline(phase) - time.monotonic(),
                             progress=_log)
        return vendor_rows(rows, report["skipped_backends"])

    prefill_names = ["triton", *(v for v in PREFILL_VENDORS if v in vendors)]
    for phase, shapes, ms, names in (("decode", work.decode_shapes, DECODE_M, [*vendors, "triton"]),
                                     ("prefill", work.prefill_shapes, PREFILL_M, prefill_names)):
        if phase not in phases:
            continue
        by_point = measure(f"{phase}-vendors", shapes, ms, names)
        if phase == "prefill":
            report["quant"] = {"points": quant_points(by_point)}
        h = Harness(shapes, tuple(sorted(ms)), work.table, args.replays, args.seed + (phase == "prefill"), errors)
        report[phase] = {"points": points(h, by_point, phase == "decode")}
        write()
        try:
            sweep = decode_sweep if phase == "decode" else prefill_sweep
            report[phase]["sweep"] = sweep(h, work, deadline(f"{phase}-sweep"))
        finally:
            report[phase]["points"] = points(h, by_point, phase == "decode")
            report["errors"] = dict(errors.most_common(20))
            write()
            del h
            torch.cuda.empty_cache()
    report["complete"] = True


def describe(work: Work, args: argparse.Namespace) -> str:
    """The planned work, for ``--dry-run``."""
    lines = [f"decode: shapes (N*K >= 16M) {list(work.decode_shapes)}, M {list(DECODE_M)} (in this order)"]
    for m, fams in work.decode_families.items():
        per_point = [sum(len(concrete(f, n, k, m)) for f in fams) for n, k in work.decode_shapes]
        lines.append(f"  M={m:>2}: {len(fams)} families before hill-climbing (table's, {len(_DECODE_RANKED)} ranked, "
                     f"{args.random_families} random), {min(per_point)}-{max(per_point)} configs per point with split-K")
    phases = set(args.phases.split(","))
    lines += [f"prefill: shapes {list(work.prefill_shapes)}, M {list(PREFILL_M)}; quantization ratios at M {list(QUANT_M)}",
              f"  the table config and {len(work.prefill_configs)} large-tile gemm configs per point "
              f"({len(work.prefill_shapes) * len(PREFILL_M)} points), pruned after M 4096 when over {PRUNE}x the table",
              f"vendors (bench.measure, pinned, interleaved): decode {args.vendors} + triton; prefill triton + "
              f"{', '.join(v for v in PREFILL_VENDORS if v in args.vendors)} (whole op and GEMM alone)",
              f"warm-up: {len(warm_tasks(work, tuple(args.vendors.split(',')), phases))} compile jobs on {args.warm_procs} "
              f"processes until {args.warm_s:.0f} s; then {PHASE_WEIGHTS} share the rest of {args.budget_s:.0f} s"]
    return "\n".join(lines)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", help="JSON file, rewritten after every step")
    parser.add_argument("--budget-s", type=float, default=240.0, help="wall-clock budget from process start")
    parser.add_argument("--warm-s", type=float, help="end of the compile phase from start (default: 30%% of the budget)")
    parser.add_argument("--warm-procs", type=int, default=max(0, min(12, (os.cpu_count() or 2) - 2)),
                        help="compile worker processes (0: compile inside the timed run)")
    parser.add_argument("--vendors", default=",".join(VENDORS), help="vendor backends to time (comma list)")
    parser.add_argument("--phases", default="floor,decode,prefill", help="subset of floor,decode,prefill")
    parser.add_argument("--random-families", type=int, default=6, help="random decode families per M")
    parser.add_argument("--random-prefill", type=int, default=4, help="random large-tile prefill configs")
    parser.add_argument("--replays", type=int, default=50, help="graph replays per timing (>= 50 for reported figures)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="print the planned work and exit (no CUDA)")
    args = parser.parse_args(argv)
    args.warm_s = 0.3 * args.budget_s if args.warm_s is None else args.warm_s
    random.seed(args.seed)
    work = plan_work(args.seed, args.random_families, args.random_prefill)
    if args.dry_run:
        print(describe(work, args))
        return 0
    if not args.out:
        parser.error("--out is required (or --dry-run)")
    require_cuda("limits")
    import torch

    torch.manual_seed(args.seed)
    out = Path(args.out)
    report: dict[str, Any] = {"args": vars(args), "complete": False, "notes":
                              "us: median microseconds of the whole op (bf16 in, quantization included) unless gemm; frac: (weight + "
                              "scale bytes) / 4.3e12 B/s / time; layer_speed_vs: X time / the Triton layer's, timed together; "
                              "sweep includes the table config; sweep_projected: the layer's ratio times the sweep's gain over the table"}

    def write() -> None:
        report["elapsed_s"] = round(time.monotonic() - _T0, 1)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, out)

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        run(args, work, report, write)
    except KeyboardInterrupt as exc:
        report["stopped"] = str(exc) or "interrupted (SIGTERM or Ctrl-C)"
    finally:
        report["summary"] = summarize(report)
        write()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
