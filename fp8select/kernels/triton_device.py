"""What fp8select's Triton GEMMs need to know of a device, found once: whether a tensor can back a TMA
descriptor, how many programs a persistent launch takes, whether the Gluon ``wgmma`` kernel runs,
and the split-K counters (a layer's own, made at load time, or the per-device, per-stream ones for
callers that pass none)."""

from __future__ import annotations

import functools

import torch
import triton
from packaging.version import Version

try:  # host-side TMA descriptors (triton >= 3.4); without them the TMA configs use pointer loads
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None  # type: ignore[assignment,misc]

from .stream_scratch import cudagraph_tree_stream
from .triton_config import TritonConfig
from .triton_gemm_kernels import _w8a8_block_kernel

__all__ = ["FIXUP_TILES_PER_N", "WGMMA_TRITON", "fixup_counters", "sm_count", "wgmma_runs"]

_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}

FIXUP_TILES_PER_N = 1
"""Counters :func:`fixup_counters` gives a layer per output feature: ``ceil(512/16) * ceil(N/32)``
tiles, i.e. every split-K launch of up to 512 rows with tiles of at least 16 x 32 (the tuned and
heuristic split-K configurations all are: split-K is for small M)."""


def fixup_counters(n: int, device: torch.device | str) -> torch.Tensor:
    """Zeroed int32 split-K counters for one layer of ``n`` output features, made at load time.

    A layer that owns its counters never allocates one in a call, so nothing allocated during
    a call outlives it (Inductor's CUDA-graph trees reject a call that leaves memory of its
    graph pool alive). Launches leave their counters at zero, so one buffer serves every call
    of the layer that runs in stream order; one layer run on two streams at once needs two
    layers. A launch that needs more counters sums its partials in a second kernel instead.
    """
    return torch.zeros(32 * triton.cdiv(n, 32) * FIXUP_TILES_PER_N, dtype=torch.int32, device=device)


def _fixup_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters (at least ``count``) for ``FIXUP`` split-K on ``device``, for callers
    that pass none (the layer passes its own, :func:`fixup_counters`).

    One buffer per device and stream, so launches that may run concurrently never share
    counters; launches on one stream run in order, and each leaves its counters at zero. The
    buffer is made at the first such call on a stream (inside a CUDA-graph capture: in the
    graph's memory), except on the stream of ``torch.compile``'s CUDA graphs, whose warm-up
    puts every allocation in the graphs' pool, where a kept buffer is refused
    (:func:`~fp8select.kernels.stream_scratch.cudagraph_tree_stream`): there each call gets
    zeroed counters of its own.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(1024, triton.next_power_of_2(count)), dtype=torch.int32, device=device)
        if not cudagraph_tree_stream(device, stream):
            _COUNTERS[key] = buf
    return buf


def _tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D fp8 tensor can back a TMA descriptor: contiguous rows, 16-byte aligned
    base and row stride, at least one row and column (else the pointer loads are used)."""
    return (
        TensorDescriptor is not None
        and t.stride(1) == 1
        and t.data_ptr() % 16 == 0
        and (t.stride(0) * t.element_size()) % 16 == 0
        and min(t.shape) > 0
    )


def _persistent_programs(cfg: TritonConfig, device: torch.device, tiles: int) -> int:
    """Programs of a persistent launch: ``PERSISTENT`` per SM (one SM on the CPU interpreter, so
    its tests loop over tiles), at most one per tile; 0 where it does not run (off CUDA)."""
    if device.type == "cpu":
        sms = 1
    elif device.type == "cuda":
        sms = sm_count(device)
    else:
        return 0
    return min(tiles, cfg.PERSISTENT * sms)


def sm_count(device: torch.device) -> int:
    """The SMs of a CUDA ``device`` (cached per device)."""
    return _sm_count(_cuda_index(device))


def _cuda_index(device: torch.device) -> int:
    """The index of a CUDA ``device`` (the current device for a bare ``cuda``): the per-device caches' key."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


WGMMA_TRITON = ((3, 6), (3, 10))
"""Triton releases ``[from, to)`` whose Gluon the ``wgmma`` kernel is written for: compiled and
timed with 3.6 on the H200, compiled for sm90 with 3.9. Gluon is experimental and its API changes
between releases, so a release outside these runs the ``gemm`` path instead of failing in the
forward pass; widen it once a release is checked (``tests/test_gluon_gemm.py`` compiles it)."""


def wgmma_runs(device: torch.device) -> bool:
    """Whether the ``wgmma`` path runs its own kernel (:mod:`.gluon_gemm`) on ``device``: compiled,
    not interpreted, for a CUDA GPU of compute capability 9.x, with a Triton of
    :data:`WGMMA_TRITON`. Elsewhere that path runs the tile kernel with the same tiles."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    if type(_w8a8_block_kernel).__name__ == "InterpretedFunction":
        return False
    return _wgmma_device(_cuda_index(device))


@functools.cache
def _wgmma_device(index: int) -> bool:
    low, high = WGMMA_TRITON
    if torch.cuda.get_device_capability(index)[0] != 9 or not low <= Version(triton.__version__).release[:2] < high:
        return False
    try:
        from . import gluon_gemm  # noqa: F401 - Gluon's Hopper API importable
    except ImportError:
        return False
    return True
