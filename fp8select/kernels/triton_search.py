"""Launch configs of the Triton block-FP8 kernels: schema, defaults and the tuning search.

Pure Python (no torch, no triton), so a tuning driver can plan its work, and tools can read
configs, without a GPU stack. :mod:`.triton_gemm` takes its config schema from here.

A config is a dict with the launch keys :data:`CONFIG_KEYS` (ints), and optionally
``"path"`` (one of :data:`PATHS`, which kernel runs an unquantized linear) and ``"FIXUP"``
(0/1, how split-K partials are summed). The paths:

``gemm``
    Triton activation quantization kernel, then the ``[BLOCK_M, BLOCK_N]`` GEMM kernel
    (two launches; three with a two-pass split-K). The reference path.
``fused``
    The same GEMM kernel quantizing each ``[BLOCK_M, 128]`` activation tile in its K loop.
``decode``
    Swap-AB GEMM for small M: each program computes a ``[BLOCK_N, BLOCK_M]`` tile of the
    transposed output as ``W_tile @ Xq_tile^T``, so the weight rows fill the MMA's 64-row
    side (wgmma on Hopper) and the few tokens its narrow side, and it quantizes the
    activation inside its K loop (only ``next_pow2(M)`` rows, broadcast to the tile); with
    ``FIXUP`` (default here) split-K finishes in the same launch. One launch in all.
``swap``
    Triton quantization kernel, then the swap-AB GEMM on the fp8 activation.

``FIXUP=1``: with ``SPLIT_K > 1`` each program stores its fp32 partial, and the last program
of a tile to arrive (an atomic counter) sums all partials in split order and writes the
output, so no reduction launch follows; results are bitwise equal to ``FIXUP=0`` (a second
kernel sums in the same order).

:func:`candidates`, :func:`neighbours` and :func:`search` drive the GPU tuning (the
``tune`` command and ``benchmarks/sweep_triton.py``): a ranked first round over paths and
tiles, then hill-climbing around the fastest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "CONFIG_KEYS",
    "M_BUCKET_MAX",
    "NOMINAL_SMS",
    "OPTIONAL_KEYS",
    "PATHS",
    "PREQUANT_PATHS",
    "QUANT_FUSED_PATHS",
    "SCALE_GROUP_K",
    "SMEM_LIMIT_BYTES",
    "SWAP_PATHS",
    "candidates",
    "fill_split",
    "heuristic_config",
    "m_bucket",
    "neighbours",
    "search",
    "smem_bytes",
    "validate_config",
]

SCALE_GROUP_K = 128
"""K elements per activation and weight scale; also every kernel's BLOCK_K."""

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")
"""Launch keys every config has (positive ints)."""

OPTIONAL_KEYS = ("path", "FIXUP", "TMA")
"""Keys a config may add: the linear path, the split-K summation mode, and ``TMA: 1`` (weight and,
in the tile kernel, fp8 activation tiles loaded through Hopper TMA descriptors; ignored where a
descriptor cannot be built, and by the fused path's activation)."""

PATHS = ("gemm", "fused", "decode", "swap")
"""Ways to run a linear on an unquantized activation (see the module docstring)."""

SWAP_PATHS = ("decode", "swap")
"""Paths that run the swap-AB kernel."""

QUANT_FUSED_PATHS = ("fused", "decode")
"""Paths that quantize the activation inside the GEMM (one kernel, no fp8 activation in memory)."""

PREQUANT_PATHS = ("gemm", "swap")
"""Paths that run on an already-quantized activation (after the quantization kernel)."""

M_BUCKET_MAX = 8192
"""Largest M bucket; larger M shares its config."""

NOMINAL_SMS = 132
"""SM count defaults are sized for (H100/H200 SXM)."""

SMEM_LIMIT_BYTES = 227 * 1024
"""Shared memory one program may use on sm90 (opt-in limit per block)."""

MAX_SPLIT_K = 16
STAGES_MIN, STAGES_MAX = 2, 6

_HEURISTIC_TILES = (
    # (largest M bucket, BLOCK_M, BLOCK_N, num_warps, num_stages) of the gemm/fused paths
    (16, 16, 64, 4, 4),
    (32, 32, 64, 4, 4),
    (64, 64, 64, 4, 4),
    (512, 64, 128, 4, 3),
    (M_BUCKET_MAX, 128, 128, 8, 3),
)


def m_bucket(m: int) -> int:
    """M bucket used as the table key: next power of two >= ``m``, at least 1, at most 8192."""
    if m <= 1:
        return 1
    return min(1 << (m - 1).bit_length(), M_BUCKET_MAX)


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check a launch config and return it as a plain dict (launch keys first, in order).

    ``"path"`` and ``"FIXUP"`` are kept when present. Raises ``ValueError`` naming the
    offending key, what was required and what was found.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    missing = [key for key in CONFIG_KEYS if key not in config]
    extra = [key for key in config if key not in CONFIG_KEYS and key not in OPTIONAL_KEYS]
    if missing or extra:
        raise ValueError(
            f"config keys must be {CONFIG_KEYS} (optionally {OPTIONAL_KEYS}); missing {missing}, unknown {extra}"
        )
    cfg: dict[str, Any] = {key: config[key] for key in CONFIG_KEYS}
    for key, value in cfg.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"config[{key!r}] must be a positive int, got {value!r}")
    if cfg["BLOCK_K"] != SCALE_GROUP_K:
        raise ValueError(f"config['BLOCK_K'] must be {SCALE_GROUP_K} (the scale group), got {cfg['BLOCK_K']}")
    for key in ("BLOCK_M", "BLOCK_N", "num_warps"):
        if cfg[key] & (cfg[key] - 1):
            raise ValueError(f"config[{key!r}] must be a power of two, got {cfg[key]}")
    for key in ("BLOCK_M", "BLOCK_N"):
        if cfg[key] < 16:
            raise ValueError(f"config[{key!r}] must be >= 16 (tl.dot minimum), got {cfg[key]}")
    if "path" in config:
        if config["path"] not in PATHS:
            raise ValueError(f"config['path'] must be one of {PATHS}, got {config['path']!r}")
        cfg["path"] = config["path"]
    for key in ("FIXUP", "TMA"):
        if key in config:
            value = config[key]
            if isinstance(value, bool) or value not in (0, 1):
                raise ValueError(f"config[{key!r}] must be 0 or 1, got {value!r}")
            cfg[key] = int(value)
    if cfg.get("TMA") == 0:
        del cfg["TMA"]  # the default: one spelling per config
    return cfg


def _next_pow2(value: int) -> int:
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def fill_split(n: int, k: int, m: int, block_m: int, block_n: int, sms: int = NOMINAL_SMS, *,
               programs_per_sm: int = 2, min_blocks: int = 4) -> int:
    """Smallest power-of-two split-K giving ``programs_per_sm`` programs per SM, keeping at
    least ``min_blocks`` K blocks per split (the pipeline needs a few iterations)."""
    tiles = math.ceil(max(m, 1) / block_m) * math.ceil(max(n, 1) / block_n)
    k_blocks = math.ceil(max(k, 1) / SCALE_GROUP_K)
    split = 1
    while split < MAX_SPLIT_K and tiles * split < programs_per_sm * sms and k_blocks // (2 * split) >= min_blocks:
        split *= 2
    return split


def _make(path: str, block_m: int, block_n: int, warps: int, stages: int, split: int = 1, *,
          group_m: int = 8, fixup: int | None = None, tma: int = 0) -> dict[str, Any]:
    """A full config in the canonical key order (``TMA`` only when set)."""
    cfg = {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": SCALE_GROUP_K,
        "GROUP_M": group_m,
        "SPLIT_K": split,
        "num_warps": warps,
        "num_stages": stages,
        "path": path,
        "FIXUP": (1 if path in SWAP_PATHS else 0) if fixup is None else fixup,
    }
    if tma:
        cfg["TMA"] = 1
    return cfg


def _swap_block_m(m: int) -> int:
    """Token tile of the swap-AB kernel: the MMA's narrow side, 16 to 64."""
    return min(64, max(16, _next_pow2(m)))


def heuristic_config(n: int, k: int, m: int, path: str = "gemm", *, sms: int = NOMINAL_SMS) -> dict[str, Any]:
    """Default config of ``path`` for shapes no table covers (full, with ``path`` and ``FIXUP``).

    gemm/fused: small M is bound by weight bytes (narrow tiles, split-K to ~2 programs per
    SM); large M by tensor-core throughput (128-wide tiles, 8 warps). decode/swap: 128 weight
    rows by ``next_pow2(M)`` (16..64) tokens, split-K to ~2 programs per SM.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    bucket = m_bucket(m)
    if path in SWAP_PATHS:
        block_m, block_n, warps, stages = _swap_block_m(m), 128, 4, 4
    else:
        block_m, block_n, warps, stages = next(tile for top, *tile in _HEURISTIC_TILES if bucket <= top)
    split = fill_split(n, k, m, block_m, block_n, sms)
    return _make(path, block_m, block_n, warps, stages, split)


def smem_bytes(cfg: Mapping[str, Any]) -> int:
    """Shared memory a config's pipelined tiles need (estimate; bf16 activations when fused).

    The fused paths also stage the quantized tile for the MMA once per iteration.
    """
    path = cfg.get("path", "gemm")
    bm, bn, stages = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_stages"]
    k = SCALE_GROUP_K
    if path in QUANT_FUSED_PATHS:
        return stages * (bm * k * 2 + bn * k) + bm * k
    return stages * (bm * k + bn * k)


def _fits(cfg: Mapping[str, Any]) -> bool:
    return smem_bytes(cfg) <= SMEM_LIMIT_BYTES and STAGES_MIN <= cfg["num_stages"] <= STAGES_MAX


_Plan = tuple[str, int, int, int, int, int, int]
"""(path, BLOCK_M, BLOCK_N, num_warps, num_stages, GROUP_M, TMA) of a ranked first-round config."""


def _small_m_plan(m: int) -> list[_Plan]:
    """M <= 16 (decode), best guess first: bound by weight bytes, so the single-launch decode
    path leads; the run-1 gemm winners stay in for comparison."""
    bm = _swap_block_m(m)
    return [
        ("decode", bm, 128, 4, 4, 8, 0),
        ("gemm", 16, 128, 4, 4, 8, 0),  # the measured run-1 winner family at M <= 16
        ("decode", bm, 256, 4, 4, 8, 0),
        ("decode", bm, 64, 4, 6, 8, 0),
        ("decode", bm, 128, 4, 4, 8, 1),
        ("swap", bm, 128, 4, 4, 8, 0),
        ("gemm", 16, 64, 4, 4, 8, 0),
        ("fused", 16, 128, 4, 3, 8, 0),
        ("decode", bm, 128, 8, 4, 8, 0),
        ("decode", bm, 256, 8, 3, 8, 1),
        ("gemm", 16, 128, 8, 3, 8, 0),
    ]


def _mid_m_plan(m: int) -> list[_Plan]:
    """16 < M <= 64."""
    bm = _next_pow2(m)
    return [
        ("gemm", bm, 128, 4, 4, 8, 0),
        ("decode", bm, 128, 4, 4, 8, 0),
        ("gemm", bm, 64, 4, 3, 8, 0),
        ("swap", bm, 128, 4, 4, 8, 0),
        ("decode", bm, 256, 8, 3, 8, 0),
        ("gemm", bm, 128, 4, 4, 8, 1),
        ("gemm", bm, 256, 8, 3, 8, 0),
        ("swap", bm, 256, 8, 3, 8, 1),
        ("fused", bm, 128, 4, 3, 8, 0),
    ]


def _large_m_plan(bucket: int) -> list[_Plan]:
    """M > 64, bound by tensor-core throughput.

    The K loop waits for each K block's MMA before scaling it into the accumulator, so the
    tile is capped by registers (accumulator + that block's product = 2 x BM*BN/threads fp32
    registers: 128x256 at 8 warps spills; tried anyway, the search settles it). 128x128 with
    8 warps (two warpgroups of 64x128) lets one warpgroup scale while the other's MMA runs;
    TMA tile loads free the issue slots and registers the address arithmetic of 16-byte
    cp.async loads takes.
    """
    if bucket <= 512:
        plan: list[_Plan] = [
            ("gemm", 64, 128, 4, 3, 8, 0),
            ("gemm", 128, 128, 8, 3, 8, 0),
            ("gemm", 64, 64, 4, 3, 8, 0),
            ("gemm", 64, 256, 8, 3, 8, 0),
            ("gemm", 128, 128, 8, 4, 8, 1),
            ("gemm", 128, 64, 4, 4, 8, 0),
            ("gemm", 64, 128, 4, 4, 8, 1),
            ("gemm", 128, 256, 8, 3, 8, 0),
        ]
        if bucket <= 128:
            plan.insert(3, ("swap", 64, 128, 4, 4, 8, 0))
        return plan
    return [
        ("gemm", 128, 128, 8, 4, 8, 0),
        ("gemm", 64, 256, 8, 3, 8, 0),  # run-1 winner at M >= 2048
        ("gemm", 128, 128, 8, 4, 8, 1),
        ("gemm", 128, 256, 8, 3, 8, 0),
        ("gemm", 256, 128, 8, 3, 8, 0),
        ("gemm", 64, 256, 8, 3, 8, 1),
        ("gemm", 128, 128, 8, 3, 16, 0),
        ("gemm", 128, 64, 4, 4, 8, 0),
        ("gemm", 128, 256, 8, 3, 8, 1),
        ("gemm", 64, 128, 4, 4, 8, 0),
        ("gemm", 128, 128, 8, 5, 8, 0),
        ("gemm", 256, 64, 8, 4, 8, 0),
        ("gemm", 128, 128, 4, 3, 8, 0),
    ]


def candidates(n: int, k: int, m: int, *, sms: int = NOMINAL_SMS, limit: int = 8,
               paths: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """First-round configs for an ``[m, k] x [n, k]^T`` linear, best guess first.

    Every config is full (launch keys, ``path`` and ``FIXUP``), valid, fits in shared memory,
    and has the split-K that fills ``sms`` SMs (M <= 512). Paths are interleaved so that a
    short list still compares them: decode first for M <= 16, the gemm path for large M.
    ``paths`` keeps only those paths (default: all).
    """
    allowed = _allowed(paths)
    bucket = m_bucket(m)
    if bucket <= 16:
        plan = _small_m_plan(m)
    elif bucket <= 64:
        plan = _mid_m_plan(m)
    else:
        plan = _large_m_plan(bucket)
    out: list[dict[str, Any]] = []
    for path, bm, bn, warps, stages, group, tma in plan:
        split = fill_split(n, k, m, bm, bn, sms) if bucket <= 512 else 1
        cfg = _make(path, bm, bn, warps, stages, split, group_m=group, tma=tma)
        if path in allowed and _fits(cfg) and cfg not in out:
            out.append(validate_config(cfg))
    if not out:  # e.g. only paths the plan does not rank for this M: their default config
        out.append(heuristic_config(n, k, m, allowed[0], sms=sms))
    return out[: max(1, limit)]


def neighbours(config: Mapping[str, Any], n: int, k: int, m: int, *, sms: int = NOMINAL_SMS,
               paths: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Configs one step from ``config`` (same path first), most promising first.

    Steps: split-K x2 and /2 (M <= 512), pipeline depth +-1, BLOCK_N x2 and /2 (with the
    split refitted), warps 4 <-> 8, GROUP_M 8 <-> 16 and BLOCK_M x2 / 2 for large M, the
    other split-K summation mode, TMA loads on/off, and the sibling path with the same tiles
    (decode <-> swap, gemm <-> fused for M <= 64), keeping only ``paths`` (default: all).
    """
    allowed = _allowed(paths)
    base = validate_config(config)
    base.setdefault("path", "gemm")
    base.setdefault("FIXUP", 1 if base["path"] in SWAP_PATHS else 0)
    k_blocks = math.ceil(max(k, 1) / SCALE_GROUP_K)
    bucket = m_bucket(m)
    out: list[dict[str, Any]] = []

    def add(**change: Any) -> None:
        new = {**base, **change}
        if new["SPLIT_K"] == 1:
            new["FIXUP"] = 1 if new["path"] in SWAP_PATHS else 0
        if new["path"] == "fused" or not new.get("TMA", 1):
            new.pop("TMA", None)
        if new["path"] in allowed and new != base and new not in out and _fits(new):
            out.append(validate_config(new))

    split = base["SPLIT_K"]
    if bucket <= 512:
        if split * 2 <= MAX_SPLIT_K and k_blocks // (split * 2) >= 2:
            add(SPLIT_K=split * 2)
        if split > 1:
            add(SPLIT_K=split // 2)
    add(num_stages=base["num_stages"] + 1)
    add(num_stages=base["num_stages"] - 1)
    for bn in (base["BLOCK_N"] * 2, base["BLOCK_N"] // 2):
        if 16 <= bn <= 256:
            new_split = fill_split(n, k, m, base["BLOCK_M"], bn, sms) if bucket <= 512 else 1
            add(BLOCK_N=bn, SPLIT_K=new_split)
    if base["BLOCK_M"] * base["BLOCK_N"] >= 64 * 64 or base["path"] in SWAP_PATHS:
        add(num_warps=8 if base["num_warps"] == 4 else 4)
    if bucket > 512:
        add(GROUP_M=16 if base["GROUP_M"] == 8 else 8)
        for bm in (base["BLOCK_M"] * 2, base["BLOCK_M"] // 2):
            if 16 <= bm <= 256:
                add(BLOCK_M=bm)
    if split > 1:
        add(FIXUP=1 - base["FIXUP"])
    if base["path"] != "fused":  # the fused path quantizes a bf16 tile: no TMA for it
        add(TMA=1 - base.get("TMA", 0))
    sibling = {"decode": "swap", "swap": "decode", "gemm": "fused", "fused": "gemm"}[base["path"]]
    if sibling in SWAP_PATHS or bucket <= 64:
        add(path=sibling, FIXUP=base["FIXUP"])
    return out


def _allowed(paths: Sequence[str] | None) -> tuple[str, ...]:
    if paths is None:
        return PATHS
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        raise ValueError(f"paths must be a non-empty subset of {PATHS}, got {list(paths)}")
    return tuple(paths)


def _key(cfg: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(cfg.items()))


def search(
    n: int,
    k: int,
    m: int,
    time_config: Callable[[dict[str, Any]], float | None],
    *,
    sms: int = NOMINAL_SMS,
    max_configs: int = 12,
    deadline: float = math.inf,
    paths: Sequence[str] | None = None,
) -> tuple[dict[str, Any] | None, float, list[dict[str, Any]]]:
    """Find the fastest config of the whole linear for one ``(n, k, m)``.

    ``time_config(cfg)`` runs one full config (with ``path``) and returns its median time in
    microseconds, or ``None`` when it failed or gave a wrong result (an exception it raises
    counts as a failure and is recorded). The first round times up to ~2/3 of
    ``max_configs`` of :func:`candidates`; the rest climbs: the neighbours of the fastest
    config not yet expanded (when none is left, the next untried candidate), until
    ``max_configs`` configs were timed or ``deadline`` (a ``time.monotonic()`` value)
    passed. At least one config is always timed.

    Returns ``(best config or None, its microseconds or inf, tried)``, ``tried`` being every
    timed config in order as ``{"config": cfg, "us": float | None}`` (plus ``"error"`` when
    ``time_config`` raised). ``paths`` restricts the search to those paths (default: all).
    """
    max_configs = max(1, max_configs)
    tried: list[dict[str, Any]] = []
    seen: set[tuple[tuple[str, Any], ...]] = set()

    def budget_left() -> bool:
        return len(tried) < max_configs and (not tried or time.monotonic() < deadline)

    def run(cfg: dict[str, Any]) -> None:
        seen.add(_key(cfg))
        record: dict[str, Any] = {"config": cfg, "us": None}
        try:
            us = time_config(dict(cfg))
            if us is not None and math.isfinite(us) and us > 0:
                record["us"] = float(us)
        except Exception as exc:  # noqa: BLE001 - a failing config is data, not a crash
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        tried.append(record)

    ranked_all = candidates(n, k, m, sms=sms, limit=64, paths=paths)
    for cfg in ranked_all[: max(1, math.ceil(max_configs * 2 / 3))]:
        if not budget_left():
            break
        run(cfg)

    expanded: set[tuple[tuple[str, Any], ...]] = set()
    while budget_left():
        ranked = sorted((r for r in tried if r["us"] is not None), key=lambda r: r["us"])
        seed = next((r["config"] for r in ranked if _key(r["config"]) not in expanded), None)
        if seed is None:
            # Nothing (more) to climb from, e.g. a whole path failed: the next-ranked candidate.
            spare = next((c for c in ranked_all if _key(c) not in seen), None)
            if spare is None:
                break
            run(spare)
            continue
        expanded.add(_key(seed))
        for cfg in neighbours(seed, n, k, m, sms=sms, paths=paths):
            if not budget_left():
                break
            if _key(cfg) not in seen:
                run(cfg)

    ok = [r for r in tried if r["us"] is not None]
    if not ok:
        return None, math.inf, tried
    best = min(ok, key=lambda r: r["us"])
    return dict(best["config"]), best["us"], tried
