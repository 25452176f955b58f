"""The built-in backends and the default priority order (data, not branches)."""

from __future__ import annotations

from fp8select.backends.aiter import AiterBackend
from fp8select.backends.base import NOT_IMPLEMENTED, Backend, PreparedWeight
from fp8select.backends.cutlass import CutlassBackend
from fp8select.backends.deepgemm import DeepGemmBackend
from fp8select.backends.flashinfer import FlashInferBackend
from fp8select.backends.npu import NpuBackend
from fp8select.backends.reference import ReferenceBackend
from fp8select.backends.scaled_mm import CudaScaledMMBackend, XpuScaledMMBackend
from fp8select.backends.triton import TritonBackend

BUILTIN_BACKENDS: tuple[type[Backend], ...] = (
    DeepGemmBackend,
    FlashInferBackend,
    CutlassBackend,
    AiterBackend,
    NpuBackend,
    XpuScaledMMBackend,
    CudaScaledMMBackend,
    TritonBackend,
    ReferenceBackend,
)

# The default priority order: vendor kernels first, torch's own next, our Triton kernel, then
# the pure-torch reference that runs anywhere. Data, not branches.
DEFAULT_ORDER: tuple[str, ...] = (
    "deepgemm",
    "flashinfer",
    "cutlass",
    "aiter",
    "npu",
    "xpu-scaled-mm",
    "cuda-scaled-mm",
    "triton",
    "reference",
)

__all__ = ["BUILTIN_BACKENDS", "DEFAULT_ORDER", "NOT_IMPLEMENTED", "Backend", "PreparedWeight"]
