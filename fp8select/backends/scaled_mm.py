"""``cuda-scaled-mm`` and ``xpu-scaled-mm``: torch's public ``F.scaled_mm`` with block-wise recipes.

Same call, different scale layouts (FACTS.md, measured on an H200 with torch 2.11 and read
from torch's XPU source):

* CUDA (cuBLASLt, sm90 only): activation scale [M, K/128] with strides (1, M) (M-major);
  128x128 weight scale = the checkpoint's row-major [N/128, K/128] tensor ``.t()``, its
  K-blocks zero-padded to a multiple of 4 (cuBLAS expects that; the private
  ``torch._scaled_mm`` silently returns wrong results without it, so it is never used);
  1x128 weight scale [N, K/128] with strides (1, N) (measured: a contiguous one is rejected).
  cuBLAS rejects M that is not a multiple of 4; such M are padded with zero rows.
* XPU (oneDNN): activation scale row-major [M, K/128]; 128x128 weight scale [K/128, N/128]
  contiguous (the checkpoint's scale transposed-contiguous); 1x128 weight scale a [N, K/128]
  view whose ``.t()`` is contiguous. Anything else is copied by torch on every call, so
  :meth:`XpuScaledMMBackend.prepare` lays the scales out once at load time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from fp8select.backends._vendor import bind_quantizer, quantize_activation
from fp8select.backends.base import Backend, BLOCK_1x128, Launch, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.kernels.quant import M_MAJOR, ROW_MAJOR, ScaleLayout
from fp8select.probes import (
    ComputeCapability,
    DeviceKind,
    Functional,
    HasScaledMM,
    Probe,
    ScalingTypes,
    ToolkitVersion,
    TorchVersion,
)
from fp8select.verdict import Verdict

BLOCKWISE_MEMBERS = ("BlockWise1x128", "BlockWise128x128")

# Rows cuBLAS block-wise scaled_mm accepts, measured on the H200 (torch 2.11 + CUDA 13, M = 1..33
# and more, K = 512/640/7168/7200): multiples of 4 run, every other M is rejected
# (benchmarks/results/h200-run1). Other M are padded with zero rows to the next multiple.
CUDA_M_MULTIPLE = 4


def _scaled_mm() -> Callable[..., torch.Tensor]:
    """The function called; a seam so CPU tests can substitute a fake that checks layouts."""
    return F.scaled_mm  # type: ignore[attr-defined,no-any-return]


def _recipes(block_size: tuple[int, int]) -> tuple[Any, Any]:
    st = F.ScalingType  # type: ignore[attr-defined]
    weight = st.BlockWise1x128 if tuple(block_size) == BLOCK_1x128 else st.BlockWise128x128
    return st.BlockWise1x128, weight


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


class _ScaledMMBackend(Backend):
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    n_multiple = 16
    k_multiple = 16
    scale_layout_name: ClassVar[str] = "row"

    @property
    def input_scale_layout(self) -> ScaleLayout:
        return M_MAJOR if self.scale_layout_name == "m_major" else ROW_MAJOR

    def _call(self, prepared: PreparedWeight, x_q: torch.Tensor, x_s: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
        recipe_a, recipe_b = _recipes(prepared.block_size)
        return _scaled_mm()(x_q, prepared.weight.t(), x_s, recipe_a, prepared.scale, recipe_b,
                            bias=bias, output_dtype=out_dtype)

    m_multiple: ClassVar[int] = 1
    """Rows the library takes a multiple of (a bound launch quantizes into that many, unwritten past M)."""

    def bind(self, prepared: PreparedWeight, *, caps: Capabilities, config: Any, out_dtype: torch.dtype) -> Launch:
        """The quantizer (this backend's scale layout), the function, recipes and weight view bound once."""
        scaled_mm = _scaled_mm()
        recipe_a, recipe_b = _recipes(prepared.block_size)
        weight_t, scale = prepared.weight.t(), prepared.scale
        quantize = bind_quantizer(prepared.k, prepared.weight.dtype, self.input_scale_layout, prepared.weight.device)
        multiple = self.m_multiple

        def launch(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            m = x.shape[0]
            rows = -(-m // multiple) * multiple
            x_q, x_s = quantize(x, rows)
            if bias is not None and bias.dtype != out_dtype:
                bias = bias.to(out_dtype)
            out = scaled_mm(x_q, weight_t, x_s, recipe_a, scale, recipe_b, bias=bias, output_dtype=out_dtype)
            return out if rows == m else out[:m]

        return launch

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        if input_scale is None:
            x_q, x_s = quantize_activation(x, prepared.weight.dtype, self.input_scale_layout)
        else:
            x_q, x_s = x, self._relayout_input_scale(input_scale)
        if bias is not None and bias.dtype != out_dtype:
            bias = bias.to(out_dtype)
        return self._call(prepared, x_q, x_s, bias, out_dtype)

    def _relayout_input_scale(self, scale: torch.Tensor) -> torch.Tensor:
        """A caller-quantized input's scale in this backend's layout (a copy only if needed)."""
        if self.scale_layout_name == "m_major":
            return scale if scale.stride(0) == 1 else scale.t().contiguous().t()
        return scale.contiguous()


class CudaScaledMMBackend(_ScaledMMBackend):
    name = "cuda-scaled-mm"
    summary = "torch F.scaled_mm block-wise (cuBLASLt) on CUDA sm90"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        ComputeCapability(allowed=((9, 0),)),
        TorchVersion(">=2.10", "block-wise scaled_mm silently wrong when (K/128) % 4 != 0 before 2.10, pytorch#166752"),
        ToolkitVersion("cuda", ">=12.9", "cuBLASLt block-wise scaling"),
        HasScaledMM(),
        ScalingTypes(BLOCKWISE_MEMBERS),
    )
    scale_layout_name = "m_major"
    m_multiple = CUDA_M_MULTIPLE

    def supports_m(self, m: int, caps: Capabilities) -> Verdict:
        """Any M: cuBLAS needs M % 4 == 0, so other M are padded with zero rows (at most 3)."""
        return Verdict.accept(f"any M (M % {CUDA_M_MULTIPLE} != 0 padded; found M={m})")

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        m = x.shape[0]
        m_pad = _round_up(m, CUDA_M_MULTIPLE)
        if m_pad == m:
            return super().run(prepared, x, input_scale=input_scale, bias=bias, out_dtype=out_dtype, caps=caps)
        padded = x.new_zeros((m_pad, x.shape[1]))
        padded[:m] = x
        if input_scale is not None:
            scale = input_scale.new_ones((m_pad, input_scale.shape[1]))
            scale[:m] = input_scale
            input_scale = scale
        out = super().run(prepared, padded, input_scale=input_scale, bias=bias, out_dtype=out_dtype, caps=caps)
        return out[:m]

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        n, k = weight.shape
        if tuple(block_size) == BLOCK_1x128:
            scale = weight_scale.t().contiguous().t()  # [N, K/128] with strides (1, N), as cuBLAS requires
        else:
            kb = weight_scale.shape[1]
            padded = torch.zeros((weight_scale.shape[0], _round_up(kb, 4)), dtype=torch.float32, device=weight_scale.device)
            padded[:, :kb] = weight_scale
            scale = padded.t()  # [round_up(K/128, 4), N/128], strides (1, round_up(K/128, 4))
        return PreparedWeight(self.name, weight, scale, block_pair(block_size), n, k, weight,
                              extra={"checkpoint_scale": weight_scale})


class XpuScaledMMBackend(_ScaledMMBackend):
    name = "xpu-scaled-mm"
    summary = "torch F.scaled_mm block-wise (oneDNN) on Intel XPU"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("xpu",)),
        Functional("xpu_blockwise_scaled_mm", "block-wise F.scaled_mm tried on a small problem", otherwise=TorchVersion(
            ">=2.13", "block-wise XPU scaled_mm: absent in 2.11 (vllm#41677), expected in 2.12/2.13 "
                      "(pytorch#173630, #176043); unverified, so gated at 2.13")),
        HasScaledMM(),
        ScalingTypes(BLOCKWISE_MEMBERS),
    )
    scale_layout_name = "row"

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        n, k = weight.shape
        stored = weight_scale.t().contiguous()  # [K/128, N/128] or [K/128, N], contiguous, once
        scale = stored.t() if tuple(block_size) == BLOCK_1x128 else stored
        return PreparedWeight(self.name, weight, scale, block_pair(block_size), n, k, weight,
                              extra={"checkpoint_scale": weight_scale})
