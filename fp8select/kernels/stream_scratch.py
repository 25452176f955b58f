"""Scratch memory that launch-bound calls reuse instead of allocating: one buffer per CUDA stream.

A replayed Triton layer call (:class:`~fp8select.kernels.triton_bound.BoundLinear`) writes its
quantized activation, its scales and any split-K partials to a workspace that no one reads after
the call's last kernel (a replayed MoE call, :class:`~fp8select.kernels.call_replay.CallReplays`, its
routing and intermediate rows); both run their replays through :func:`run_with_workspace` (a MoE call with
a vendor's GEMMs between its launches through :func:`run_with_buffer`, which hands out the tensor). Allocating
it costs a few microseconds of host time per call (torch's caching allocator, from Python), as much as
a kernel launch. Kernels on one stream run in the
order they were launched, so every such call on a stream can use the same buffer: the next call's
first kernel runs after the previous call's last one.

:meth:`StreamScratch.take` hands the stream's buffer out and :meth:`StreamScratch.give` puts it
back. Taking removes it from the store in one dict operation, so a second thread calling on the
same stream meanwhile finds none and allocates its own: two calls never share one buffer between
their launches. Not used (None) inside a CUDA-graph capture, where a call's memory must be the
graph's own, nor for workspaces over :data:`SCRATCH_MAX_BYTES` (calls that large are not
launch-bound). The store holds at most one buffer of at most that size per stream and device.

Nor is a buffer made where the thread's allocations may go to a CUDA-graph pool without a capture:
``torch.compile``'s CUDA graphs (``mode="reduce-overhead"``) first run a compiled graph eagerly on
their tree's own stream with every allocation in the graphs' private pool, and a buffer kept from
there is a live tensor in that pool, which the trees refuse ("tensor(s) in the cudagraph pool not
tracked as outputs"). :func:`cudagraph_tree_stream` says so for a stream; asked only when a buffer
would be made, so a call that finds its stream's buffer pays nothing for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import torch

__all__ = ["SCRATCH", "SCRATCH_MAX_BYTES", "StreamScratch", "cudagraph_tree_stream", "run_with_buffer",
           "run_with_workspace"]

SCRATCH_MAX_BYTES = 16 << 20
"""The largest workspace a stream's buffer serves (16 MiB: the quantized activation and split-K partials
of a few hundred rows); larger ones are allocated per call."""


class StreamScratch:
    """Reusable per-stream scratch buffers (uint8, CUDA): ``take`` one, launch, ``give`` it back."""

    __slots__ = ("_capturing", "_free", "_pooled")

    def __init__(self, capturing: Callable[[], bool] | None = None,
                 pooled: Callable[[torch.device, int], bool] | None = None) -> None:
        self._free: dict[tuple[torch.device, int], torch.Tensor] = {}
        # Whether the current stream is capturing a CUDA graph (torch's binding: cheaper than its wrapper).
        if capturing is None:
            capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)
        self._capturing: Callable[[], bool] = capturing
        # (device, stream) -> whether a buffer made now may land in a CUDA-graph pool (module docstring)
        self._pooled = cudagraph_tree_stream if pooled is None else pooled

    def take(self, nbytes: int, device: torch.device, stream: int) -> torch.Tensor | None:
        """A buffer of at least ``nbytes`` on ``device`` for launches on ``stream`` (the current one),
        or None where the caller must allocate its own (see the module docstring)."""
        if nbytes > SCRATCH_MAX_BYTES or self._capturing():
            return None
        buf = self._free.pop((device, stream), None)
        if buf is None or buf.numel() < nbytes:
            if self._pooled(device, stream):
                if buf is not None:
                    self._free[(device, stream)] = buf
                return None
            # Sizes round up to a power of two, so a stream's buffer grows a few times at most.
            buf = torch.empty(1 << max(nbytes - 1, 0).bit_length(), dtype=torch.uint8, device=device)
        return buf

    def give(self, buf: torch.Tensor, device: torch.device, stream: int) -> None:
        """Return ``buf`` (from :meth:`take`, its launches enqueued on ``stream``) for the stream's next call."""
        self._free[(device, stream)] = buf

    def clear(self) -> None:
        """Let every buffer go (to torch's caching allocator)."""
        self._free.clear()


def cudagraph_tree_stream(device: torch.device, stream: int) -> bool:
    """Whether ``stream`` (a raw CUDA stream) is the stream of ``torch.compile``'s CUDA-graph tree on ``device``
    in this thread, where its warm-up runs with the thread's allocations in the graphs' pool (module
    docstring). False where torch.compile's CUDA graphs were never loaded; True where their state cannot be
    read (a torch whose internals differ): a call then allocates its own workspace, as without the store."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None or device.type != "cuda":
        return False
    try:
        manager = trees.get_manager(device.index if device.index is not None else torch.cuda.current_device(),
                                    create_if_none_exists=False)
        return manager is not None and int(manager.stream.cuda_stream) == stream
    except Exception:  # noqa: BLE001 - torch's private API moved: do not keep buffers
        return True


SCRATCH = StreamScratch()
"""The process's store: every bound layer on a stream shares its buffer."""


def run_with_workspace(run: Callable[[Sequence[int], int], None], addresses: tuple[int, ...], nbytes: int,
                       device: torch.device, stream: int) -> None:
    """``run((*addresses, workspace), stream)`` (a replay's launches) with the address of a workspace of ``nbytes``
    bytes: the stream's buffer where :data:`SCRATCH` serves one, else one allocated for the call; 0 for none."""
    if not nbytes:
        run((*addresses, 0), stream)
    elif (work := SCRATCH.take(nbytes, device, stream)) is not None:
        run((*addresses, work.data_ptr()), stream)
        SCRATCH.give(work, device, stream)
    else:
        work = torch.empty(nbytes, dtype=torch.uint8, device=device)
        run((*addresses, work.data_ptr()), stream)


def run_with_buffer(run: Callable[..., None], args: tuple[object, ...], nbytes: int, device: torch.device,
                    stream: int) -> None:
    """``run(*args, workspace)`` with a uint8 workspace tensor of at least ``nbytes`` bytes (None for 0), for a
    replay whose steps need the tensor, not only its address (:class:`~.call_replay.CallReplay`): as
    :func:`run_with_workspace` finds one."""
    if not nbytes:
        run(*args, None)
    elif (work := SCRATCH.take(nbytes, device, stream)) is not None:
        run(*args, work)
        SCRATCH.give(work, device, stream)
    else:
        run(*args, torch.empty(nbytes, dtype=torch.uint8, device=device))
