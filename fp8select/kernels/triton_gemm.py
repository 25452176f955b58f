"""Triton block-FP8 GEMM for DeepSeek-style linears, with fused activation quant and split-K.

``C[M, N] = dequant(A) @ dequant(B).T (+ bias)`` where A is fp8 ``[M, K]`` with one fp32 scale
per token per 128 K elements and B is the checkpoint's fp8 ``[N, K]`` with one fp32 scale per
128x128 (or 1x128) block. BLOCK_K is fixed to the 128-element scale group, so every K step
is one ``tl.dot`` on fp8 operands, rescaled into an fp32 accumulator by
``a_scale[m, kb] * b_scale[n // bn, kb]``.

Split-K uses two passes: each (tile, split) program stores its fp32 partial into a
``[SPLIT_K, M, N]`` workspace with plain stores, and a second small kernel sums the splits,
adds the bias and casts. Chosen over fp32 atomics on paper because split-K only pays for
small M, where the workspace (SPLIT_K*M*N*4 bytes, e.g. 3.7 MB for M=16, N=7168, SPLIT_K=8,
written and re-read while still in L2) is small next to the weight bytes (117 MB for that
N, K=16384); atomics would need a zero-fill launch before and, for bf16/fp16 out or bias,
a cast launch after (three launches instead of two), and their summation order varies from
run to run, so results would not be bitwise reproducible.

Launch configurations come from ``triton_configs.json`` (package data, written by
``benchmarks/sweep_triton.py``), keyed by ``"N,K"`` and then by power-of-two M bucket; the
table is read lazily on first use and shapes missing from it get a heuristic config.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from .quant import DEFAULT_EPS, fp8_format
from .triton_quant import fp8_constexprs, fp8_group_scale, fp8_quantize

__all__ = [
    "CONFIG_KEYS",
    "format_config_table",
    "M_BUCKET_MAX",
    "get_config",
    "load_config_table",
    "m_bucket",
    "validate_config",
    "w8a8_block_gemm",
    "w8a8_block_linear_fused",
]

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")
"""Every launch configuration has exactly these keys."""

M_BUCKET_MAX = 8192
"""Largest M bucket; larger M shares its config."""

SCALE_GROUP_K = 128
"""K elements per activation and weight scale; also the kernel's BLOCK_K."""

SUPPORTED_BLOCK_SIZES = ((128, 128), (1, 128))
"""Weight scale blocks ``(bn, bk)`` the kernel handles."""

_NOMINAL_SMS = 132
"""SM count the heuristic sizes split-K for (H100/H200 SXM); the table is device-independent."""

_TABLE_SECTIONS = ("gemm", "fused")

_HEURISTIC_TILES = (
    # (largest M bucket, BLOCK_M, BLOCK_N, num_warps, num_stages)
    (16, 16, 64, 4, 4),
    (32, 32, 64, 4, 4),
    (64, 64, 64, 4, 4),
    (512, 64, 128, 4, 3),
    (M_BUCKET_MAX, 128, 128, 8, 3),
)
"""Tile shapes of the heuristic default config, by M bucket."""


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


# Runtime values that change between calls of one layer (M, split count) or between scale
# layouts (scale strides) are not specialized on, so one compiled kernel serves them all.
@triton.jit(
    do_not_specialize=[
        "M", "SPLIT_K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "stride_bias", "stride_cs", "eps",
    ]
)
def _w8a8_block_kernel(
    a_ptr,
    as_ptr,
    b_ptr,
    bs_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    SPLIT_K,
    stride_am,
    stride_ak,
    stride_asm,
    stride_ask,
    stride_bn,
    stride_bk,
    stride_bsn,
    stride_bsk,
    stride_bias,
    stride_cs,
    stride_cm,
    stride_cn,
    eps,
    SCALE_BN: tl.constexpr,
    FUSED_QUANT: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr,
    FP8_MIN_EXP_BIASED: tl.constexpr,
):
    """One program computes a ``[BLOCK_M, BLOCK_N]`` tile over its split's share of K.

    With ``FUSED_QUANT`` ``a_ptr`` is the bf16/fp16 activation and each ``[BLOCK_M, 128]``
    tile is quantized in registers (the whole scale group is in the tile); otherwise ``a_ptr``
    is fp8 and ``as_ptr`` its scales. With ``IS_SPLIT`` the fp32 partial goes to split
    ``program_id(1)`` of the workspace ``c_ptr``; otherwise bias and the cast are applied here.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped tile order: GROUP_M row-tiles share each B column-tile while it is in L2.
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Wrap out-of-range rows/columns onto valid ones: loads need no M/N masks, and the
    # duplicated results are dropped by the masked store.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)

    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    kb_start = pid_k * per_split
    kb_end = tl.minimum(kb_start + per_split, k_blocks)

    a_ptrs = a_ptr + rows[:, None] * stride_am + (kb_start * BLOCK_K + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + cols[None, :] * stride_bn + (kb_start * BLOCK_K + offs_k)[:, None] * stride_bk
    as_ptrs = as_ptr + rows * stride_asm + kb_start * stride_ask
    bs_ptrs = bs_ptr + (cols // SCALE_BN) * stride_bsn + kb_start * stride_bsk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - kb * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if FUSED_QUANT:
            x = a.to(tl.float32)
            a_scale = fp8_group_scale(tl.max(tl.abs(x), axis=1), eps, FP8_MAX, False)
            a = fp8_quantize(x, a_scale[:, None], FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED)
            a = a.to(b_ptr.dtype.element_ty)
        else:
            a_scale = tl.load(as_ptrs)
        b_scale = tl.load(bs_ptrs)
        acc += tl.dot(a, b) * (a_scale[:, None] * b_scale[None, :])
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        as_ptrs += stride_ask
        bs_ptrs += stride_bsk

    c_ptrs = (
        c_ptr
        + pid_k.to(tl.int64) * stride_cs
        + offs_m[:, None].to(tl.int64) * stride_cm
        + offs_n[None, :] * stride_cn
    )
    c_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if IS_SPLIT:
        tl.store(c_ptrs, acc, mask=c_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols * stride_bias).to(tl.float32)[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr,
    bias_ptr,
    c_ptr,
    MN,
    N,
    stride_bias,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Sum the ``[SPLIT_K, M, N]`` fp32 partials, add bias, cast into contiguous ``[M, N]``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    ws_ptrs = ws_ptr + offs
    acc = tl.load(ws_ptrs, mask=mask, other=0.0)
    for _ in tl.static_range(1, SPLIT_K):
        ws_ptrs += MN  # pointer steps stay 64-bit even when SPLIT_K * M * N >= 2**31
        acc += tl.load(ws_ptrs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + (offs % N) * stride_bias, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def m_bucket(m: int) -> int:
    """M bucket used as the table key: next power of two >= ``m``, at least 1, at most 8192."""
    if m <= 1:
        return 1
    return min(1 << (m - 1).bit_length(), M_BUCKET_MAX)


def validate_config(config: dict[str, Any]) -> dict[str, int]:
    """Check a launch config and return it as a plain ``dict[str, int]``.

    Raises ``ValueError`` naming the offending key, what was required and what was found.
    """
    missing = [key for key in CONFIG_KEYS if key not in config]
    extra = [key for key in config if key not in CONFIG_KEYS]
    if missing or extra:
        raise ValueError(f"config keys must be {CONFIG_KEYS}; missing {missing}, unknown {extra}")
    cfg = {key: config[key] for key in CONFIG_KEYS}
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
    return cfg


def _heuristic_config(n: int, k: int, m: int) -> dict[str, int]:
    """Default config for shapes the table lacks.

    Small M is bound by weight bytes: narrow tiles (BLOCK_N 64) and split-K until there are
    about two programs per SM, keeping at least 4 K blocks per split for the pipeline. Large
    M is bound by tensor-core throughput: 128-wide tiles, 8 warps.
    """
    bucket = m_bucket(m)
    block_m, block_n, warps, stages = next(tile for top, *tile in _HEURISTIC_TILES if bucket <= top)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    k_blocks = triton.cdiv(k, SCALE_GROUP_K)
    split = 1
    while split < 16 and tiles * split < 2 * _NOMINAL_SMS and k_blocks // (2 * split) >= 4:
        split *= 2
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": SCALE_GROUP_K,
        "GROUP_M": 8,
        "SPLIT_K": split,
        "num_warps": warps,
        "num_stages": stages,
    }


def _validate_table(table: Any, origin: str) -> dict[str, Any]:
    """Check the table's shape (sections -> "N,K" -> bucket -> config); return it."""
    if not isinstance(table, dict):
        raise ValueError(f"config table {origin} must be a JSON object, got {type(table).__name__}")
    for section in _TABLE_SECTIONS:
        shapes = table.get(section, {})
        if not isinstance(shapes, dict):
            raise ValueError(f"config table {origin}: {section!r} must map 'N,K' to buckets")
        for shape, buckets in shapes.items():
            parts = shape.split(",")
            if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
                raise ValueError(f"config table {origin}: key {shape!r} in {section!r} is not 'N,K'")
            if not isinstance(buckets, dict):
                raise ValueError(f"config table {origin}: {section}[{shape!r}] must map M buckets")
            for bucket, cfg in buckets.items():
                if not bucket.isdigit() or m_bucket(int(bucket)) != int(bucket):
                    raise ValueError(
                        f"config table {origin}: bucket {bucket!r} of {section}[{shape!r}] "
                        "is not a power of two <= 8192"
                    )
                try:
                    validate_config(cfg)
                except ValueError as exc:
                    raise ValueError(f"config table {origin}: {section}[{shape!r}][{bucket!r}]: {exc}") from exc
    return table


@functools.lru_cache(maxsize=8)
def _cached_table(path: str | None) -> dict[str, Any]:
    """Parse and validate a table once per path (``None``: the packaged table)."""
    if path is None:
        text = resources.files(__package__).joinpath("triton_configs.json").read_text(encoding="utf-8")
        origin = "triton_configs.json (package data)"
    else:
        text = Path(path).read_text(encoding="utf-8")
        origin = path
    return _validate_table(json.loads(text), origin)


def load_config_table(path: str | Path | None = None) -> dict[str, Any]:
    """Load a config table (default: the packaged ``triton_configs.json``).

    Parsed once per path and cached; each call returns a private copy. Format:
    ``{"gemm": {"N,K": {"<m bucket>": config}}, "fused": {...}, ...metadata}``.
    """
    key = None if path is None else str(Path(path).resolve())
    return copy.deepcopy(_cached_table(key))


def _nearest_bucket(buckets: dict[str, Any], m: int) -> str:
    """Key of the bucket nearest to ``m_bucket(m)`` in log2 distance (ties: the smaller)."""
    target = math.log2(m_bucket(m))
    return min(buckets, key=lambda b: (abs(math.log2(int(b)) - target), int(b)))


def get_config(n: int, k: int, m: int, *, fused: bool, table: dict[str, Any] | None = None) -> dict[str, int]:
    """Launch config for an ``[m, k] x [n, k]^T`` problem.

    Looks up ``table`` (default: the packaged table) under ``"fused"`` or ``"gemm"``, then
    ``"N,K"``, then the nearest measured M bucket, so a sweep over a few buckets covers
    all M. A fused lookup falls back to the ``"gemm"`` entry of the same shape (same tile
    trade-offs), and a shape in neither gets :func:`_heuristic_config`. Returns a new dict.
    """
    if table is None:
        table = _cached_table(None)
    shape_key = f"{n},{k}"
    sections = ("fused", "gemm") if fused else ("gemm",)
    for section in sections:
        buckets = table.get(section, {}).get(shape_key)
        if buckets:
            return validate_config(buckets[_nearest_bucket(buckets, m)])
    return _heuristic_config(n, k, m)


def _resolve_config(config: dict[str, Any] | None, n: int, k: int, m: int, fused: bool) -> dict[str, int]:
    """The looked-up config, overridden key by key by the caller's (possibly partial) one."""
    base = get_config(n, k, m, fused=fused)
    if config is None:
        return base
    return validate_config({**base, **config})


# --------------------------------------------------------------------------------------------
# Host wrappers
# --------------------------------------------------------------------------------------------

_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_weight(b: torch.Tensor, b_scale: torch.Tensor, block_size: tuple[int, int], k: int) -> int:
    """Validate weight, weight scale and block size against K; return the scale's row block."""
    block = tuple(block_size)
    if block not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {block}")
    if b.dim() != 2 or b.shape[1] != k:
        raise ValueError(f"b must be [N, K] with K={k}, got shape {tuple(b.shape)}")
    fp8_format(b.dtype)
    scale_bn = block[0]
    want = (triton.cdiv(b.shape[0], scale_bn), triton.cdiv(k, SCALE_GROUP_K))
    if tuple(b_scale.shape) != want or b_scale.dtype != torch.float32:
        raise ValueError(
            f"b_scale must be float32 of shape {want} for block {block}, "
            f"got {b_scale.dtype} {tuple(b_scale.shape)}"
        )
    return scale_bn


def _check_common(a: torch.Tensor, b: torch.Tensor, tensors: dict[str, torch.Tensor | None],
                  out_dtype: torch.dtype, bias: torch.Tensor | None) -> None:
    """Checks shared by both entry points: output dtype, bias shape, one device."""
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    n = b.shape[0]
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must be [N] with N={n}, got shape {tuple(bias.shape)}")
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def _launch(
    a: torch.Tensor,
    a_scale: torch.Tensor | None,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    scale_bn: int,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: dict[str, int],
    fused: bool,
) -> None:
    """Launch the GEMM (and the split-K reduction when ``SPLIT_K > 1``) writing ``out``."""
    m, k = a.shape
    n = b.shape[0]
    k_blocks = triton.cdiv(k, SCALE_GROUP_K)
    # Splits beyond the K-block count would only add empty programs.
    split = min(cfg["SPLIT_K"], k_blocks)
    if split > 1:
        # Re-balance so no split is left empty by the ceil-divided share.
        split = triton.cdiv(k_blocks, triton.cdiv(k_blocks, split))
    target = out
    if split > 1:
        target = torch.empty((split, m, n), dtype=torch.float32, device=out.device)
    scale = a_scale if a_scale is not None else b_scale  # unused placeholder when fused
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split)
    stride_cs = target.stride(0) if split > 1 else 0
    cm, cn = target.stride()[-2:]
    _w8a8_block_kernel[grid](
        a,
        scale,
        b,
        b_scale,
        bias if bias is not None else b_scale,
        target,
        m,
        n,
        k,
        split,
        a.stride(0),
        a.stride(1),
        scale.stride(0) if a_scale is not None else 0,
        scale.stride(1) if a_scale is not None else 0,
        b.stride(0),
        b.stride(1),
        b_scale.stride(0),
        b_scale.stride(1),
        bias.stride(0) if bias is not None else 0,
        stride_cs,
        cm,
        cn,
        DEFAULT_EPS,
        SCALE_BN=scale_bn,
        FUSED_QUANT=fused,
        IS_SPLIT=split > 1,
        HAS_BIAS=bias is not None,
        EVEN_K=k % SCALE_GROUP_K == 0,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=SCALE_GROUP_K,
        GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **fp8_constexprs(b.dtype),
    )
    if split > 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](
            target,
            bias if bias is not None else target,
            out,
            m * n,
            n,
            bias.stride(0) if bias is not None else 0,
            SPLIT_K=split,
            HAS_BIAS=bias is not None,
            BLOCK=block,
            num_warps=4,
        )


def _empty_k(m: int, n: int, bias: torch.Tensor | None, out_dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Result for K == 0: the bias (or zeros) broadcast over M."""
    out = torch.zeros((m, n), dtype=torch.float32, device=device)
    if bias is not None:
        out += bias.to(torch.float32)
    return out.to(out_dtype)


def w8a8_block_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: tuple[int, int],
    *,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Block-scaled FP8 GEMM ``dequant(a) @ dequant(b).T + bias`` in ``out_dtype``.

    Args:
        a: ``[M, K]`` fp8 activation (same fp8 dtype as ``b``).
        a_scale: ``[M, ceil(K/128)]`` fp32 per-token-group scales, any strides (row-major
            and M-major both work).
        b: ``[N, K]`` fp8 weight in checkpoint layout.
        b_scale: ``[ceil(N/bn), ceil(K/128)]`` fp32 weight scales, any strides.
        block_size: weight scale block ``(bn, bk)``: ``(128, 128)`` or ``(1, 128)``.
        out_dtype: bf16, fp16 or fp32.
        bias: optional ``[N]``, added in fp32 before the cast.
        config: launch config (keys :data:`CONFIG_KEYS`, may be partial: missing keys come
            from :func:`get_config`); ``None`` looks it up.

    Returns:
        ``[M, N]`` contiguous ``out_dtype``. M = 0 returns an empty tensor without a launch.
    """
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D [M, K], got shape {tuple(a.shape)}")
    m, k = a.shape
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same fp8 dtype, got {a.dtype} and {b.dtype}")
    scale_bn = _check_weight(b, b_scale, block_size, k)
    want = (m, triton.cdiv(k, SCALE_GROUP_K))
    if tuple(a_scale.shape) != want or a_scale.dtype != torch.float32:
        raise ValueError(f"a_scale must be float32 of shape {want}, got {a_scale.dtype} {tuple(a_scale.shape)}")
    _check_common(a, b, {"a": a, "a_scale": a_scale, "b": b, "b_scale": b_scale, "bias": bias}, out_dtype, bias)
    n = b.shape[0]
    cfg = _resolve_config(config, n, k, m, fused=False)
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=a.device)
    if k == 0:
        return _empty_k(m, n, bias, out_dtype, a.device)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    _launch(a, a_scale, b, b_scale, scale_bn, bias, out, cfg, fused=False)
    return out


def w8a8_block_linear_fused(
    x: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: tuple[int, int],
    *,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Block FP8 linear on an unquantized activation, quantizing it inside the GEMM.

    Each ``[BLOCK_M, 128]`` tile of ``x`` is quantized in registers with the numerics of
    :func:`fp8select.kernels.quant.quantize_per_token_group` (default eps, row scales, fp8
    dtype of ``b``), so the result equals quantize-then-:func:`w8a8_block_gemm`. Meant for
    small M (decode), where it saves the quant launch and the fp8 activation round trip;
    every N tile re-quantizes its rows, which is cheap only while M is small.

    Args:
        x: ``[M, K]`` bf16/fp16/fp32, any strides.
        b, b_scale, block_size, out_dtype, bias, config: as in :func:`w8a8_block_gemm`.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    m, k = x.shape
    scale_bn = _check_weight(b, b_scale, block_size, k)
    _check_common(x, b, {"x": x, "b": b, "b_scale": b_scale, "bias": bias}, out_dtype, bias)
    n = b.shape[0]
    cfg = _resolve_config(config, n, k, m, fused=True)
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=x.device)
    if k == 0:
        return _empty_k(m, n, bias, out_dtype, x.device)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    _launch(x, None, b, b_scale, scale_bn, bias, out, cfg, fused=True)
    return out


def format_config_table(table: dict[str, Any]) -> str:
    """Serialize a config table as JSON with one config per line (diff-friendly)."""
    _validate_table(table, "to format")
    lines = ["{"]
    meta = [key for key in table if key not in _TABLE_SECTIONS]
    items: list[str] = [f"  {json.dumps(key)}: {json.dumps(table[key])}" for key in meta]
    for section in _TABLE_SECTIONS:
        shapes = table.get(section, {})
        body = []
        for shape in sorted(shapes, key=lambda s: tuple(int(p) for p in s.split(","))):
            buckets = shapes[shape]
            rows = [
                f"      {json.dumps(b)}: {json.dumps(validate_config(buckets[b]))}"
                for b in sorted(buckets, key=int)
            ]
            body.append(f"    {json.dumps(shape)}: {{\n" + ",\n".join(rows) + "\n    }")
        items.append(f"  {json.dumps(section)}: {{\n" + ",\n".join(body) + ("\n  }" if body else "}"))
    lines.append(",\n".join(items))
    lines.append("}")
    return "\n".join(lines) + "\n"
