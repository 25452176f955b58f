"""``deepgemm``: DeepSeek's DeepGEMM ``fp8_gemm_nt`` on sm90 / sm100."""

from __future__ import annotations

from typing import ClassVar

import torch

from fp8select.backends.base import BLOCK_128x128, Backend
from fp8select.probes import AllOf, AnyOf, ComputeCapability, DeviceKind, Package, Probe, ToolkitVersion


class DeepGemmBackend(Backend):
    name = "deepgemm"
    summary = "DeepGEMM fp8_gemm_nt (JIT CUDA kernels), sm90 and sm100 only"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        AnyOf((
            AllOf((ComputeCapability(allowed=((9, 0),)), ToolkitVersion("cuda", ">=12.3", "DeepGEMM sm90"))),
            AllOf((ComputeCapability(allowed=((10, 0),)), ToolkitVersion("cuda", ">=12.9", "DeepGEMM sm100"))),
        )),
        Package("deep_gemm"),
    )
    block_sizes = (BLOCK_128x128,)
    out_dtypes = (torch.bfloat16,)
    n_multiple = 64
    k_multiple = 128
    implemented = False
    layout = "deepgemm"
