"""``cutlass``: sgl-kernel's CUTLASS ``fp8_blockwise_scaled_mm``.

API followed (docs/vendor-apis.md, "sgl-kernel CUTLASS"; sgl-project/sglang
sgl-kernel/python/sgl_kernel/gemm.py and csrc/gemm/fp8_blockwise_gemm_kernel.cu at commit
0e6ed14d, sgl-kernel 0.3.x; the same schema and checks in sglang-kernel 0.4.4, the
distribution that now ships ``sgl_kernel``, run on the H200):
``sgl_kernel.fp8_blockwise_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype)`` returns a
new [M, N] tensor; SGLang calls it as
``fp8_blockwise_scaled_mm(q_input, weight.T, x_scale, weight_scale.T, out_dtype)``.

Layouts: ``mat_a`` the quantized activation [M, K] row-major; ``mat_b`` the checkpoint weight's
``.t()`` view ([K, N], column-major, no copy); ``scales_a`` fp32 [M, K/128] M-major
(``stride(0) == 1``), written so by the quantizer; ``scales_b`` the checkpoint scale's ``.t()``
view ([K/128, N/128], K-major). All views: the weight is shared with the fallback. The
library pads M to a multiple of 4 itself (a copy of ``mat_a`` and ``scales_a`` when M % 4 != 0)
and on sm90 copies ``scales_b`` contiguous on every call. No bias argument: it is added
afterwards.

Gates: sm90 (CUDA >= 12.0) and sm100 (CUDA >= 12.8); sm120 exists in later builds whose
release is unverified. The kernel's shape checks use ``K // 128`` and ``N // 128``, so the
checkpoint's ceil-sized scales fail for N or K not multiples of 128: those go to the fallback.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from fp8select.backends._vendor import EntryPoint, add_bias, bind_quantizer, e4m3fn_gate, quantized_input, require
from fp8select.backends.base import Backend, BLOCK_128x128, Launch, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.kernels.quant import M_MAJOR, ScaleLayout
from fp8select.probes import AllOf, AnyOf, ComputeCapability, DeviceKind, Package, Probe, ToolkitVersion
from fp8select.probes.core import PackageSymbols
from fp8select.problem import Problem
from fp8select.verdict import Verdict

MODULE = "sgl_kernel"
ENTRY_POINT = "fp8_blockwise_scaled_mm"


class CutlassBackend(Backend):
    name = "cutlass"
    summary = "sgl-kernel CUTLASS fp8_blockwise_scaled_mm (sm90, sm100)"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        AnyOf((
            AllOf((ComputeCapability(allowed=((9, 0),)), ToolkitVersion("cuda", ">=12.0", "sgl-kernel CUTLASS sm90"))),
            AllOf((ComputeCapability(allowed=((10, 0),)), ToolkitVersion("cuda", ">=12.8", "sgl-kernel CUTLASS sm100"))),
        )),
        Package(MODULE, why=ENTRY_POINT),
        PackageSymbols(MODULE, (ENTRY_POINT,)),
    )
    block_sizes = (BLOCK_128x128,)
    n_multiple = 128
    k_multiple = 128
    packages = (MODULE,)

    activation_scale_layout: ClassVar[ScaleLayout] = M_MAJOR  # a class attribute so a test can break it

    @property
    def input_scale_layout(self) -> ScaleLayout:
        """M-major fp32 [M, K/128] (``scales_a must be M major``)."""
        return self.activation_scale_layout

    def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
        """The shared gate with e4m3fn operands; at load time, the entry point."""
        return e4m3fn_gate(super().supports(problem, caps), problem, caps, MODULE, (ENTRY_POINT,))

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """``.t()`` views of the checkpoint weight and scale: column-major B, K-major scales, no copy."""
        gemm = require(MODULE, (ENTRY_POINT,))
        n, k = weight.shape
        w = weight.contiguous()
        return PreparedWeight(self.name, w.t(), weight_scale.contiguous().t(), block_pair(block_size), n, k, w,
                              extra={"gemm": gemm})

    def bind(self, prepared: PreparedWeight, *, caps: Capabilities, config: Any, out_dtype: torch.dtype) -> Launch:
        """The quantizer (M-major scales), entry point and weight views bound once."""
        gemm = prepared.extra["gemm"].fn
        weight, scale = prepared.weight, prepared.scale
        quantize = bind_quantizer(prepared.k, torch.float8_e4m3fn, self.activation_scale_layout, weight.device)

        def launch(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            x_q, x_s = quantize(x)
            out = gemm(x_q, weight, x_s, scale, out_dtype)
            return out if bias is None else add_bias(out, bias)

        return launch

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        gemm: EntryPoint = prepared.extra["gemm"]
        x_q, x_s = quantized_input(x, input_scale, torch.float8_e4m3fn, self.activation_scale_layout)
        out = gemm.fn(x_q, prepared.weight, x_s, prepared.scale, out_dtype)
        return add_bias(out, bias)
