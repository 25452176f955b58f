"""A whole op's call replayed: its Triton launches recorded once per key, then run again with new addresses.

The dense linear replays its quantizer and GEMM (:class:`.triton_bound.BoundLinear`). An op of several
launches with buffers between them (the MoE experts: routing, quantization, two grouped GEMMs, the
weighted sum) is replayed whole by :class:`CallReplays`, keyed by what fixes every launch (M, dtypes,
the launch configuration). The first call under a key runs as usual (it compiles kernels and builds what
the op makes on first use); the second runs with each launch appended to a record while a torch dispatch
mode watches the torch ops it runs. The record is kept only if those ops allocate or view and nothing
else (a torch op between launches computes something a replay would skip), and if every tensor a launch
took is one of the call's inputs, its output (their addresses passed per call), one of the op's own
long-lived tensors (``static``: the weights, kept as addresses) or memory the call allocated (each given a
place in one workspace). Later calls under the key allocate their output, take the workspace from the
stream's scratch buffer (:mod:`.stream_scratch`) and run the launches
(:class:`~.triton_launch.Replay`): none of Triton's dispatcher, no allocation but the output's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .stream_scratch import run_with_workspace
from .triton_launch import REPLAYS_MAX, Recorded, Replays

__all__ = ["CallReplays"]


class CallReplays:
    """The replays of one op's calls on ``device``, whose launches read ``static`` tensors besides a call's
    own: :meth:`run` a kept one, :meth:`call` to run a call that may be kept (see the module docstring)."""

    __slots__ = ("_device", "_replays", "_seen", "_static")

    def __init__(self, device: torch.device, static: Sequence[torch.Tensor]) -> None:
        self._device = device
        self._replays = Replays(device)
        self._static = tuple(static)
        self._seen: set[Hashable] = set()

    def takes(self, *tensors: torch.Tensor) -> bool:
        """Whether a call on ``tensors`` (its inputs) may be replayed: on CUDA, each contiguous and 16-byte aligned."""
        takes = self._replays.takes
        return all(takes(t) for t in tensors)

    def run(self, key: Hashable, inputs: Sequence[torch.Tensor], out_shape: tuple[int, ...],
            out_dtype: torch.dtype) -> torch.Tensor | None:
        """The output of the replay kept under ``key`` run on ``inputs`` (which :meth:`takes`), or None where none is."""
        replays = self._replays
        replay = replays.get(key)
        if replay is None:
            return None
        out = torch.empty(out_shape, dtype=out_dtype, device=self._device)
        run_with_workspace(replay.run, (*(t.data_ptr() for t in inputs), out.data_ptr()), replay.nbytes, self._device,
                           replays.stream(replay.device))
        return out

    def call(self, key: Hashable, inputs: Sequence[torch.Tensor],
             launch: Callable[[list[Recorded] | None], torch.Tensor]) -> torch.Tensor:
        """``launch(record)``'s output: ``record`` None on the first call under ``key``, a list to record into
        on the second (then kept, or None kept where it cannot be replayed), None after."""
        replays = self._replays
        if key in replays or key not in self._seen:
            if key not in replays and len(self._seen) < REPLAYS_MAX:
                self._seen.add(key)
            return launch(None)
        record = replays.recording()
        if record is None:
            return launch(None)
        with _Watch() as watch:
            out = launch(record)
        self._seen.discard(key)
        scratch = watch.scratch(record, (*inputs, out), self._static) if watch.clean else None
        if scratch is None:
            record = []  # nothing replays this key
        replays.keep(key, record, per_call=(*inputs, out), scratch=scratch or (), static=self._static)
        return out


_ALLOCATING = ("empty.memory_format", "empty_strided.default")
_VIEWING = ("view.default", "view.dtype", "_unsafe_view.default", "as_strided.default", "transpose.int", "t.default",
            "slice.Tensor", "select.int", "unbind.int", "alias.default", "detach.default", "unsqueeze.default",
            "squeeze.dim", "expand.default", "permute.default", "reshape.default")


class _Watch(TorchDispatchMode):
    """The torch ops run while active: the storages they allocated, and whether any did more than allocate or view."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated: set[int] = set()
        self.clean = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__
        if name in _ALLOCATING:
            self.allocated.add(out.untyped_storage().data_ptr())
        elif name not in _VIEWING:
            self.clean = False
        return out

    def scratch(self, record: Sequence[Recorded], own: Sequence[torch.Tensor],
                static: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The tensors the launches took that the call allocated, besides ``own`` (its inputs, then its output);
        None if one of them is none of these nor ``static``, or shares the output's memory."""
        known = {id(t) for t in (*own, *static)}
        out_storage = own[-1].untyped_storage().data_ptr()
        found = []
        for _, _, args in record:
            for arg in args:
                if not isinstance(arg, torch.Tensor) or id(arg) in known:
                    continue
                storage = arg.untyped_storage().data_ptr()
                if storage not in self.allocated or storage == out_storage:
                    return None
                known.add(id(arg))
                found.append(arg)
        return found
