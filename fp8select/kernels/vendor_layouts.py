"""Load-time weight and scale layouts for the vendor kernels, in pure torch.

Each vendor GEMM reads the DeepSeek-style checkpoint (fp8 ``W`` [N, K], fp32 per-128x128-block
scales ``S`` [ceil(N/128), ceil(K/128)]) in its own layout. The transforms here run once, when
a layer is prepared, on any device torch runs on (so they are tested on CPU); the hot path only
quantizes activations. Sources, one per transform (see ``docs/vendor-apis.md`` for the
citations in full):

* TMA alignment and MN-major scales: DeepGEMM ``get_tma_aligned_size`` /
  ``get_mn_major_tma_aligned_tensor`` (csrc/utils/layout.hpp, DeepGEMM 2.x): an fp32 ``[MN, G]``
  scale stored as ``[G, round_up(MN, 4)]``, so that each column starts 16-byte aligned.
* UE8M0: DeepGEMM on SM100 takes scales as 8-bit exponents, four K-groups per int32, group
  ``4j`` in the least significant byte (``pack_ue8m0_to_int`` in deep_gemm/utils/math.py and
  ``get_mn_major_tma_aligned_packed_ue8m0_tensor``), MN-major and TMA-aligned. Packing keeps
  only the exponent, so the weight is first re-quantized with power-of-two block scales
  (SGLang ``requant_weight_ue8m0``; here from fp32 rather than bf16, which loses less).
* e4m3fn -> e4m3fnuz (AMD gfx942): the same bits are worth half in e4m3fnuz (exponent bias 8
  instead of 7), so the scales double; the bit pattern 0x80 (-0 in e4m3fn, NaN in e4m3fnuz)
  becomes 0 (SGLang ``normalize_e4m3fn_to_e4m3fnuz``).
* AITER pre-shuffle: ``aiter.ops.shuffle.shuffle_weight(w, layout=(16, 16))`` for 1-byte
  weights, ``view(N/16, 16, K/32, 2, 16).permute(0, 2, 3, 1, 4)`` (aiter/ops/shuffle.py at
  commit 0122c481).
"""

from __future__ import annotations

import torch

from fp8select.kernels.quant import DEFAULT_EPS, ceil_pow2, fp8_max

__all__ = [
    "UE8M0_PER_INT32",
    "e4m3fn_to_e4m3fnuz",
    "expand_block_rows",
    "is_power_of_two",
    "mn_major_tma_aligned",
    "pack_ue8m0",
    "requantize_ue8m0",
    "shuffle_weight_16x16",
    "tma_aligned_size",
    "to_mn_major",
    "unpack_ue8m0",
]

TMA_ALIGNMENT_BYTES = 16
UE8M0_PER_INT32 = 4
_SHUFFLE_ROWS, _SHUFFLE_K = 16, 32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tma_aligned_size(mn: int, element_size: int = 4) -> int:
    """``mn`` rounded up so that ``mn * element_size`` is a multiple of 16 bytes (DeepGEMM's rule)."""
    per = TMA_ALIGNMENT_BYTES // element_size
    return _ceil_div(mn, per) * per


def to_mn_major(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A 2-D ``t`` [MN, G] as an MN-major view with strides ``(1, rows)`` (``rows >= MN``).

    Returned as is when it already has that layout (no copy), else copied once into
    ``[G, rows]`` storage, whose ``.t()[:MN]`` view is returned.
    """
    mn, groups = t.shape
    if (t.stride(0) == 1 or mn == 1) and t.stride(1) == rows:
        return t
    storage = torch.empty((groups, rows), dtype=t.dtype, device=t.device)
    out = storage.t()[:mn]
    out.copy_(t)
    return out


def mn_major_tma_aligned(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` [MN, G] as an MN-major view with strides ``(1, tma_aligned_size(MN))``.

    Returned as is when it already has that layout (no copy), else copied once into
    ``[G, round_up(MN, 4)]`` storage. What DeepGEMM requires of the LHS scale on SM90.
    """
    if scale.dim() != 2:
        raise ValueError(f"scale must be 2-D [MN, G], got shape {tuple(scale.shape)}")
    return to_mn_major(scale, tma_aligned_size(scale.shape[0], scale.element_size()))


def is_power_of_two(scale: torch.Tensor) -> bool:
    """Whether every entry of the fp32 ``scale`` is a positive normal power of two (exact in UE8M0)."""
    if scale.dtype != torch.float32:
        raise ValueError(f"scale must be float32, got {scale.dtype}")
    bits = scale.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return bool(((bits > 0) & ((bits & 0x7FFFFF) == 0) & (exponent > 0) & (exponent < 255)).all())


def expand_block_rows(scale: torch.Tensor, rows: int, block_rows: int = 128) -> torch.Tensor:
    """Block scales [ceil(rows/block_rows), G] -> one row per output feature [rows, G] (contiguous)."""
    index = torch.arange(rows, device=scale.device) // block_rows
    return scale.index_select(0, index).contiguous()


def pack_ue8m0(scale: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Pack power-of-two fp32 scales [MN, G] into DeepGEMM's UE8M0 int32 [MN, ceil(G/4)].

    Byte ``j % 4`` of word ``j // 4`` holds the biased exponent of group ``j`` (group ``4j`` in
    the least significant byte; groups past ``G`` are 0); the result is MN-major and
    TMA-aligned: strides ``(1, round_up(MN, 4))``. ``check`` (at load time) raises
    ``ValueError`` unless every scale is a power of two, because packing keeps the exponent
    only and would silently round other values down.
    """
    if scale.dim() != 2 or scale.dtype != torch.float32:
        raise ValueError(f"scale must be a 2-D float32 tensor, got {scale.dtype} {tuple(scale.shape)}")
    if check and not is_power_of_two(scale):
        raise ValueError("UE8M0 packing keeps only the exponent: every scale must be a positive normal power of two "
                         "(re-quantize with requantize_ue8m0 first)")
    mn, groups = scale.shape
    words = _ceil_div(groups, UE8M0_PER_INT32)
    exponents = torch.zeros((mn, words * UE8M0_PER_INT32), dtype=torch.int32, device=scale.device)
    exponents[:, :groups] = (scale.contiguous().view(torch.int32) >> 23) & 0xFF
    lanes = exponents.view(mn, words, UE8M0_PER_INT32)
    # Assemble each word arithmetically (not through a byte view), so the result does not
    # depend on the host's byte order; the top byte is shifted in two's complement.
    packed = lanes[..., 0] | (lanes[..., 1] << 8) | (lanes[..., 2] << 16) | (lanes[..., 3] << 24)
    return to_mn_major(packed, tma_aligned_size(mn, 4))


def unpack_ue8m0(packed: torch.Tensor, groups: int) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0`: int32 [MN, ceil(G/4)] -> fp32 [MN, G] (exponent 0 decodes to 0)."""
    if packed.dim() != 2 or packed.dtype != torch.int32:
        raise ValueError(f"packed must be a 2-D int32 tensor, got {packed.dtype} {tuple(packed.shape)}")
    shifts = torch.arange(UE8M0_PER_INT32, device=packed.device, dtype=torch.int32) * 8
    exponents = (packed.unsqueeze(-1) >> shifts) & 0xFF
    exponents = exponents.reshape(packed.shape[0], -1)[:, :groups].contiguous()
    return (exponents << 23).view(torch.float32)


def requantize_ue8m0(weight: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int] = (128, 128),
                     *, eps: float = DEFAULT_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-quantize a block-FP8 weight so that every block scale is a power of two.

    The weight is dequantized in fp32, each ``block_size`` block gets the scale
    ``ceil_pow2(max(amax, eps) / fp8_max)`` (rounded up, so no value saturates), and the
    values are re-rounded to the weight's fp8 dtype. Returns ``(weight', scale')`` in the
    checkpoint layout ([N, K] and [ceil(N/bn), ceil(K/bk)] fp32); each dequantized value
    differs from the original by at most half a unit in the last place of its new fp8
    encoding (relative 2**-4 for normal values, ``scale' * 2**-10`` below them for e4m3).
    """
    if weight.dim() != 2 or scale.dim() != 2:
        raise ValueError(f"weight and scale must be 2-D, got {tuple(weight.shape)} and {tuple(scale.shape)}")
    n, k = weight.shape
    bn, bk = block_size
    nb, kb = _ceil_div(n, bn), _ceil_div(k, bk)
    if tuple(scale.shape) != (nb, kb):
        raise ValueError(f"scale must be [ceil(N/{bn}), ceil(K/{bk})] = {[nb, kb]}, got {list(scale.shape)}")
    fmax = fp8_max(weight.dtype)
    padded = torch.zeros((nb * bn, kb * bk), dtype=torch.float32, device=weight.device)
    padded[:n, :k] = weight.to(torch.float32)
    blocks = padded.view(nb, bn, kb, bk) * scale.to(torch.float32)[:, None, :, None]
    amax = blocks.abs().amax(dim=(1, 3))
    new_scale = ceil_pow2(amax.clamp(min=eps) / fmax)
    q = (blocks / new_scale[:, None, :, None]).clamp(-fmax, fmax)
    new_weight = q.view(nb * bn, kb * bk)[:n, :k].to(weight.dtype).contiguous()
    return new_weight, new_scale


def e4m3fn_to_e4m3fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values as e4m3fnuz: identical bits except 0x80 -> 0, and the scales doubled.

    Exact: every e4m3fn bit pattern other than NaN (never produced by quantization) and
    0x80 means in e4m3fnuz exactly half of its e4m3fn value, subnormals included.
    """
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"weight must be float8_e4m3fn, got {weight.dtype}")
    bits = weight.contiguous().view(torch.int8)
    fixed = torch.where(bits == -128, torch.zeros_like(bits), bits)
    return fixed.view(torch.float8_e4m3fnuz), scale * 2.0


def shuffle_weight_16x16(weight: torch.Tensor) -> torch.Tensor:
    """AITER's pre-shuffled layout of a 1-byte [N, K] weight (``shuffle_weight(w, layout=(16, 16))``).

    Tiles of 16 rows by 32 bytes; within a tile the two 16-byte halves of K come first, then
    the 16 rows: ``view(N/16, 16, K/32, 2, 16).permute(0, 2, 3, 1, 4)``. Needs N % 16 == 0
    and K % 32 == 0. Returns a contiguous tensor of the same shape and dtype.
    """
    if weight.dim() != 2 or weight.element_size() != 1:
        raise ValueError(f"weight must be a 2-D 1-byte tensor, got {weight.dtype} {tuple(weight.shape)}")
    n, k = weight.shape
    if n % _SHUFFLE_ROWS or k % _SHUFFLE_K:
        raise ValueError(f"shuffle needs N % {_SHUFFLE_ROWS} == 0 and K % {_SHUFFLE_K} == 0, got N={n}, K={k}")
    half = _SHUFFLE_K // 2
    raw = weight.contiguous().view(torch.uint8).view(n // _SHUFFLE_ROWS, _SHUFFLE_ROWS, k // _SHUFFLE_K, 2, half)
    return raw.permute(0, 2, 3, 1, 4).contiguous().view(n, k).view(weight.dtype)
