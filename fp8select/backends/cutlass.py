"""``cutlass``: sgl-kernel's CUTLASS ``fp8_blockwise_scaled_mm``."""

from __future__ import annotations

from typing import ClassVar

from fp8select.backends.base import BLOCK_128x128, Backend
from fp8select.probes import ComputeCapability, DeviceKind, Package, Probe


class CutlassBackend(Backend):
    name = "cutlass"
    summary = "sgl-kernel CUTLASS fp8_blockwise_scaled_mm (sm90, sm100)"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        ComputeCapability(allowed=((9, 0), (10, 0))),
        Package("sgl_kernel", why="fp8_blockwise_scaled_mm"),
    )
    block_sizes = (BLOCK_128x128,)
    n_multiple = 128
    k_multiple = 128
    implemented = False
    layout = "cutlass"
