"""The built-in MoE experts backends, in default priority order (data, not branches): DeepGEMM's grouped
GEMMs first (run on the H200), torch's next (gated on what runs), fp8select's Triton kernels (run on the
H200), then the vendors' adapters that have run only against their fakes (sgl-kernel's CUTLASS grouped
GEMM; FlashInfer's fused MoE, declared), then the pure-torch reference. The MoE chain is not verified on
the device at ``resolve()`` as the dense one is, so a backend that has not run on real hardware comes
after those that have: the rule never picks it over them, a measured table or an explicit choice can."""

from __future__ import annotations

from fp8select.backends.moe import FlashInferMoe, MoeBackend, ReferenceMoe, TorchGroupedMoe, TritonMoe
from fp8select.backends.moe_cutlass import CutlassMoe
from fp8select.backends.moe_deepgemm import DeepGemmMoe

__all__ = ["MOE_BACKENDS"]

MOE_BACKENDS: tuple[type[MoeBackend], ...] = (DeepGemmMoe, TorchGroupedMoe, TritonMoe, CutlassMoe, FlashInferMoe,
                                               ReferenceMoe)
