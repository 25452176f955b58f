"""``flashinfer``: FlashInfer's block-scaled FP8 GEMMs, one path per GPU generation."""

from __future__ import annotations

from typing import ClassVar

from fp8select.backends.base import BLOCK_128x128, Backend
from fp8select.probes import AllOf, AnyOf, ComputeCapability, DeviceKind, Package, Probe

FLASHINFER_PATHS = AnyOf((
    AllOf((ComputeCapability(allowed=((10, 0), (10, 3), (10, 7), (12, 0), (12, 1))),
           Package("flashinfer", why="gemm_fp8_nt_groupwise"))),
    AllOf((ComputeCapability(allowed=((9, 0),)), Package("flashinfer", ">=0.6.0", "fp8_blockscale_gemm_sm90"))),
))


class FlashInferBackend(Backend):
    name = "flashinfer"
    summary = "FlashInfer gemm_fp8_nt_groupwise (sm100/103/107 trtllm or cutlass, sm120/121 cutlass) or fp8_blockscale_gemm_sm90"
    requires: ClassVar[tuple[Probe, ...]] = (DeviceKind(("cuda",)), FLASHINFER_PATHS)
    block_sizes = (BLOCK_128x128,)
    implemented = False
    layout = "flashinfer"
