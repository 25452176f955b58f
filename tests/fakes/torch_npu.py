"""Fake ``torch_npu`` (Ascend/pytorch + op-plugin) for CPU tests of the block-FP8 path.

Emulates what an adapter for Ascend A5 (arch35, Ascend 950) needs:

* ``npu_dynamic_block_quant(x, *, min_scale=0.0, round_mode="rint", dst_type=1,
  row_block_size=1, col_block_size=128) -> (y, scale)``: block-wise dynamic quantisation;
  ``scale`` [ceil(M/row), ceil(K/col)] float32 is the dequantisation multiplier
  (``amax / dtype_max``). ``dst_type`` takes ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``
  (FP8 only on arch35) or ``torch.int8`` / ``1``.
* ``npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
  output_dtype=None, x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None,
  scale_dtype=None, group_sizes=None)``: only the FP8 "G-B" block path is emulated:
  x1 [M, K] FP8, x2 [K, N] FP8 (contiguous, or the ``.t()`` view of a contiguous [N, K]),
  ``scale`` [K/128, N/128] float32 whose transposition matches x2's (the ``.t()`` view of the
  checkpoint [N/128, K/128] when x2 is a view), ``pertoken_scale`` [M, K/128] float32,
  ``group_sizes=[1, 128, 128]``, ``output_dtype`` bf16/fp16. Other quantisation modes raise
  ``NotImplementedError`` (fake limitation, not a vendor rule).
* ``torch_npu._C._npu_get_soc_version()`` and ``torch_npu.npu.get_device_name(device=None)``.
* ``npu_grouped_matmul`` in its FP8 per-block mode (tests/fakes/torch_npu_moe.py says how).

Knobs (on ``fake.impl``; ``set_soc`` / ``reset`` are also module functions): ``device_name``
(default ``"Ascend950PR"``) and ``soc_version`` (default 260). The fake treats a device as
arch35 when its name contains ``Ascend910_95`` or ``Ascend950`` or its SoC version is >= 260
(the rule in FACTS.md; the exact strings and numbers are unverified). Errors are
``RuntimeError`` (op-plugin ``TORCH_CHECK``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import Call, ceil_div, dequantize_blockwise, make_vendor_module, recorded
from .torch_npu_moe import FakeTorchNpuMoe

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_DST_TYPES: dict[Any, torch.dtype] = {
    1: torch.int8,
    torch.int8: torch.int8,
    torch.float8_e4m3fn: torch.float8_e4m3fn,
    torch.float8_e5m2: torch.float8_e5m2,
}
_DST_MAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _orientation(t: torch.Tensor) -> str | None:
    """``"rowmajor"``, ``"transposed"`` (``.t()`` of a contiguous tensor), ``"other"``, or None if both."""
    plain, transposed = t.is_contiguous(), t.t().is_contiguous()
    if plain and transposed:
        return None
    if plain:
        return "rowmajor"
    return "transposed" if transposed else "other"


class FakeTorchNPU:
    """State and behaviour of one installed fake ``torch_npu``."""

    def __init__(self, *, device_name: str = "Ascend950PR", soc_version: int = 260) -> None:
        self._initial = (device_name, int(soc_version))
        self.device_name, self.soc_version = self._initial

    def set_soc(self, device_name: str, soc_version: int) -> None:
        """Emulate another Ascend device, e.g. ``("Ascend910B2", 220)``."""
        self.device_name, self.soc_version = device_name, int(soc_version)

    def reset(self) -> None:
        """Restore the install-time device."""
        self.device_name, self.soc_version = self._initial

    @property
    def is_arch35(self) -> bool:
        """Whether the emulated device is an A5 (arch35) part with FP8 matmul units."""
        name = self.device_name
        return "Ascend910_95" in name or "Ascend950" in name or self.soc_version >= 260

    # ----------------------------------------------------------------- device queries (real API)

    def _npu_get_soc_version(self) -> int:
        """``torch_npu._C._npu_get_soc_version()``."""
        return self.soc_version

    def get_device_name(self, device: Any = None) -> str:
        """``torch_npu.npu.get_device_name(device)`` (also reachable as ``torch.npu``)."""
        return self.device_name

    def is_available(self) -> bool:
        """``torch_npu.npu.is_available()``."""
        return True

    # ----------------------------------------------------------------- ops (real API)

    def npu_dynamic_block_quant(
        self,
        x: torch.Tensor,
        *,
        min_scale: float = 0.0,
        round_mode: str = "rint",
        dst_type: Any = 1,
        row_block_size: int = 1,
        col_block_size: int = 128,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantise ``x`` per (row_block_size x col_block_size) block; return (y, scale)."""
        _check(x.dim() in (2, 3), f"The input x must be 2D or 3D, got {x.dim()}D")
        _check(x.dtype in (torch.float16, torch.bfloat16), f"x must be float16 or bfloat16, got {x.dtype}")
        _check(dst_type in _DST_TYPES, f"dst_type {dst_type!r} is not supported (int8, float8_e4m3fn, float8_e5m2)")
        out_dtype = _DST_TYPES[dst_type]
        if out_dtype in _FP8:
            _check(self.is_arch35, f"FP8 dst_type is only supported on Ascend 950 (arch35), device is {self.device_name}")
            _check(round_mode == "rint", f"round_mode must be 'rint' for FLOAT8 outputs, got {round_mode!r}")
        _check(row_block_size >= 1 and col_block_size >= 1, "block sizes must be positive")
        _check(min_scale >= 0.0, "min_scale must be non-negative")
        batched = x if x.dim() == 3 else x.unsqueeze(0)
        b, rows, cols = batched.shape
        rb, cb = ceil_div(rows, row_block_size), ceil_div(cols, col_block_size)
        padded = torch.zeros(b, rb * row_block_size, cb * col_block_size, dtype=torch.float32)
        padded[:, :rows, :cols] = batched.float()
        blocks = padded.view(b, rb, row_block_size, cb, col_block_size)
        scale = blocks.abs().amax(dim=(2, 4)) / _DST_MAX[out_dtype]
        if min_scale > 0.0:
            scale = torch.minimum(scale, torch.full_like(scale, 1.0 / min_scale))
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        scaled = blocks / safe[:, :, None, :, None]
        if out_dtype == torch.int8:
            scaled = torch.round(scaled).clamp(-127, 127)
        y = scaled.view(b, rb * row_block_size, cb * col_block_size)[:, :rows, :cols].to(out_dtype)
        if x.dim() == 2:
            return y[0].contiguous(), scale[0].contiguous()
        return y.contiguous(), scale.contiguous()

    def npu_quant_matmul(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        scale: torch.Tensor,
        *,
        offset: torch.Tensor | None = None,
        pertoken_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        output_dtype: torch.dtype | None = None,
        x1_dtype: torch.dtype | None = None,
        x2_dtype: torch.dtype | None = None,
        pertoken_scale_dtype: torch.dtype | None = None,
        scale_dtype: torch.dtype | None = None,
        group_sizes: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Quantised matmul; the fake implements the FP8 G-B (per-token x per-block) mode."""
        if x1.dtype not in _FP8 or group_sizes is None:
            raise NotImplementedError("the fake emulates only FP8 x1/x2 with group_sizes=[1, 128, 128]")
        _check(self.is_arch35, f"FLOAT8 npu_quant_matmul is only supported on Ascend 950 (arch35), device is {self.device_name}")
        _check(
            all(v is None for v in (x1_dtype, x2_dtype, pertoken_scale_dtype, scale_dtype)),
            "x1_dtype/x2_dtype/pertoken_scale_dtype/scale_dtype are for HiF8/FP4 inputs (not emulated)",
        )
        _check(offset is None, "offset is not supported for FP8 per-block quantisation")
        _check(
            len(group_sizes) == 3,
            f"When group_sizes is not empty, it only supports input with 3 elements, but got {len(group_sizes)}",
        )
        _check(
            tuple(group_sizes) == (1, 128, 128),
            f"group_sizes must be [1, 128, 128] for per-token x per-block FP8, got {list(group_sizes)}",
        )
        _check(x1.dim() == 2 and x2.dim() == 2, "x1 and x2 must be 2D for the per-block mode")
        _check(x2.dtype == x1.dtype, f"x1 and x2 must share a dtype, got {x1.dtype} and {x2.dtype}")
        _check(x1.is_contiguous(), "x1 must be a contiguous [M, K] tensor")
        m, k = x1.shape
        k2, n = x2.shape
        _check(k == k2, f"x1 K ({k}) and x2 K ({k2}) differ")
        x2_layout = _orientation(x2)
        _check(
            x2_layout != "other",
            "x2 must be a contiguous [K, N] tensor or the transposed view of a contiguous [N, K] tensor",
        )
        kb, nb = ceil_div(k, 128), ceil_div(n, 128)
        _check(scale.dtype == torch.float32, f"scale must be float32 for the per-block mode, got {scale.dtype}")
        _check(tuple(scale.shape) == (kb, nb), f"scale must be [ceil(K/128), ceil(N/128)] = {(kb, nb)}, got {tuple(scale.shape)}")
        scale_layout = _orientation(scale)
        _check(scale_layout != "other", "scale must be contiguous or the transposed view of a contiguous tensor")
        _check(
            scale_layout is None or x2_layout is None or scale_layout == x2_layout,
            f"the transposition of scale ({scale_layout}) must match x2's ({x2_layout}): pass w.t() with w_scale.t(), or both contiguous",
        )
        _check(pertoken_scale is not None, "pertoken_scale is required for the per-block mode")
        assert pertoken_scale is not None
        _check(pertoken_scale.dtype == torch.float32, f"pertoken_scale must be float32, got {pertoken_scale.dtype}")
        _check(
            tuple(pertoken_scale.shape) == (m, kb) and pertoken_scale.is_contiguous(),
            f"pertoken_scale must be a contiguous [M, ceil(K/128)] = {(m, kb)} tensor, got {tuple(pertoken_scale.shape)}",
        )
        out_dtype = output_dtype if output_dtype is not None else torch.int8
        _check(out_dtype in (torch.bfloat16, torch.float16), f"output_dtype must be bfloat16 or float16 here, got {out_dtype}")
        if bias is not None:
            _check(bias.dim() == 1 and bias.shape[0] == n, f"bias must be 1D [N] = [{n}]")
            _check(bias.dtype in (torch.float32, torch.bfloat16), f"bias must be float32 or bfloat16, got {bias.dtype}")
        a = dequantize_blockwise(x1, pertoken_scale, 1, 128)
        w = dequantize_blockwise(x2.t(), scale.t(), 128, 128)
        result = a @ w.T
        if bias is not None:
            result = result + bias.to(torch.float64)
        return result.to(out_dtype)


def build(log: list[Call], **options: Any) -> tuple[FakeTorchNPU, dict[str, Any]]:
    """Build the fake ``torch_npu`` package; ``options`` are ``FakeTorchNPU`` keyword knobs."""
    impl = FakeTorchNPU(**options)
    moe = FakeTorchNpuMoe(impl)  # npu_grouped_matmul (tests/fakes/torch_npu_moe.py)

    def rec(name: str) -> Any:
        return recorded(log, "torch_npu", name, getattr(impl, name))

    c_module = make_vendor_module("torch_npu._C", {"_npu_get_soc_version": rec("_npu_get_soc_version")})
    npu_module = make_vendor_module("torch_npu.npu", {"get_device_name": rec("get_device_name"), "is_available": rec("is_available")})
    top = make_vendor_module(
        "torch_npu",
        {
            "npu_dynamic_block_quant": rec("npu_dynamic_block_quant"),
            "npu_quant_matmul": rec("npu_quant_matmul"),
            "npu_grouped_matmul": recorded(log, "torch_npu", "npu_grouped_matmul", moe.npu_grouped_matmul),
            "_C": c_module,
            "npu": npu_module,
            "set_soc": impl.set_soc,
            "reset": impl.reset,
            "FAKE": impl,
        },
        __doc__ or "",
    )
    return impl, {"torch_npu": top, "torch_npu._C": c_module, "torch_npu.npu": npu_module}
