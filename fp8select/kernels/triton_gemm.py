"""Host entry points of fp8select's Triton block-FP8 linear: checks, defaults, launches.

``linear`` (an unquantized activation, any of the four paths), ``w8a8_block_gemm`` (an fp8
activation with its per-token-group scales) and ``w8a8_block_linear_fused`` (the in-kernel
quantizing paths) validate their tensors, take the launch configuration they are given (a
:class:`.triton_config.TritonConfig`; ``None`` runs :func:`.triton_search.heuristic_config`
for the shape and M) and launch the kernels of :mod:`.triton_gemm_kernels`. No table is read
here: measured configurations come from the caller (the layer's plan).

The bound launches they make are :mod:`.triton_bound`'s; what they need to know of the device,
:mod:`.triton_device`'s.

Non-finite activations: every path quantizes with :func:`.triton_quant.fp8_group_quantize`,
so a NaN or +-inf in a token's 128-element group gives that token a NaN output row (all N
columns, bias or not), on the prequantized entry as well when the caller's quantizer follows
the same rule (:mod:`.quant`). Rows without non-finite values are unaffected.
"""

from __future__ import annotations

import torch
import triton

from .quant import check_activation
from .triton_bound import _OUT_DTYPES, SUPPORTED_BLOCK_SIZES, BoundGemm, BoundLinear, _check_config, _check_weight
from .triton_config import PATHS, QUANT_FUSED_PATHS, SCALE_GROUP_K, TritonConfig
from .triton_device import WGMMA_TRITON, fixup_counters, wgmma_runs
from .triton_search import heuristic_config

__all__ = [
    "PATHS",
    "SUPPORTED_BLOCK_SIZES",
    "WGMMA_TRITON",
    "BoundGemm",
    "BoundLinear",
    "TritonConfig",
    "fixup_counters",
    "linear",
    "w8a8_block_gemm",
    "w8a8_block_linear_fused",
    "wgmma_runs",
]


def _check_common(a: torch.Tensor, b: torch.Tensor, tensors: dict[str, torch.Tensor | None],
                  out_dtype: torch.dtype, bias: torch.Tensor | None) -> None:
    """Checks shared by the entry points: output dtype, bias shape, one device."""
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    n = b.shape[0]
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must be [N] with N={n}, got shape {tuple(bias.shape)}")
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def _launch(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor, scale_bn: int,
            bias: torch.Tensor | None, out: torch.Tensor, cfg: TritonConfig, counters: torch.Tensor | None = None) -> None:
    """One launch of ``cfg.path`` writing ``out``, bound for this call only (:class:`BoundGemm`)."""
    BoundGemm(b, b_scale, scale_bn, cfg, quant=a_scale is None, device=out.device, counters=counters)(a, a_scale, bias, out)


def _without_launch(m: int, n: int, k: int, bias: torch.Tensor | None, out_dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor | None:
    """The result when there is nothing to multiply: M or N zero, an empty tensor; K zero, the
    bias (or zeros) broadcast over M. None otherwise."""
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=device)
    if k != 0:
        return None
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
    config: TritonConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block-scaled FP8 GEMM ``dequant(a) @ dequant(b).T + bias`` in ``out_dtype``.

    Args:
        a: ``[M, K]`` fp8 activation (same fp8 dtype as ``b``).
        a_scale: ``[M, ceil(K/128)]`` fp32 per-token-group scales, any strides (row-major
            and M-major both work; the tile kernels read M-major ones coalesced, the wgmma path
            copies any but row-major ones row-major first).
        b: ``[N, K]`` fp8 weight in checkpoint layout.
        b_scale: ``[ceil(N/bn), ceil(K/128)]`` fp32 weight scales, any strides.
        block_size: weight scale block ``(bn, bk)``: ``(128, 128)`` or ``(1, 128)``.
        out_dtype: bf16, fp16 or fp32.
        bias: optional ``[N]``, added in fp32 before the cast.
        config: the launch configuration; ``None``: the gemm path's heuristic for this shape
            and M. The activation is quantized already, so a path that quantizes in the kernel
            runs as its prequantized sibling with the same tiles
            (:meth:`TritonConfig.prequantized`: ``fused -> gemm``, ``decode -> swap``).
        counters: split-K counters the caller owns (:func:`fixup_counters`); None: a buffer
            per device and stream, made at first use.

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
    _check_config(config)
    n = b.shape[0]
    cfg = (config if config is not None else heuristic_config(n, k, m, "gemm")).prequantized()
    if (done := _without_launch(m, n, k, bias, out_dtype, a.device)) is not None:
        return done
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    _launch(a, a_scale, b, b_scale, scale_bn, bias, out, cfg, counters)
    return out


def linear(
    x: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: tuple[int, int],
    *,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: TritonConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block FP8 linear ``x @ dequant(b).T + bias`` on an unquantized activation.

    ``x`` is quantized per token and 128-element group with the numerics of
    :func:`fp8select.kernels.quant.quantize_per_token_group` (default eps, fp8 dtype of ``b``)
    by the path ``config.path`` names (see :mod:`.triton_config`): ``gemm`` (quantization
    kernel + tile GEMM), ``fused`` (tile GEMM quantizing in its K loop), ``decode`` (swap-AB
    GEMM quantizing in its K loop, one launch), ``swap`` (quantization kernel + swap-AB
    GEMM) or ``wgmma`` (quantization kernel + the Hopper GEMM of :mod:`.gluon_gemm`). The
    fused paths quantize exactly as the separate kernel does, so every path computes the same
    product up to fp32 summation order. A NaN or +-inf in a token's
    128-element group makes that token's output row NaN.

    Args:
        x: ``[M, K]`` bf16/fp16/fp32, any strides.
        b, b_scale, block_size, out_dtype, bias: as in :func:`w8a8_block_gemm`.
        config: the launch configuration; ``None``: the gemm path's heuristic for this
            shape and M (:func:`.triton_search.heuristic_config`).
        counters: as in :func:`w8a8_block_gemm`.

    Returns:
        ``[M, N]`` contiguous ``out_dtype``.
    """
    check_activation(x)
    m, k = x.shape
    _check_weight(b, b_scale, block_size, k)
    _check_common(x, b, {"x": x, "b": b, "b_scale": b_scale, "bias": bias}, out_dtype, bias)
    _check_config(config)
    if (done := _without_launch(m, b.shape[0], k, bias, out_dtype, x.device)) is not None:
        return done
    return BoundLinear(b, b_scale, block_size, config, out_dtype=out_dtype, counters=counters)(x, bias)


def w8a8_block_linear_fused(
    x: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: tuple[int, int],
    *,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: TritonConfig | None = None,
) -> torch.Tensor:
    """Block FP8 linear quantizing the activation inside the GEMM: :func:`linear` restricted
    to the ``fused`` and ``decode`` paths (``None``: the fused path's heuristic).

    Each ``[BLOCK_M, 128]`` tile of ``x`` is quantized in registers with the numerics of
    :func:`fp8select.kernels.quant.quantize_per_token_group`, so the result equals
    quantize-then-:func:`w8a8_block_gemm` with the same configuration bit for bit.
    """
    check_activation(x)
    _check_config(config)
    if config is None:
        config = heuristic_config(b.shape[0] if b.dim() == 2 else 0, x.shape[1], x.shape[0], "fused")
    if config.path not in QUANT_FUSED_PATHS:
        raise ValueError(f"w8a8_block_linear_fused runs the {' or '.join(QUANT_FUSED_PATHS)} path, got {config.path!r}")
    return linear(x, b, b_scale, block_size, out_dtype=out_dtype, bias=bias, config=config)
