"""Scratch memory that launch-bound calls reuse instead of allocating: one buffer per CUDA stream.

A replayed Triton layer call (:class:`~fp8select.kernels.triton_bound.BoundLinear`) writes its
quantized activation, its scales and any split-K partials to a workspace that no one reads after
the call's last kernel. Allocating it costs a few microseconds of host time per call (torch's
caching allocator, from Python), as much as a kernel launch. Kernels on one stream run in the
order they were launched, so every such call on a stream can use the same buffer: the next call's
first kernel runs after the previous call's last one.

:meth:`StreamScratch.take` hands the stream's buffer out and :meth:`StreamScratch.give` puts it
back. Taking removes it from the store in one dict operation, so a second thread calling on the
same stream meanwhile finds none and allocates its own: two calls never share one buffer between
their launches. Not used (None) inside a CUDA-graph capture, where a call's memory must be the
graph's own, nor for workspaces over :data:`SCRATCH_MAX_BYTES` (calls that large are not
launch-bound). The store holds at most one buffer of at most that size per stream and device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["SCRATCH", "SCRATCH_MAX_BYTES", "StreamScratch"]

SCRATCH_MAX_BYTES = 16 << 20
"""The largest workspace a stream's buffer serves (16 MiB: the quantized activation and split-K partials
of a few hundred rows); larger ones are allocated per call."""


class StreamScratch:
    """Reusable per-stream scratch buffers (uint8, CUDA): ``take`` one, launch, ``give`` it back."""

    __slots__ = ("_capturing", "_free")

    def __init__(self, capturing: Callable[[], bool] | None = None) -> None:
        self._free: dict[tuple[torch.device, int], torch.Tensor] = {}
        # Whether the current stream is capturing a CUDA graph (torch's binding: cheaper than its wrapper).
        if capturing is None:
            capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)
        self._capturing: Callable[[], bool] = capturing

    def take(self, nbytes: int, device: torch.device, stream: int) -> torch.Tensor | None:
        """A buffer of at least ``nbytes`` on ``device`` for launches on ``stream`` (the current one),
        or None where the caller must allocate its own (see the module docstring)."""
        if nbytes > SCRATCH_MAX_BYTES or self._capturing():
            return None
        buf = self._free.pop((device, stream), None)
        if buf is None or buf.numel() < nbytes:
            # Sizes round up to a power of two, so a stream's buffer grows a few times at most.
            buf = torch.empty(1 << max(nbytes - 1, 0).bit_length(), dtype=torch.uint8, device=device)
        return buf

    def give(self, buf: torch.Tensor, device: torch.device, stream: int) -> None:
        """Return ``buf`` (from :meth:`take`, its launches enqueued on ``stream``) for the stream's next call."""
        self._free[(device, stream)] = buf

    def clear(self) -> None:
        """Let every buffer go (to torch's caching allocator)."""
        self._free.clear()


SCRATCH = StreamScratch()
"""The process's store: every bound layer on a stream shares its buffer."""
