"""Heuristic defaults and the tuning search for the Triton block-FP8 linear's :class:`TritonConfig`.

Pure Python (no torch, no triton), so a tuning driver can plan its work without a GPU stack.
:func:`heuristic_config` is the configuration a kernel entry point runs when it is given none
(a rule of thumb per path and M bucket, sized for the H100/H200's 132 SMs);
:func:`candidates`, :func:`neighbours` and :func:`search` drive the GPU tuning: a ranked first
round over paths and tiles, then hill-climbing around the fastest. What the paths are, and
the configuration type itself: :mod:`.triton_config`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fp8select.buckets import M_BUCKET_MAX, m_bucket
from fp8select.kernels.triton_config import PATHS, QUANT_FUSED_PATHS, SCALE_GROUP_K, SWAP_PATHS, TritonConfig, default_fixup

__all__ = [
    "NOMINAL_SMS",
    "SMEM_LIMIT_BYTES",
    "Trial",
    "candidates",
    "fill_split",
    "fit_split",
    "heuristic_config",
    "neighbours",
    "search",
    "smem_bytes",
]

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


def fit_split(cfg: TritonConfig, measured_at: tuple[int, int], shape: tuple[int, int], m: int) -> TritonConfig:
    """``cfg``, measured on an ``[N, K]`` weight ``measured_at`` at ``m`` rows, for a weight ``shape``:
    the same tiles with the split-K that keeps the number of programs it launched there (at small
    M the split is what fills the SMs; kept as is, a weight with fewer column tiles leaves them
    idle: on the H200, 4096 x 14336 at M 8 took 34.3 us with 7168 x 16384's split 4 over its 64
    column tiles, run 35, and 23.6 us with 4096 x 7168's split 8, run 27). A configuration without
    split-K is unchanged."""
    if cfg.SPLIT_K == 1:
        return cfg
    (n0, k0), (n, _) = measured_at, shape
    rows = math.ceil(max(m, 1) / cfg.BLOCK_M)
    programs = rows * math.ceil(n0 / cfg.BLOCK_N) * cfg.split_for(k0)
    return replace(cfg, SPLIT_K=max(1, round(programs / (rows * math.ceil(n / cfg.BLOCK_N)))))


def _make(path: str, block_m: int, block_n: int, warps: int, stages: int, split: int = 1, *,
          group_m: int = 8, tma: int = 0, persistent: int = 0) -> TritonConfig:
    """A configuration with the default split-K summation (:func:`.triton_config.default_fixup`);
    the ``wgmma`` path always with TMA and no split-K."""
    if path == "wgmma":
        split, tma = 1, 1
    return TritonConfig(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=SCALE_GROUP_K, GROUP_M=group_m, SPLIT_K=split,
                        num_warps=warps, num_stages=stages, path=path, FIXUP=default_fixup(path, split), TMA=tma,
                        PERSISTENT=persistent)


def _swap_block_m(m: int) -> int:
    """Token tile of the swap-AB kernel: the MMA's narrow side, 16 to 64."""
    return min(64, max(16, _next_pow2(m)))


def heuristic_config(n: int, k: int, m: int, path: str = "gemm", *, sms: int = NOMINAL_SMS) -> TritonConfig:
    """The configuration of ``path`` a kernel entry point runs when it is given none.

    gemm/fused: small M is bound by weight bytes (narrow tiles, split-K to ~2 programs per
    SM); large M by tensor-core throughput (128-wide tiles, 8 warps). decode/swap: 128 weight
    rows by ``next_pow2(M)`` (16..64) tokens, split-K to ~2 programs per SM. Pointer loads
    (TMA 0); FIXUP as :meth:`TritonConfig.from_dict` defaults it.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    bucket = m_bucket(m)
    if path in SWAP_PATHS:
        block_m, block_n, warps, stages = _swap_block_m(m), 128, 4, 4
    elif path == "wgmma":  # the run-28 probe's winners: one warpgroup of 64x128 up to K 2048, else two
        block_m, block_n, warps, stages = (64, 128, 4, 4) if bucket <= 512 or k <= 2048 else (128, 128, 8, 4)
    else:
        block_m, block_n, warps, stages = next(tile for top, *tile in _HEURISTIC_TILES if bucket <= top)
    split = fill_split(n, k, m, block_m, block_n, sms)
    return _make(path, block_m, block_n, warps, stages, split)


def smem_bytes(cfg: TritonConfig) -> int:
    """Shared memory a configuration's pipelined tiles need (estimate; bf16 activations when
    the path quantizes in the kernel, which also stages the quantized tile once per step)."""
    bm, bn, stages = cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_stages
    k = SCALE_GROUP_K
    if cfg.path in QUANT_FUSED_PATHS:
        return stages * (bm * k * 2 + bn * k) + bm * k
    return stages * (bm * k + bn * k)  # (the wgmma kernel stages its output tile in the operands' ring)


def _fits(cfg: TritonConfig) -> bool:
    return smem_bytes(cfg) <= SMEM_LIMIT_BYTES and STAGES_MIN <= cfg.num_stages <= STAGES_MAX


_Plan = tuple[str, int, int, int, int, int, int] | tuple[str, int, int, int, int, int, int, int]
"""(path, BLOCK_M, BLOCK_N, num_warps, num_stages, GROUP_M, TMA[, PERSISTENT]) of a ranked first-round config."""


def _small_m_plan(m: int) -> list[_Plan]:
    """M <= 16 (decode), best guess first: bound by weight bytes, so the single-launch decode
    path leads, TMA-fed and three stages deep (the run-10 sweep's winners: BLOCK_N 256 with
    split-K 8 on the 7168 x 16-18K weights, 128 elsewhere); the gemm winners at M 8-16 on long K
    run two warps."""
    bm = _swap_block_m(m)
    return [
        ("decode", bm, 128, 4, 3, 8, 1),
        ("decode", bm, 256, 4, 3, 8, 1),
        ("gemm", 16, 64, 2, 3, 8, 0),
        ("swap", bm, 128, 4, 3, 8, 1),
        ("fused", 16, 128, 4, 3, 8, 0),
        ("decode", bm, 128, 4, 4, 8, 0),
        ("gemm", 16, 128, 4, 4, 8, 0),  # the measured run-1 winner family at M <= 16
        ("decode", bm, 256, 8, 3, 8, 1),
        ("decode", bm, 64, 4, 6, 8, 0),
        ("gemm", 16, 64, 4, 3, 8, 0),
        ("decode", bm, 128, 8, 4, 8, 0),
        ("gemm", 16, 128, 8, 3, 8, 0),
    ]


def _mid_m_plan(m: int) -> list[_Plan]:
    """16 < M <= 64. The ``wgmma`` path's 64-row tile too: on the H200's table, measured at M 128 only, it ran
    M 128 of 5120 x 1280 and of 4096 x 1024 faster than these tiles M 64 (8.0 against 10.6 us)."""
    bm = _next_pow2(m)
    return [
        ("gemm", bm, 128, 4, 4, 8, 0),
        ("decode", bm, 128, 4, 4, 8, 0),
        ("wgmma", 64, 128, 4, 4, 8, 1),
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
            ("wgmma", 64, 128, 4, 4, 8, 1),
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
    return [  # the wgmma path first (run 28's probe), then the TMA-fed tiles: run 10's sweep winners
        ("wgmma", 128, 128, 8, 4, 8, 1),
        ("wgmma", 64, 128, 4, 4, 8, 1),
        ("gemm", 128, 128, 8, 4, 8, 1),
        ("wgmma", 64, 128, 4, 3, 8, 1),
        ("gemm", 64, 128, 4, 4, 8, 1, 2),  # persistent, two per SM: the run-19 probe's winners at K <= 2048
        ("gemm", 256, 64, 8, 4, 8, 1),  # 2112 x 7168: 132 tiles at M 1024, one wave
        ("gemm", 128, 64, 4, 4, 8, 1, 2),
        ("gemm", 256, 128, 8, 3, 8, 1),
        ("gemm", 128, 128, 8, 4, 16, 1),
        ("gemm", 128, 128, 8, 5, 8, 1),
        ("gemm", 64, 256, 8, 3, 8, 0),  # run-1 winner at M >= 2048
        ("gemm", 128, 128, 8, 4, 8, 0),
        ("gemm", 128, 64, 4, 3, 8, 0),
        ("gemm", 128, 256, 8, 3, 8, 0),
        ("gemm", 256, 128, 8, 3, 8, 0),
        ("gemm", 64, 256, 8, 3, 8, 1),
        ("gemm", 128, 128, 8, 3, 16, 0),
        ("gemm", 128, 256, 8, 3, 8, 1),
        ("gemm", 64, 128, 4, 4, 8, 0),
        ("gemm", 256, 64, 8, 4, 8, 0),
        ("gemm", 128, 128, 4, 3, 8, 0),
    ]


def candidates(n: int, k: int, m: int, *, sms: int = NOMINAL_SMS, limit: int = 8,
               paths: Sequence[str] | None = None) -> list[TritonConfig]:
    """First-round configurations for an ``[m, k] x [n, k]^T`` linear, best guess first.

    Every one fits in shared memory and has the split-K that fills ``sms`` SMs (M <= 512).
    Paths are interleaved so that a short list still compares them: decode first for
    M <= 16, the gemm path for large M. ``paths`` keeps only those paths (default: all).
    """
    allowed = _allowed(paths)
    bucket = m_bucket(m)
    if bucket <= 16:
        plan = _small_m_plan(m)
    elif bucket <= 64:
        plan = _mid_m_plan(m)
    else:
        plan = _large_m_plan(bucket)
    out: list[TritonConfig] = []
    for path, bm, bn, warps, stages, group, tma, *persistent in plan:
        split = fill_split(n, k, m, bm, bn, sms) if bucket <= 512 else 1
        cfg = _make(path, bm, bn, warps, stages, split, group_m=group, tma=tma, persistent=sum(persistent))
        if path in allowed and _fits(cfg) and cfg not in out:
            out.append(cfg)
    if not out:  # e.g. only paths the plan does not rank for this M: their default config
        out.append(heuristic_config(n, k, m, allowed[0], sms=sms))
    return out[: max(1, limit)]


def neighbours(config: TritonConfig, n: int, k: int, m: int, *, sms: int = NOMINAL_SMS,
               paths: Sequence[str] | None = None) -> list[TritonConfig]:
    """Configurations one step from ``config`` (same path first), most promising first.

    Steps: split-K x2 and /2 (M <= 512), pipeline depth +-1, BLOCK_N x2 and /2 (with the
    split refitted), warps 4 <-> 8 (and 2 for decode-sized tiles), GROUP_M 8 <-> 16 and BLOCK_M x2 / 2 for large M, the
    other split-K summation mode, persistent on/off (large M, gemm path with TMA: two programs per SM at 4 warps,
    one at 8; a step that leaves that path, TMA or SPLIT_K 1 drops it), TMA loads on/off, and the sibling paths with
    the same tiles (:data:`_SIBLINGS`; to the ``wgmma`` path without split-K), keeping only ``paths`` (default: all)
    and the steps the path allows.
    A step that leaves SPLIT_K at 1 takes the path's default FIXUP; the fused path never
    uses TMA (it quantizes a bf16 tile).
    """
    allowed = _allowed(paths)
    base = config
    k_blocks = math.ceil(max(k, 1) / SCALE_GROUP_K)
    bucket = m_bucket(m)
    out: list[TritonConfig] = []

    def add(**change: int | str) -> None:
        persistent = int(change.pop("PERSISTENT", base.PERSISTENT))
        try:
            new = replace(base, **change, PERSISTENT=0)  # type: ignore[arg-type]
        except ValueError:  # outside the path's limits (the wgmma path's tiles, split, TMA)
            return
        if new.SPLIT_K == 1:
            new = replace(new, FIXUP=default_fixup(new.path, 1))
        if new.path == "fused":
            new = replace(new, TMA=0)
        if persistent and new.can_run_persistent:  # else the step leaves persistent launches behind
            new = replace(new, PERSISTENT=persistent)
        if new.path in allowed and new != base and new not in out and _fits(new):
            out.append(new)

    split = base.SPLIT_K
    if bucket <= 512:
        if split * 2 <= MAX_SPLIT_K and k_blocks // (split * 2) >= 2:
            add(SPLIT_K=split * 2)
        if split > 1:
            add(SPLIT_K=split // 2)
    add(num_stages=base.num_stages + 1)
    if base.num_stages > 1:
        add(num_stages=base.num_stages - 1)
    for bn in (base.BLOCK_N * 2, base.BLOCK_N // 2):
        if 16 <= bn <= 256:
            new_split = fill_split(n, k, m, base.BLOCK_M, bn, sms) if bucket <= 512 else 1
            add(BLOCK_N=bn, SPLIT_K=new_split)
    if base.BLOCK_M * base.BLOCK_N >= 64 * 64 or base.swap:
        add(num_warps=8 if base.num_warps == 4 else 4)
    if base.BLOCK_M * base.BLOCK_N <= 16 * 128 and base.num_warps > 2:
        add(num_warps=2)  # decode tiles: two warps won at M 8-16 on long K (run 10)
    if bucket > 512:
        add(GROUP_M=16 if base.GROUP_M == 8 else 8)
        for bm in (base.BLOCK_M * 2, base.BLOCK_M // 2):
            if 16 <= bm <= 256:
                add(BLOCK_M=bm)
    if split > 1:
        add(FIXUP=1 - base.FIXUP)
    if bucket > 512 and base.can_run_persistent:
        add(PERSISTENT=0 if base.PERSISTENT else 2 if base.num_warps <= 4 else 1)
    if base.path != "fused":  # the fused path quantizes a bf16 tile: no TMA for it
        add(TMA=1 - base.TMA)
    for sibling in _SIBLINGS[base.path]:
        if sibling in SWAP_PATHS or (bucket <= 64 if "fused" in (sibling, base.path) else bucket > 16):
            add(path=sibling, FIXUP=base.FIXUP, **({"TMA": 1, "SPLIT_K": 1} if sibling == "wgmma" else {}))
    return out


_SIBLINGS = {"decode": ("swap",), "swap": ("decode",), "gemm": ("fused", "wgmma"), "fused": ("gemm",),
             "wgmma": ("gemm",)}
"""The paths one step from each, with the same tiles: decode <-> swap at any M, gemm <-> fused for
M <= 64, gemm <-> wgmma above 16."""


def _allowed(paths: Sequence[str] | None) -> tuple[str, ...]:
    if paths is None:
        return PATHS
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        raise ValueError(f"paths must be a non-empty subset of {PATHS}, got {list(paths)}")
    return tuple(paths)


@dataclass(frozen=True)
class Trial:
    """One configuration timed by :func:`search`: its median microseconds, or None when it
    failed or gave a wrong result (``error`` says why when ``time_config`` raised)."""

    config: TritonConfig
    us: float | None
    error: str | None = None


def search(
    n: int,
    k: int,
    m: int,
    time_config: Callable[[TritonConfig], float | None],
    *,
    sms: int = NOMINAL_SMS,
    max_configs: int = 12,
    deadline: float = math.inf,
    paths: Sequence[str] | None = None,
) -> tuple[TritonConfig | None, float, list[Trial]]:
    """Find the fastest configuration of the whole linear for one ``(n, k, m)``.

    ``time_config(cfg)`` runs one configuration and returns its median time in microseconds,
    or ``None`` when it failed or gave a wrong result (an exception it raises counts as a
    failure and is recorded). The first round times up to ~2/3 of ``max_configs`` of
    :func:`candidates`; the rest climbs: the neighbours of the fastest configuration not yet
    expanded (when none is left, the next untried candidate), until ``max_configs`` were
    timed or ``deadline`` (a ``time.monotonic()`` value) passed. At least one is always
    timed, and none twice.

    Returns ``(best or None, its microseconds or inf, every trial in order)``. ``paths``
    restricts the search to those paths (default: all).
    """
    max_configs = max(1, max_configs)
    tried: list[Trial] = []
    seen: set[TritonConfig] = set()

    def budget_left() -> bool:
        return len(tried) < max_configs and (not tried or time.monotonic() < deadline)

    def run(cfg: TritonConfig) -> None:
        seen.add(cfg)
        try:
            us = time_config(cfg)
        except Exception as exc:  # noqa: BLE001 - a failing config is data, not a crash
            tried.append(Trial(cfg, None, f"{type(exc).__name__}: {exc}"[:300]))
            return
        ok = us is not None and math.isfinite(us) and us > 0
        tried.append(Trial(cfg, float(us) if ok and us is not None else None))

    ranked_all = candidates(n, k, m, sms=sms, limit=64, paths=paths)
    for cfg in ranked_all[: max(1, math.ceil(max_configs * 2 / 3))]:
        if not budget_left():
            break
        run(cfg)

    expanded: set[TritonConfig] = set()
    while budget_left():
        ranked = sorted((t for t in tried if t.us is not None), key=lambda t: t.us or math.inf)
        seed = next((t.config for t in ranked if t.config not in expanded), None)
        if seed is None:
            # Nothing (more) to climb from, e.g. a whole path failed: the next-ranked candidate.
            spare = next((c for c in ranked_all if c not in seen), None)
            if spare is None:
                break
            run(spare)
            continue
        expanded.add(seed)
        for cfg in neighbours(seed, n, k, m, sms=sms, paths=paths):
            if not budget_left():
                break
            if cfg not in seen:
                run(cfg)

    timed = [t for t in tried if t.us is not None]
    if not timed:
        return None, math.inf, tried
    best = min(timed, key=lambda t: t.us or math.inf)
    return best.config, best.us or math.inf, tried
