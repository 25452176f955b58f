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

A vendor's grouped GEMM between the launches (a MoE route on DeepGEMM or CUTLASS) is a call into another
library, not a Triton launch: :func:`vendor_call` runs it as a step of the record (the watch ignores the
torch ops it runs), with the tensors it takes. A replay calls it again on the new call's tensors: its inputs
and output as they are, the workspace's as views at their places (:class:`CallReplay`); what the step needs
besides (the weights, a per-key count) it holds itself. Everything a Triton launch of the call needed from
Python (routing sizes, grids, constexprs, its specialization key) is skipped as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .stream_scratch import run_with_buffer, run_with_workspace
from .triton_launch import REPLAYS_MAX, Recorded, Replay, Replays, workspace_places

__all__ = ["CallReplay", "CallReplays", "VendorCall", "vendor_call"]


class CallReplays:
    """The replays of one op's calls on ``device``, whose launches read ``static`` tensors besides a call's
    own: call it (``calls(key, inputs, out_shape, out_dtype, launch)``) to run a call, replayed where one is
    kept; or :meth:`run` a kept one and :meth:`call` a call that may be kept (see the module docstring)."""

    __slots__ = ("_device", "_replays", "_seen", "_static")

    def __init__(self, device: torch.device, static: Sequence[torch.Tensor]) -> None:
        self._device = device
        self._replays: Replays[CallReplay] = Replays(device)
        self._static = tuple(static)
        self._seen: set[Hashable] = set()

    def __call__(self, key: Hashable, inputs: Sequence[torch.Tensor], out_shape: tuple[int, ...],
                 out_dtype: torch.dtype, launch: Callable[[list[Recorded] | None], torch.Tensor]) -> torch.Tensor:
        """The output of a call on ``inputs``, ``launch(record)``'s: the replay kept under ``key`` where there is
        one and the inputs are ones it :meth:`takes`, else through :meth:`call` (``record`` None: not recorded)."""
        if not self.takes(*inputs):
            return launch(None)
        out = self.run(key, inputs, out_shape, out_dtype)
        return self.call(key, inputs, launch) if out is None else out

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
        stream = replays.stream(replay.device)
        if replay.launches is not None:
            run_with_workspace(replay.launches.run, (*(t.data_ptr() for t in inputs), out.data_ptr()), replay.nbytes,
                               self._device, stream)
        else:
            run_with_buffer(replay.run_steps, ((*inputs, out), stream), replay.nbytes, self._device, stream)
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
        own = (*inputs, out)
        scratch = watch.scratch(record, own, self._static) if watch.clean else None
        replays.put(key, None if scratch is None else
                    CallReplay.of(record, device=replays.current_device(), per_call=own, scratch=scratch,
                                  static=self._static))
        return out


class VendorCall:
    """A step of a recorded call that is a call into a vendor's library (:func:`vendor_call`): ``fn(*tensors)``."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., object]) -> None:
        self.fn = fn


class _Steps(threading.local):
    inside = False
    """Whether this thread is inside a :func:`vendor_call` step (steps do not nest): the watch ignores its torch ops."""


_IN_STEP = _Steps()


def vendor_call(record: list[Recorded] | None, fn: Callable[..., object], *tensors: torch.Tensor) -> None:
    """``fn(*tensors)``: a vendor's call (with any torch ops it needs) between a call's launches. With ``record``,
    appended to it as a step, which a replay runs again with the new call's tensors in place of ``tensors``: ``fn``
    takes every per-call tensor as an argument, and holds only what is fixed under the call's key besides (and
    makes no step of its own: a replay calls ``fn`` whole)."""
    if record is None:
        fn(*tensors)
        return
    record.append((VendorCall(fn), None, tensors))
    _IN_STEP.inside = True
    try:
        fn(*tensors)
    finally:
        _IN_STEP.inside = False


_CALL, _WORK, _STATIC = 0, 1, 2
"""Where a vendor step's tensor comes from at a replay: the call's own (by index), the workspace (a view:
dtype, size, stride, offset in elements), the op's (the tensor)."""


class CallReplay:
    """One kept call (:meth:`of`): its steps, runs of Triton launches and vendor steps between them, run by
    :meth:`run_steps` on the call's tensors and a workspace of :attr:`nbytes`. A call of launches only is one
    run, :attr:`launches` (None otherwise), which its caller runs with the call's addresses (the inputs', then
    the output's) and the workspace's."""

    __slots__ = ("_dtypes", "_steps", "device", "launches", "nbytes")

    def __init__(self, device: int, nbytes: int,
                 steps: tuple[Replay | tuple[Callable[..., object], tuple[tuple[Any, ...], ...]], ...]) -> None:
        self.device, self.nbytes, self._steps = device, nbytes, steps
        only = steps[0] if len(steps) == 1 else None
        self.launches = only if isinstance(only, Replay) else None
        self._dtypes = tuple({spec[1] for step in steps if not isinstance(step, Replay)
                              for spec in step[1] if spec[0] == _WORK})

    @classmethod
    def of(cls, recorded: Sequence[Recorded], *, device: int, per_call: Sequence[torch.Tensor],
           scratch: Sequence[torch.Tensor], static: Sequence[torch.Tensor]) -> CallReplay | None:
        """The replay of ``recorded`` (launches, and vendor steps between them), or None where nothing was recorded,
        a launch cannot be replayed (:meth:`.triton_launch.Replay.of`) or a vendor step took a tensor of none of
        the three kinds."""
        offsets, nbytes = workspace_places(scratch)
        where: dict[int, tuple[Any, ...]] = {id(t): (_CALL, i) for i, t in enumerate(per_call)}
        where.update((id(t), (_STATIC, t)) for t in static)
        steps: list[Replay | tuple[Callable[..., object], tuple[tuple[Any, ...], ...]]] = []
        run: list[Recorded] = []  # the launches since the last vendor step

        def launches_so_far() -> bool:
            """``run`` as one step (where it holds a launch); False where it cannot be replayed."""
            if run:
                launches = Replay.of(run, device=device, per_call=per_call, scratch=scratch, static=static)
                if launches is None:
                    return False
                steps.append(launches)
                run.clear()
            return True

        for kernel, grid, args in recorded:
            if not isinstance(kernel, VendorCall):
                run.append((kernel, grid, args))
                continue
            specs = tuple(where.get(id(t)) or _work_view(t, offsets.get(id(t))) for t in args)
            if None in specs or not launches_so_far():
                return None
            steps.append((kernel.fn, specs))  # type: ignore[arg-type]
        if not launches_so_far() or not steps:
            return None
        return cls(device, nbytes, tuple(steps))

    def run_steps(self, tensors: Sequence[torch.Tensor], stream: int, work: torch.Tensor | None) -> None:
        """Every step on the call's ``tensors`` (its inputs, then its output) and ``work`` (:attr:`nbytes` or more)."""
        addresses = (*[t.data_ptr() for t in tensors], 0 if work is None else work.data_ptr())
        typed = {} if work is None else {dtype: work.view(dtype) for dtype in self._dtypes}
        for step in self._steps:
            if isinstance(step, Replay):
                step.run(addresses, stream)
                continue
            fn, specs = step
            fn(*[tensors[spec[1]] if spec[0] == _CALL else spec[1] if spec[0] == _STATIC else
                 typed[spec[1]].as_strided(spec[2], spec[3], spec[4]) for spec in specs])


def _work_view(t: torch.Tensor, offset: int | None) -> tuple[Any, ...] | None:
    """Where a vendor step finds ``t``, a tensor at byte ``offset`` of the workspace: a view of it; None where
    ``t`` has no place there, or one its dtype cannot view."""
    if offset is None or offset % t.element_size():
        return None
    return (_WORK, t.dtype, tuple(t.shape), t.stride(), offset // t.element_size())


_ALLOCATING = ("empty.memory_format", "empty_strided.default")
_VIEWING = ("view.default", "view.dtype", "_unsafe_view.default", "as_strided.default", "transpose.int", "t.default",
            "slice.Tensor", "select.int", "unbind.int", "alias.default", "detach.default", "unsqueeze.default",
            "squeeze.dim", "expand.default", "permute.default", "reshape.default")


class _Watch(TorchDispatchMode):
    """The torch ops run while active, outside :func:`vendor_call` steps: the storages they allocated, and whether
    any did more than allocate or view."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated: set[int] = set()
        self.clean = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if _IN_STEP.inside:
            return out
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
