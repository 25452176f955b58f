"""``aiter``: AMD AITER ``gemm_a8w8_blockscale`` (CK kernels) on MI300/MI350."""

from __future__ import annotations

from typing import ClassVar

import torch

from fp8select.backends.base import BLOCK_128x128, Backend
from fp8select.capabilities import Capabilities
from fp8select.probes import DeviceKind, EnvFlag, GfxArch, Package, Probe

AITER_FLAG = "FP8SELECT_USE_AITER"


class AiterBackend(Backend):
    name = "aiter"
    summary = f"AITER gemm_a8w8_blockscale on gfx942 (e4m3fnuz) / gfx950; opt-in with {AITER_FLAG}=1"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("rocm",)),
        GfxArch(("gfx942", "gfx950")),
        Package("aiter"),
        EnvFlag(AITER_FLAG),
    )
    block_sizes = (BLOCK_128x128,)
    implemented = False
    layout = "aiter"

    def weight_dtype(self, caps: Capabilities) -> torch.dtype:
        return torch.float8_e4m3fnuz if caps.gfx_arch == "gfx942" else torch.float8_e4m3fn
