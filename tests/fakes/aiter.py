"""Fake ``aiter`` (ROCm/aiter, package ``amd-aiter``) for CPU tests.

Emulates the block-scale FP8 GEMMs of ``aiter/ops/gemm_op_a8w8.py`` and, in ``aiter.fused_moe`` with the
``QuantType`` / ``ActivationType`` enums, the block-scale fused MoE (tests/fakes/aiter_moe.py says how):

* ``gemm_a8w8_blockscale(XQ, WQ, x_scale, w_scale, dtype=bf16, isBpreshuffled=False)``:
  XQ [M, K] and WQ [N, K] in ``aiter.dtypes.fp8``, x_scale [M, ceil(K/128)] row-major, w_scale
  [ceil(N/128), ceil(K/128)] row-major (the checkpoint layouts); returns a new [M, N] tensor.
  ``isBpreshuffled=True`` is the gfx950 ASM path (M >= 16, K >= 512, bf16), taking the
  pre-shuffled layouts below.
* ``gemm_a8w8_blockscale_bpreshuffle(XQ, WQ, x_scale, w_scale, dtype=bf16)``: WQ shuffled
  with ``aiter.ops.shuffle.shuffle_weight(w, layout=(16, 16))`` and x_scale column-major
  (logical [M, ceil(K/128)] with strides (1, M), i.e. ``scale.t().contiguous().t()``).

plus ``aiter.dtypes`` (``fp8`` is ``float8_e4m3fnuz`` on gfx942 and ``float8_e4m3fn`` on
gfx950), ``aiter.ops.shuffle.shuffle_weight`` and ``aiter.jit.utils.chip_info.get_gfx``.

Knobs (on ``fake.impl``; ``set_gfx`` / ``reset`` are also module functions):

* ``gfx``: emulated architecture, default ``"gfx942"``. ``set_gfx`` also updates
  ``aiter.dtypes.fp8`` (the real one is fixed at import). Arches without prebuilt CK
  blockscale kernels (anything but gfx940/941/942/950) take AITER's Triton fallback, which the
  fake treats like the CK path.

The real GEMM wrappers check the output dtype with ``assert`` (``AssertionError``); the CK
kernels' own argument checks are not public, so the fake's dtype/shape/layout checks raise
``RuntimeError`` and are marked unverified in ``docs/vendor-apis.md``. A weight that was not
shuffled for the preshuffle GEMM cannot be detected from its values: the fake then computes
with the shuffled reading, giving wrong numbers exactly as the real kernel would.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Call, ceil_div, dequantize_blockwise, make_vendor_module, recorded
from .aiter_moe import ActivationType, FakeAiterMoe, QuantType

GFX_FP8_DTYPES: dict[str, torch.dtype] = {
    "gfx942": torch.float8_e4m3fnuz,
    "gfx950": torch.float8_e4m3fn,
    "gfx1200": torch.float8_e4m3fn,
    "gfx1201": torch.float8_e4m3fn,
    "gfx1250": torch.float8_e4m3fn,
}
BLOCKSCALE_PREBUILT_ARCHES = frozenset({"gfx940", "gfx941", "gfx942", "gfx950"})
_SHUFFLE_LAYOUT = (16, 16)


def _fp8_dtype_for(gfx: str) -> torch.dtype:
    """``aiter.dtypes.fp8`` on ``gfx`` (``torch.uint8`` where AITER has no FP8 type listed)."""
    return GFX_FP8_DTYPES.get(gfx, torch.uint8)


def _shuffle_dims(n: int, k: int, element_size: int) -> tuple[int, int, int, int]:
    lane_n, lane_k = _SHUFFLE_LAYOUT
    block_k = lane_k * 2
    pack = 16 // element_size
    if n % lane_n or k % block_k:
        raise AssertionError(f"shuffle_weight needs N % {lane_n} == 0 and K % {block_k} == 0, got N={n}, K={k}")
    return lane_n, block_k, pack, block_k // pack


def _unshuffle(w: torch.Tensor) -> torch.Tensor:
    """Inverse of ``shuffle_weight(w, layout=(16, 16))`` for a ``[..., N, K]`` 1-byte tensor."""
    *lead, n, k = w.shape
    lane_n, block_k, pack, k_packs = _shuffle_dims(n, k, w.element_size())
    raw = w.contiguous().view(torch.uint8).view(-1, n // lane_n, k // block_k, k_packs, lane_n, pack)
    return raw.permute(0, 1, 4, 2, 3, 5).contiguous().view(*lead, n, k).view(w.dtype)


class FakeAiter:
    """State and behaviour of one installed fake ``aiter``."""

    def __init__(self, *, gfx: str = "gfx942") -> None:
        self._initial = gfx
        self.gfx = gfx
        self.dtypes_module: Any = None

    def set_gfx(self, gfx: str) -> None:
        """Emulate another AMD GPU (e.g. ``"gfx942"``, ``"gfx950"``); updates ``aiter.dtypes.fp8``."""
        self.gfx = gfx
        if self.dtypes_module is not None:
            self.dtypes_module.fp8 = _fp8_dtype_for(gfx)

    def reset(self) -> None:
        """Restore the install-time architecture."""
        self.set_gfx(self._initial)

    # ----------------------------------------------------------------- helpers (real API)

    def get_gfx(self) -> str:
        """The running architecture name, as ``aiter.jit.utils.chip_info.get_gfx``."""
        return self.gfx

    def get_dtype_fp8(self) -> torch.dtype:
        """``aiter.dtypes.get_dtype_fp8()``: the FP8 type AITER uses on this architecture."""
        return _fp8_dtype_for(self.gfx)

    def shuffle_weight(
        self,
        x: torch.Tensor,
        layout: tuple[int, int] = (16, 16),
        use_int4: bool = False,
        is_guinterleave: bool = False,
        gate_up: bool = False,
    ) -> torch.Tensor:
        """Pre-shuffle a [.., N, K] weight into the (16, 16) MFMA layout (1-byte types; a leading expert
        dimension shuffles each expert alike, as AITER's ``view(-1, N/16, 16, K/32, 2, 16)`` does)."""
        if tuple(layout) != _SHUFFLE_LAYOUT or use_int4 or is_guinterleave or gate_up or x.element_size() != 1:
            raise NotImplementedError("the fake emulates shuffle_weight(w, layout=(16, 16)) for 1-byte weights only")
        if x.dim() < 2:
            raise NotImplementedError("the fake emulates [..., N, K] weights only")
        *lead, n, k = x.shape
        lane_n, block_k, pack, k_packs = _shuffle_dims(n, k, 1)
        raw = x.contiguous().view(torch.uint8).view(-1, n // lane_n, lane_n, k // block_k, k_packs, pack)
        shuffled = raw.permute(0, 1, 3, 4, 2, 5).contiguous().view(*lead, n, k).view(x.dtype)
        shuffled.is_shuffled = True  # type: ignore[attr-defined]
        return shuffled

    # ----------------------------------------------------------------- GEMMs (real API)

    def gemm_a8w8_blockscale(
        self,
        XQ: torch.Tensor,
        WQ: torch.Tensor,
        x_scale: torch.Tensor,
        w_scale: torch.Tensor,
        dtype: torch.dtype = torch.bfloat16,
        isBpreshuffled: bool = False,
    ) -> torch.Tensor:
        """Block-scale FP8 GEMM ``(XQ * x_scale) @ (WQ * w_scale).T`` on checkpoint layouts."""
        assert dtype in (torch.bfloat16, torch.float16), f"Output {dtype=} is currently not supported in gemm_a8w8"
        m, k = XQ.shape
        if isBpreshuffled:
            if not (self.gfx == "gfx950" and m >= 16 and k >= 512 and dtype == torch.bfloat16):
                raise AssertionError("asm kernel only support B preshuffle and m >= 16")
            return self._compute(XQ, WQ, x_scale, w_scale, dtype, preshuffled=True)
        return self._compute(XQ, WQ, x_scale, w_scale, dtype, preshuffled=False)

    def gemm_a8w8_blockscale_bpreshuffle(
        self,
        XQ: torch.Tensor,
        WQ: torch.Tensor,
        x_scale: torch.Tensor,
        w_scale: torch.Tensor,
        dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        """Block-scale FP8 GEMM on a (16, 16)-pre-shuffled weight and column-major x_scale."""
        assert dtype in (torch.bfloat16, torch.float16), f"Output {dtype=} is currently not supported in gemm_a8w8"
        return self._compute(XQ, WQ, x_scale, w_scale, dtype, preshuffled=True)

    def _compute(
        self,
        xq: torch.Tensor,
        wq: torch.Tensor,
        x_scale: torch.Tensor,
        w_scale: torch.Tensor,
        dtype: torch.dtype,
        *,
        preshuffled: bool,
    ) -> torch.Tensor:
        fp8 = _fp8_dtype_for(self.gfx)
        for name, t in (("XQ", xq), ("WQ", wq)):
            if t.dtype != fp8:
                raise RuntimeError(
                    f"{name} must be {fp8} (aiter.dtypes.fp8) on {self.gfx}, got {t.dtype}"
                    + ("; normalize e4m3fn weights to e4m3fnuz (doubling the scales) at load" if self.gfx == "gfx942" else "")
                )
            if t.dim() != 2 or not t.is_contiguous():
                raise RuntimeError(f"{name} must be a contiguous 2-D tensor, got shape {tuple(t.shape)} strides {tuple(t.stride())}")
        m, k = xq.shape
        n, k_w = wq.shape
        if k_w != k:
            raise RuntimeError(f"XQ and WQ K mismatch: {k} vs {k_w}")
        kb, nb = ceil_div(k, 128), ceil_div(n, 128)
        for name, t in (("x_scale", x_scale), ("w_scale", w_scale)):
            if t.dtype != torch.float32:
                raise RuntimeError(f"{name} must be float32, got {t.dtype}")
        if preshuffled:
            if not (x_scale.dim() == 2 and tuple(x_scale.shape) == (m, kb) and x_scale.t().is_contiguous()):
                raise RuntimeError(
                    f"x_scale must be column-major [M, K/128] = {(m, kb)} with strides (1, M) for the preshuffle "
                    f"GEMM (scale.t().contiguous().t()), got shape {tuple(x_scale.shape)} strides {tuple(x_scale.stride())}"
                )
        elif not (tuple(x_scale.shape) == (m, kb) and x_scale.is_contiguous()):
            raise RuntimeError(
                f"x_scale must be row-major contiguous [M, K/128] = {(m, kb)}, got shape {tuple(x_scale.shape)} "
                f"strides {tuple(x_scale.stride())}"
            )
        if not (tuple(w_scale.shape) == (nb, kb) and w_scale.is_contiguous()):
            raise RuntimeError(
                f"w_scale must be row-major contiguous [N/128, K/128] = {(nb, kb)}, got shape {tuple(w_scale.shape)} "
                f"strides {tuple(w_scale.stride())}"
            )
        weight = _unshuffle(wq) if preshuffled else wq
        result = dequantize_blockwise(xq, x_scale, 1, 128) @ dequantize_blockwise(weight, w_scale, 128, 128).T
        return result.to(dtype)


def build(log: list[Call], **options: Any) -> tuple[FakeAiter, dict[str, Any]]:
    """Build the fake ``aiter`` package; ``options`` are ``FakeAiter`` keyword knobs."""
    impl = FakeAiter(**options)
    moe = FakeAiterMoe(impl, _unshuffle)  # aiter.fused_moe (tests/fakes/aiter_moe.py)

    def rec(name: str) -> Any:
        return recorded(log, "aiter", name, getattr(impl, name))

    dtypes = make_vendor_module(
        "aiter.utility.dtypes",
        {
            "fp8": _fp8_dtype_for(impl.gfx),
            "fp8_e8m0": getattr(torch, "float8_e8m0fnu", torch.uint8),
            "fp16": torch.float16,
            "bf16": torch.bfloat16,
            "fp32": torch.float32,
            "i8": torch.int8,
            "u8": torch.uint8,
            "i32": torch.int32,
            "get_dtype_fp8": impl.get_dtype_fp8,
        },
    )
    impl.dtypes_module = dtypes
    gemms = {name: rec(name) for name in ("gemm_a8w8_blockscale", "gemm_a8w8_blockscale_bpreshuffle")}
    shuffle = make_vendor_module("aiter.ops.shuffle", {"shuffle_weight": rec("shuffle_weight")})
    gemm_op = make_vendor_module("aiter.ops.gemm_op_a8w8", gemms)
    ops = make_vendor_module("aiter.ops", {"shuffle": shuffle, "gemm_op_a8w8": gemm_op})
    utility = make_vendor_module("aiter.utility", {"dtypes": dtypes})
    chip_info = make_vendor_module("aiter.jit.utils.chip_info", {"get_gfx": impl.get_gfx})
    jit_utils = make_vendor_module("aiter.jit.utils", {"chip_info": chip_info})
    jit = make_vendor_module("aiter.jit", {"utils": jit_utils})
    enums = {"QuantType": QuantType, "ActivationType": ActivationType}
    fused_moe = make_vendor_module("aiter.fused_moe", {"fused_moe": recorded(log, "aiter", "fused_moe", moe.fused_moe),
                                                       **enums})
    top = make_vendor_module(
        "aiter",
        {
            **gemms,
            "dtypes": dtypes,
            "ops": ops,
            "utility": utility,
            "jit": jit,
            "fused_moe": fused_moe,
            **enums,
            "set_gfx": impl.set_gfx,
            "reset": impl.reset,
            "FAKE": impl,
        },
        __doc__ or "",
    )
    return impl, {
        "aiter": top,
        "aiter.ops": ops,
        "aiter.ops.shuffle": shuffle,
        "aiter.ops.gemm_op_a8w8": gemm_op,
        "aiter.utility": utility,
        "aiter.utility.dtypes": dtypes,
        "aiter.jit": jit,
        "aiter.jit.utils": jit_utils,
        "aiter.jit.utils.chip_info": chip_info,
        "aiter.fused_moe": fused_moe,
    }
