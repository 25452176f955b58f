"""The built-in MoE experts backends, in default priority order (data, not branches): DeepGEMM's grouped
GEMMs first (run on the H200), torch's next (gated on what runs), then the two that run only on their own
platforms and only when asked (AITER's fused MoE on gfx942/gfx950, Ascend's grouped GEMM on A5, each behind
an opt-in flag: there the user's flag decides over fp8select's Triton kernels, which gfx942 and Ascend do not
run and gfx950 has not measured), fp8select's Triton kernels (run on the H200), sgl-kernel's CUTLASS grouped
GEMM (run on the H200; it came in after Triton, and with no table the rule keeps it there: on the H200's
table each is the fastest at some points), FlashInfer's fused MoE (declared, run only against its fake),
then the pure-torch reference. The MoE chain is not verified on the device at ``resolve()`` as the dense one
is, so on a CUDA machine a backend that has not run on real hardware comes after those that have: the rule
never picks it over them, a measured table or an explicit choice can."""

from __future__ import annotations

from fp8select.backends.moe import FlashInferMoe, MoeBackend, ReferenceMoe, TorchGroupedMoe, TritonMoe
from fp8select.backends.moe_aiter import AiterMoe
from fp8select.backends.moe_cutlass import CutlassMoe
from fp8select.backends.moe_deepgemm import DeepGemmMoe
from fp8select.backends.moe_npu import NpuMoe

__all__ = ["MOE_BACKENDS"]

MOE_BACKENDS: tuple[type[MoeBackend], ...] = (DeepGemmMoe, TorchGroupedMoe, AiterMoe, NpuMoe, TritonMoe, CutlassMoe,
                                               FlashInferMoe, ReferenceMoe)
