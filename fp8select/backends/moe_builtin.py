"""The built-in MoE experts backends, in default priority order (data, not branches): the vendors'
grouped GEMMs first (DeepGEMM, run on the H200, before sgl-kernel's CUTLASS one, not run there yet),
torch's next, fp8select's Triton kernels, then the pure-torch reference."""

from __future__ import annotations

from fp8select.backends.moe import FlashInferMoe, MoeBackend, ReferenceMoe, TorchGroupedMoe, TritonMoe
from fp8select.backends.moe_cutlass import CutlassMoe
from fp8select.backends.moe_deepgemm import DeepGemmMoe

__all__ = ["MOE_BACKENDS"]

MOE_BACKENDS: tuple[type[MoeBackend], ...] = (DeepGemmMoe, CutlassMoe, FlashInferMoe, TorchGroupedMoe, TritonMoe,
                                               ReferenceMoe)
