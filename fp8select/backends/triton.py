"""``triton``: fp8select's own Triton block-FP8 GEMM (``fp8select.kernels.triton_gemm``).

Runs where fp8 ``tl.dot`` works: CUDA capability >= 8.9 (Triton errors below), ROCm
gfx942 (e4m3fnuz: Triton's e4m3fn dot fails there, triton#6542) and gfx950, XPU with
Triton's Intel backend, and on CPU under ``TRITON_INTERPRET=1`` (the interpreter: correct
but slow, for tests). Weights stay in the checkpoint layout. The launch configuration of each
call is the caller's (``run(..., config=)``, from the layer's measured plan) or, without one,
the kernels' heuristic for the shape and M.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from fp8select.backends.base import CHECKPOINT_LAYOUT, FNUZ_LAYOUT, Backend, Launch, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.kernels.triton_config import TritonConfig
from fp8select.kernels.triton_search import fit_split
from fp8select.probes import AllOf, AnyOf, ComputeCapability, DeviceKind, EnvFlag, GfxArch, Package, Probe, TritonTarget
from fp8select.problem import Problem, dtype_name
from fp8select.verdict import Verdict

TRITON_DEVICES = AnyOf((
    AllOf((DeviceKind(("cuda",)), ComputeCapability(minimum=(8, 9)), TritonTarget("nvidia"))),
    AllOf((DeviceKind(("rocm",)), GfxArch(("gfx942", "gfx950")), TritonTarget("amd"))),
    AllOf((DeviceKind(("xpu",)), TritonTarget("intel"))),
    AllOf((DeviceKind(("cpu",)), EnvFlag("TRITON_INTERPRET"))),
))


class TritonBackend(Backend):
    name = "triton"
    jit = True
    summary = "fp8select's Triton block-FP8 GEMM, fused activation quantization for small M"
    requires: ClassVar[tuple[Probe, ...]] = (Package("triton"), TRITON_DEVICES)
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def weight_dtype(self, caps: Capabilities) -> torch.dtype:
        return torch.float8_e4m3fnuz if caps.gfx_arch == "gfx942" else torch.float8_e4m3fn

    def compute_dtype(self, weight_dtype: torch.dtype, caps: Capabilities) -> torch.dtype:
        """The fp8 dtype the kernel multiplies a ``weight_dtype`` checkpoint in: e4m3fnuz for an
        e4m3fn weight on gfx942 (converted at :meth:`prepare`), else the weight's own."""
        native = self.weight_dtype(caps)
        return native if weight_dtype == torch.float8_e4m3fn and native == torch.float8_e4m3fnuz else weight_dtype

    def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
        """The shared gate, and a pre-quantized input must be in the fp8 dtype the weight is
        multiplied in (the kernel takes one fp8 dtype for both operands)."""
        verdict = super().supports(problem, caps)
        if verdict.ok and problem.pre_quantized:
            want = self.compute_dtype(problem.weight_dtype, caps)
            if problem.act_dtype != want:
                how = "" if want == problem.weight_dtype else f" (it runs as {dtype_name(want)} on {caps.gfx_arch})"
                return Verdict.reject(f"requires a pre-quantized input in the weight's fp8 dtype {dtype_name(want)}, "
                                      f"found input {dtype_name(problem.act_dtype)} with weight "
                                      f"{dtype_name(problem.weight_dtype)}{how}")
        return verdict

    def weight_layout(self, caps: Capabilities, problem: Problem) -> str:
        """An e4m3fnuz copy of an e4m3fn checkpoint on gfx942 (shared with AITER's), else the checkpoint."""
        if self.weight_dtype(caps) == torch.float8_e4m3fnuz and problem.weight_dtype == torch.float8_e4m3fn:
            return FNUZ_LAYOUT
        return CHECKPOINT_LAYOUT

    def launch_config(self, config: Mapping[str, Any]) -> TritonConfig:
        """A measured configuration (a tuning-table row's ``config``, :meth:`TritonConfig.to_dict`
        form) as :meth:`run` takes it; ``ValueError`` naming the key when it is malformed."""
        return TritonConfig.from_dict(config)

    def fit_config(self, config: TritonConfig, measured_at: tuple[int, int], problem: Problem, m: int) -> TritonConfig:
        """The same tiles with the split-K that keeps the measured launch's number of programs
        (:func:`fp8select.kernels.triton_search.fit_split`)."""
        return fit_split(config, measured_at, (problem.n, problem.k), m)

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """The checkpoint layout; on gfx942 an e4m3fn weight becomes e4m3fnuz (Triton's e4m3fn dot
        fails there), same bits but 0x80, scales doubled, once at load time. The layer's own
        split-K counters are made here too, so no call allocates memory that outlives it."""
        from fp8select.kernels.triton_gemm import fixup_counters

        if self.compute_dtype(weight.dtype, caps) != weight.dtype:
            from fp8select.kernels.vendor_layouts import e4m3fn_to_e4m3fnuz

            w, s = e4m3fn_to_e4m3fnuz(weight, weight_scale)
            n, k = w.shape
            prepared = PreparedWeight(self.name, w, s, block_pair(block_size), n, k, w, scale_nk=s)
        else:
            prepared = super().prepare(weight, weight_scale, block_size, caps)
        prepared.extra["fixup_counters"] = fixup_counters(prepared.n, weight.device)
        return prepared

    def bind(self, prepared: PreparedWeight, *, caps: Capabilities, config: TritonConfig | None,
             out_dtype: torch.dtype) -> Launch:
        """The quantizer and GEMM of ``config`` bound to their kernels once (:class:`~fp8select.kernels.
        triton_bound.BoundLinear`); off a GPU (the interpreter) the same, launched through Triton."""
        from fp8select.kernels.triton_bound import BoundLinear

        return BoundLinear(prepared.weight, prepared.scale, prepared.block_size, config, out_dtype=out_dtype,
                           counters=prepared.extra.get("fixup_counters"))

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities,
            config: TritonConfig | None = None) -> torch.Tensor:
        """The forward with launch configuration ``config`` (None: the kernels' heuristic for
        this shape and M). On a pre-quantized ``x`` a configuration whose path quantizes in the
        kernel runs its prequantized sibling with the same tiles (fused -> gemm, decode -> swap)."""
        from fp8select.kernels import triton_gemm

        counters = prepared.extra.get("fixup_counters")
        if input_scale is None:
            return triton_gemm.linear(x, prepared.weight, prepared.scale, prepared.block_size,
                                      out_dtype=out_dtype, bias=bias, config=config, counters=counters)
        return triton_gemm.w8a8_block_gemm(x, input_scale, prepared.weight, prepared.scale, prepared.block_size,
                                           out_dtype=out_dtype, bias=bias, config=config, counters=counters)
