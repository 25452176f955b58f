"""``deepgemm``: DeepSeek's DeepGEMM ``fp8_gemm_nt`` on sm90 / sm100.

API followed (docs/vendor-apis.md, "DeepGEMM"): DeepGEMM 2.x
``deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d, c=None, recipe=None, ...)``: in 2.6.1 (main at
54e2261, read and run on the H200) an alias of ``fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None,
recipe_a=None, recipe_b=None, compiled_dims="nk", disable_ue8m0_cast=False)``, in 2.8.0 with a
trailing ``alpha=None``, in the 2.0-era form without ``recipe_a``/``recipe_b``; and on sm90 the
v1 name ``gemm_fp8_fp8_bf16_nt(lhs, rhs, out)`` (before the 2025-07 refactor, DeepGEMM #112),
which takes the same three positional arguments. Only ``a``, ``b``, ``d`` are passed, so
every release binds; the recipe is DeepGEMM's default for the scale dtypes. ``d = a @ b.T``
is written in place (bf16, row-major); DeepGEMM has no bias argument, so the bias is added
afterwards.

Layouts:

* sm90: the weight and its fp32 [N/128, K/128] scale as in the checkpoint (shared with the
  fallback); the activation scale fp32 [M, K/128] MN-major and TMA-aligned, strides
  ``(1, round_up(M, 4))``, written so by the quantizer (DeepGEMM would otherwise copy it on
  every call: 2.6.1 copies any other fp32 layout silently, it does not assert).
* sm100: scales are UE8M0 exponents packed four per int32, MN-major, TMA-aligned, one row per
  output feature (recipe (1, 1, 128)). fp32 scales would be truncated to powers of two on
  every call, so :meth:`DeepGemmBackend.prepare` re-quantizes the weight once with
  power-of-two block scales (skipped when the checkpoint's are already powers of two, as in
  UE8M0 checkpoints, which keeps the weight shared) and activations are quantized with
  power-of-two scales, then packed.

Device gate (FACTS.md): sm90 with CUDA >= 12.3, sm100 with CUDA >= 12.9; never sm12x (GB10 is
sm121). Problem gate (SGLang's): N % 64 == 0, K % 128 == 0, 128x128 weight blocks, bf16 output
(2.6.1's host code asserts only TMA alignment, K % 16 and N % 8; its results outside SGLang's
gate are unverified).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fp8select.backends._vendor import (
    EntryPoint,
    add_bias,
    bind_quantizer,
    dtypes_ok,
    entry_points_gate,
    quantize_activation,
    relayout_scale,
    require,
)
from fp8select.backends.base import CHECKPOINT_LAYOUT, Backend, BLOCK_128x128, Launch, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.kernels.quant import ScaleLayout
from fp8select.kernels.vendor_layouts import expand_block_rows, is_power_of_two, pack_ue8m0, requantize_ue8m0
from fp8select.probes import AllOf, AnyOf, ComputeCapability, DeviceKind, Package, Probe, ToolkitVersion
from fp8select.probes.core import PackageSymbols
from fp8select.problem import Problem
from fp8select.verdict import Verdict

SM90, SM100 = (9, 0), (10, 0)
MODULE = "deep_gemm"
# Entry points by architecture, preferred first: v1's name exists only for Hopper.
ENTRY_POINTS: dict[tuple[int, int], tuple[str, ...]] = {
    SM90: ("fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt"),
    SM100: ("fp8_gemm_nt",),
}
SM100_WHY = "DeepGEMM 2.x on sm100; v1's gemm_fp8_fp8_bf16_nt is SM90 only"


def _arch(caps: Capabilities) -> tuple[int, int]:
    cc = caps.compute_capability
    return SM100 if cc is not None and tuple(cc) == SM100 else SM90


def _why(arch: tuple[int, int]) -> str:
    return SM100_WHY if arch == SM100 else ""


@dataclass(frozen=True)
class DeepGemmEntryPoint(Probe):
    """The installed ``deep_gemm`` exposes the GEMM this architecture needs (from the snapshot)."""

    @property
    def requirement(self) -> str:
        return "package deep_gemm exposing fp8_gemm_nt (sm100), or fp8_gemm_nt or gemm_fp8_fp8_bf16_nt (sm90)"

    def __call__(self, caps: Capabilities) -> Verdict:
        arch = _arch(caps)
        return PackageSymbols(MODULE, ENTRY_POINTS[arch], _why(arch))(caps)


class DeepGemmBackend(Backend):
    name = "deepgemm"
    jit = True
    summary = "DeepGEMM fp8_gemm_nt (JIT CUDA kernels), sm90 and sm100 only"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        AnyOf((
            AllOf((ComputeCapability(allowed=(SM90,)), ToolkitVersion("cuda", ">=12.3", "DeepGEMM sm90"))),
            AllOf((ComputeCapability(allowed=(SM100,)), ToolkitVersion("cuda", ">=12.9", "DeepGEMM sm100"))),
        )),
        Package(MODULE),
        DeepGemmEntryPoint(),
    )
    block_sizes = (BLOCK_128x128,)
    out_dtypes = (torch.bfloat16,)
    n_multiple = 64
    k_multiple = 128
    packages = (MODULE,)

    # Activation-scale layouts (class attributes so a test can substitute a wrong one).
    sm90_scale_layout: ClassVar[ScaleLayout] = ScaleLayout(mn_major=True, m_align=4)
    sm100_scale_layout: ClassVar[ScaleLayout] = ScaleLayout(mn_major=True, m_align=4, ue8m0=True)
    pack_activation_scales: ClassVar[bool] = True

    @property
    def input_scale_layout(self) -> ScaleLayout:
        """MN-major, TMA-aligned fp32 (what sm90 reads; on sm100 only unquantized inputs are taken)."""
        return self.sm90_scale_layout

    def warm_up(self, caps: Capabilities, device: torch.device) -> None:
        """Start DeepGEMM's JIT compiler. It starts at a process's first kernel build and runs ``nvcc
        --version`` then: 0.55-0.65 s of a warm start's first call on the H200 host. Re-laying out a
        tiny scale tensor builds DeepGEMM's smallest kernel (``transpose_fp32``: compiled once, then
        cached on disk like every DeepGEMM kernel), which starts the compiler here instead."""
        layout = require(MODULE, ("get_mn_major_tma_aligned_tensor",)).fn
        layout(torch.zeros((8, 4), dtype=torch.float32, device=device))  # row-major: the kernel transposes it

    def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
        """The shared gate, e4m3fn operands, no caller-quantized input on sm100; at load time the entry point."""
        verdict = super().supports(problem, caps)
        if not verdict.ok:
            return verdict
        arch = _arch(caps)
        rejected = dtypes_ok(problem, (torch.float8_e4m3fn,), (torch.float8_e4m3fn,) if arch == SM90 else ())
        if rejected is not None:
            if arch == SM100 and problem.pre_quantized:
                return Verdict.reject(rejected.reason + " (on sm100 DeepGEMM reads power-of-two UE8M0 activation "
                                                        "scales; a caller's fp32 scales would be truncated)")
            return rejected
        return entry_points_gate(problem, verdict, caps, MODULE, ENTRY_POINTS[arch], why=_why(arch))

    def weight_layout(self, caps: Capabilities, problem: Problem) -> str:
        """sm90 reads the checkpoint; sm100 a copy requantized with power-of-two block scales (counted as
        a copy even when the checkpoint's scales are already powers of two and none is made)."""
        return "ue8m0-requantized" if _arch(caps) == SM100 else CHECKPOINT_LAYOUT

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """sm90: the checkpoint as is. sm100: power-of-two block scales, packed UE8M0 per output row."""
        arch = _arch(caps)
        gemm = require(MODULE, ENTRY_POINTS[arch], _why(arch))
        n, k = weight.shape
        w = weight.contiguous()
        if arch == SM90:
            return PreparedWeight(self.name, w, weight_scale.contiguous(), block_pair(block_size), n, k, w,
                                  extra={"gemm": gemm})
        if is_power_of_two(weight_scale):
            scale, shared = weight_scale.contiguous(), w  # a UE8M0 checkpoint: nothing to re-quantize
        else:
            w, scale = requantize_ue8m0(weight, weight_scale, block_pair(block_size))
            shared = w  # the fallback shares the requantized weight with its power-of-two scales (scale_nk)
        packed = pack_ue8m0(expand_block_rows(scale, n, block_size[0]))
        return PreparedWeight(self.name, w, packed, block_pair(block_size), n, k, shared,
                              extra={"gemm": gemm, "scale_nk": scale}, scale_nk=scale)

    def bind(self, prepared: PreparedWeight, *, caps: Capabilities, config: Any, out_dtype: torch.dtype) -> Launch:
        """sm90: the quantizer (MN-major, TMA-aligned scales) and the entry point bound once; sm100 calls :meth:`run`."""
        if prepared.scale.dtype == torch.int32:
            return super().bind(prepared, caps=caps, config=config, out_dtype=out_dtype)
        gemm = prepared.extra["gemm"].fn
        weight = (prepared.weight, prepared.scale)
        n, device = prepared.n, prepared.weight.device
        quantize = bind_quantizer(prepared.k, torch.float8_e4m3fn, self.sm90_scale_layout, device)

        def launch(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            out = torch.empty((x.shape[0], n), dtype=out_dtype, device=device)
            gemm(quantize(x), weight, out)
            return out if bias is None else add_bias(out, bias)

        return launch

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        gemm: EntryPoint = prepared.extra["gemm"]
        ue8m0 = prepared.scale.dtype == torch.int32
        if input_scale is None:
            layout = self.sm100_scale_layout if ue8m0 else self.sm90_scale_layout
            x_q, x_s = quantize_activation(x, torch.float8_e4m3fn, layout)
        else:
            x_q, x_s = x, relayout_scale(input_scale, self.sm90_scale_layout)
        if ue8m0 and self.pack_activation_scales:
            x_s = pack_ue8m0(x_s, check=False)  # powers of two by construction; no host sync per call
        out = torch.empty((x.shape[0], prepared.n), dtype=out_dtype, device=x.device)
        gemm.fn((x_q, x_s), (prepared.weight, prepared.scale), out)
        return add_bias(out, bias)
