"""Triton launches that skip Triton's Python dispatcher once a kernel's specialization is known.

``kernel[grid](*args, **kw)`` binds every argument, works out how each one specializes the
kernel, hashes that into a cache key and checks the globals the kernel read before it
launches: most of a Triton launch's host time on an H200 host. A :class:`BoundKernel` is made
once (when a layer is prepared) with the kernel's constexprs and launch options. Its first
launch under a *specialization key* goes through Triton, which compiles or finds the kernel,
and keeps the compiled kernel; later launches under that key call the compiled kernel's
launcher directly, with the arguments Triton's dispatcher itself passes it.

The key is the caller's: whatever of its per-call arguments Triton could specialize differently
from one call to the next. What is fixed when the kernel is bound (the weight, its scales, the
tiles, the constexprs) cannot change it, nor can ints the kernel lists in ``do_not_specialize``;
what can is a tensor's dtype and 16-byte alignment (:func:`tensor_class`) and an int that may be
1 or a multiple of 16 (:func:`int_class`). The key also holds the current device, as Triton's
own cache does.

The direct launch is used where it was checked: Triton 3.4 or later, a compiled (not
interpreted) kernel. Elsewhere every launch goes through ``kernel[grid]``, as before.

:func:`launch` does the same for a launch site that holds no bound kernel of its own (the MoE op's
kernels): it keeps one :class:`BoundKernel` per kernel and constexprs in the process and keys it
by :func:`args_class`, what Triton specializes on in each argument.

A caller that makes the same launches call after call (a layer at one M) can go one step further:
record one call's launches (``record=`` a list) and make a :class:`Replay` of them. A replay keeps
each launch's arguments with every tensor turned into its address: the static ones (the weight,
its scales) fixed, the call's own (input, output) and its scratch tensors (the quantized
activation, split-K partials) filled in from the addresses the next call passes, the scratch
ones as offsets into one workspace. A launch then costs no ``data_ptr()`` calls, no driver
pointer queries and one allocation for all the scratch, instead of one per tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import triton
from packaging.version import Version

__all__ = ["LAUNCHES_MAX", "REPLAYS_MAX", "BoundKernel", "OnDevice", "Recorded", "Replay", "Replays", "args_class",
           "device_and_stream", "int_class", "launch", "tensor_class", "workspace_places"]

Recorded = tuple[Any, Any, tuple[Any, ...]]
"""One launch of a recorded call: ``(kernel, grid, args)``. ``kernel`` is the compiled kernel kept,
or None where the launch cannot be replayed (it went through Triton's dispatcher, or another
launcher: the Gluon kernels')."""

DIRECT_SINCE = (3, 4)
"""The first Triton release whose dispatcher passes the launcher every parameter's value (constexprs
included) and reads its launch hooks from ``triton.knobs``: the form the direct launch repeats."""


def int_class(value: int) -> int:
    """How Triton specializes a (specialized) int argument: 1, a multiple of 16, 64-bit (outside the 32-bit
    range, either side), or none of these."""
    return (value == 1) | (value % 16 == 0) << 1 | ((value > 0x7FFFFFFF) | (value < -0x80000000)) << 2


def tensor_class(t: Any) -> Hashable:
    """How Triton specializes a tensor argument (None: absent): its dtype and 16-byte alignment."""
    return None if t is None else (t.dtype, t.data_ptr() % 16 == 0)


def _direct_supported(fn: Any) -> bool:
    if type(fn).__name__ != "JITFunction" or Version(triton.__version__).release[:2] < DIRECT_SINCE:
        return False
    try:
        from triton import knobs  # noqa: F401
        from triton.runtime.driver import driver  # noqa: F401
    except ImportError:  # pragma: no cover - older triton
        return False
    return True


def device_and_stream() -> tuple[Any, Any]:
    """The current device and its current stream, as Triton's dispatcher asks for them: torch's own
    accessors where this torch has them (a microsecond less per launch than Triton's wrappers)."""
    import torch

    device = getattr(torch._C, "_cuda_getDevice", None)
    stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if device is not None and stream is not None:
        return device, stream
    from triton.runtime.driver import driver

    return driver.active.get_current_device, driver.active.get_current_stream


class _Direct:
    """One compiled kernel and what its launcher needs besides the call's arguments."""

    __slots__ = ("chain", "compiled", "function", "launcher", "metadata", "runtime", "tail")

    def __init__(self, compiled: Any, tail: tuple[Any, ...]) -> None:
        from triton import knobs

        if hasattr(compiled, "result"):  # an asynchronous compilation's future
            compiled = compiled.result()
        self.compiled = compiled
        self.launcher = compiled.run
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.runtime = knobs.runtime
        self.tail = tail
        # Triton 3.6 on keeps launch hooks in chains (``.calls``); earlier ones hold None or a hook.
        self.chain = getattr(knobs, "HookChain", None)

    def __call__(self, grid: tuple[int, int, int], args: Sequence[Any], stream: int) -> None:
        self.launch(grid, (*args, *self.tail), stream)

    def hooks(self) -> tuple[Any, Any] | None:
        """Triton's launch hooks (a profiler's), or None when there are none to call."""
        runtime = self.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        chain = self.chain
        if type(enter) is chain and type(leave) is chain and not enter.calls and not leave.calls:
            return None  # empty hook chains call nothing: the launcher skips None instead
        return None if enter is None and leave is None else (enter, leave)

    def launch(self, grid: tuple[int, int, int], values: Sequence[Any], stream: int) -> None:
        """Launch with every parameter's value (``values``: the positional arguments and :attr:`tail`)."""
        hooks = self.hooks()
        enter, leave = (None, None) if hooks is None else hooks
        metadata = None if enter is None else self.compiled.launch_metadata(grid, stream, *values)
        self.launcher(grid[0], grid[1], grid[2], stream, self.function, self.metadata, metadata, enter, leave, *values)


class BoundKernel:
    """``kernel`` with its constexprs and options bound: ``bound(grid, args, key)`` launches it.

    ``args`` are the kernel's leading positional parameters (every one that is not a constexpr,
    in order); ``constexprs`` the rest by name (parameters left out take their defaults);
    ``options`` Triton's launch options (``num_warps``, ``num_stages``, ``launch_pdl``).
    """

    __slots__ = ("_current", "_direct", "_fn", "_kwargs", "_launches", "_stream")

    def __init__(self, fn: Any, constexprs: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        self._fn = fn
        self._kwargs = {**constexprs, **options}
        self._launches: dict[Hashable, _Direct] = {}
        self._direct = _direct_supported(fn)
        if self._direct:
            self._current, self._stream = device_and_stream()

    def __call__(self, grid: tuple[int, int, int], args: tuple[Any, ...], key: Hashable = (),
                 record: list[Recorded] | None = None) -> None:
        """Launch; with ``record``, append what was launched (the compiled kernel kept, None where
        there is none: an interpreted kernel, an older Triton)."""
        launch = None
        if not self._direct:
            self._fn[grid](*args, **self._kwargs)
        else:
            device = self._current()
            full_key = (device, key)
            launch = self._launches.get(full_key)
            if launch is not None:
                launch(grid, args, self._stream(device))
            else:
                compiled = self._fn[grid](*args, **self._kwargs)
                if compiled is not None:
                    launch = self._launches[full_key] = _Direct(compiled, self._tail(len(args)))
        if record is not None:
            record.append((launch, grid, args))

    def compiled_for(self, grid: tuple[int, int, int], args: tuple[Any, ...], key: Hashable = ()) -> tuple[Any, Any]:
        """Launch through Triton's dispatcher and return ``(the kernel it ran, the kernel kept for key)``:
        for tests that check a key tells apart every kernel Triton would tell apart."""
        compiled = self._fn[grid](*args, **self._kwargs)
        kept = self._launches.get((self._current(), key)) if self._direct else None
        return compiled, None if kept is None else kept.compiled

    def _tail(self, positional: int) -> tuple[Any, ...]:
        """The values of the parameters after the positional ones, as the dispatcher passes them."""
        fn, kwargs = self._fn, self._kwargs
        names, params = fn.arg_names[positional:], fn.params[positional:]
        return tuple(kwargs[name] if name in kwargs else param.default for name, param in zip(names, params, strict=True))


def args_class(args: Sequence[Any]) -> tuple[Hashable, ...] | None:
    """How Triton specializes each of ``args`` (its non-constexpr arguments), as one key: a tensor's dtype and
    16-byte alignment (:func:`tensor_class`, written out here: a call fewer per tensor), an int's :func:`int_class`,
    a float's, bool's or None's type; None where an argument is of another kind (a tensor descriptor: its caller
    keys it)."""
    out: list[Hashable] = []
    for arg in args:
        kind = type(arg)
        if kind is int:
            out.append(int_class(arg))
        elif kind is float:
            out.append("fp32")
        elif kind is bool:
            out.append("i1")
        elif arg is None:
            out.append(None)
        elif hasattr(arg, "data_ptr"):
            out.append((arg.dtype, arg.data_ptr() % 16 == 0))
        else:
            return None
    return tuple(out)


LAUNCHES_MAX = 4096
"""How many kernels (each with its constexprs and launch options) :func:`launch` keeps bound in a process;
launches of others go through Triton's dispatcher."""

_BOUND: dict[Hashable, BoundKernel] = {}
""":func:`launch`'s bound kernels, by kernel, constexprs and launch options: process-wide, as Triton keeps
its compiled kernels."""


def launch(fn: Any, grid: tuple[int, ...], args: tuple[Any, ...], kwargs: Mapping[str, Any],
           record: list[Recorded] | None = None) -> None:
    """``fn[grid](*args, **kwargs)``: ``args`` every parameter that is not a constexpr, in order, ``kwargs`` the
    constexprs and Triton's launch options (hashable values). Through a :class:`BoundKernel` kept per kernel
    and ``kwargs`` and keyed by :func:`args_class`, so a launch goes through Triton's dispatcher only the first
    time its key is seen. With ``record``, append what was launched for a :class:`Replay`."""
    key = (fn, *kwargs.items())
    bound = _BOUND.get(key)
    if bound is None and len(_BOUND) < LAUNCHES_MAX:
        bound = _BOUND[key] = BoundKernel(fn, kwargs, {})
    if bound is not None and (spec := args_class(args)) is not None:
        x, y, z = (*grid, 1, 1)[:3]
        bound((x, y, z), args, spec, record)
        return
    fn[grid](*args, **kwargs)
    if record is not None:
        record.append((None, None, ()))  # not replayable


REPLAYS_MAX = 1024
"""How many calls (M, activation dtype) one bound linear or quantizer keeps a replay for, each a few
hundred bytes; calls beyond launch as a first call does."""

WORKSPACE_ALIGN = 256
"""Bytes each scratch tensor's place in a replay's workspace is aligned to (as torch's allocator aligns)."""


def workspace_places(scratch: Sequence[Any]) -> tuple[dict[int, int], int]:
    """Each of the ``scratch`` tensors' byte offset in one workspace, by ``id`` (tensors of one storage keep their
    places within it), and the workspace's bytes: the storages one after another, each :data:`WORKSPACE_ALIGN`-aligned."""
    offsets: dict[int, int] = {}
    places: dict[int, int] = {}
    nbytes = 0
    for t in scratch:
        storage = t.untyped_storage()
        start = storage.data_ptr()
        if start not in places:
            places[start] = nbytes
            nbytes += -(-storage.nbytes() // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        offsets[id(t)] = places[start] + t.data_ptr() - start
    return offsets, nbytes


class Replay:
    """A recorded call's launches, run again with new addresses: ``replay(addresses, stream)``.

    Made by :meth:`of`. ``addresses`` are the call's own tensors' addresses, in the order of
    ``per_call``, then the workspace's (``nbytes`` bytes, :data:`WORKSPACE_ALIGN`-aligned, unused
    when 0). The next call must match the recorded one in everything but those addresses (the
    same M, dtypes, strides and alignment), and run on ``device``: its caller keys replays so.
    """

    __slots__ = ("device", "nbytes", "run", "steps")

    def __init__(self, device: int, nbytes: int,
                 steps: tuple[tuple[_Direct, tuple[int, int, int], tuple[Any, ...], tuple[tuple[int, int, int], ...]], ...]) -> None:
        self.device, self.nbytes, self.steps = device, nbytes, steps
        self.run: Callable[[Sequence[int], int], None] = _launcher_calls(steps, self._hooked)
        """``run(addresses, stream)``: what calling the replay does, one Python frame less (for hot paths)."""

    @classmethod
    def of(cls, recorded: Sequence[Recorded], *, device: int, per_call: Sequence[Any], scratch: Sequence[Any],
           static: Sequence[Any]) -> Replay | None:
        """The replay of ``recorded``, or None when a launch cannot be replayed or an argument is
        neither a number nor None nor of the three kinds: ``per_call`` tensors (their addresses are
        passed to each replay), ``scratch`` tensors (given a place in the workspace) and ``static``
        ones (tensors, kept as their addresses, and tensor descriptors, kept as they are: both must
        live as long as the replay)."""
        import torch

        if not recorded:
            return None
        slots = {id(t): (i, 0) for i, t in enumerate(per_call)}
        offsets, nbytes = workspace_places(scratch)
        slots.update((key, (len(per_call), offset)) for key, offset in offsets.items())
        fixed = {id(t): t.data_ptr() if isinstance(t, torch.Tensor) else t for t in static}
        steps = []
        for kernel, grid, args in recorded:
            if kernel is None or grid is None:
                return None
            template: list[Any] = []
            subs = []
            for pos, arg in enumerate(args):
                if id(arg) in slots:
                    subs.append((pos, *slots[id(arg)]))
                    arg = None
                elif id(arg) in fixed:
                    arg = fixed[id(arg)]
                elif not (arg is None or isinstance(arg, (int, float))):  # a tensor or descriptor of no known kind
                    return None
                template.append(arg)
            steps.append((kernel, grid, (*template, *kernel.tail), tuple(subs)))
        return cls(device, nbytes, tuple(steps))

    def __call__(self, addresses: Sequence[int], stream: int) -> None:
        """Launch every step with ``addresses`` filled in: the compiled kernels' launchers called
        directly, unless launch hooks (a profiler's) are set, which each launch then calls."""
        self.run(addresses, stream)

    def _hooked(self, addresses: Sequence[int], stream: int) -> None:
        """:meth:`__call__` while launch hooks are set: each launch through :meth:`_Direct.launch`, which calls them."""
        for kernel, grid, values in self.launches(addresses):
            kernel.launch(grid, values, stream)

    def launches(self, addresses: Sequence[int]) -> list[tuple[_Direct, tuple[int, int, int], list[Any]]]:
        """Each step's ``(kernel, grid, values)`` with ``addresses`` filled in: every value its launcher takes."""
        out = []
        for kernel, grid, template, subs in self.steps:
            values = list(template)
            for pos, base, offset in subs:
                values[pos] = addresses[base] + offset
            out.append((kernel, grid, values))
        return out


class OnDevice(Protocol):
    """What :class:`Replays` keeps: something recorded on one CUDA device (its index)."""

    @property
    def device(self) -> int: ...


R = TypeVar("R", bound=OnDevice)


class Replays(Generic[R]):
    """The replays of one bound call (a linear, a quantizer: :class:`Replay`; a whole op's:
    :class:`~.call_replay.CallReplay`), by the key that fixes its launches (M, dtypes): ``replays.get(key)``
    the replay to run on the current device, ``replays.stream(device)`` the stream to run it on. Kept on
    CUDA only, for inputs :meth:`takes`, and at most :data:`REPLAYS_MAX` of them."""

    __slots__ = ("_by_key", "_current", "stream")

    def __init__(self, device: Any) -> None:
        self._by_key: dict[Hashable, R | None] = {}
        self._current: Any = None  # the current device's index and stream (CUDA); None: nothing replays
        self.stream: Any = None
        if device.type == "cuda":
            self._current, self.stream = device_and_stream()

    def takes(self, x: Any) -> bool:
        """Whether a call on ``x`` may replay (or record) its launches: on CUDA, contiguous, 16-byte aligned."""
        return self._current is not None and x.is_contiguous() and not x.data_ptr() % 16

    def get(self, key: Hashable) -> R | None:
        """The replay recorded under ``key``, if it runs on the current device."""
        replay = self._by_key.get(key)
        return replay if replay is not None and replay.device == self._current() else None

    def recording(self) -> list[Recorded] | None:
        """A list to record a call's launches into, or None once :data:`REPLAYS_MAX` keys are kept."""
        return [] if len(self._by_key) < REPLAYS_MAX else None

    def current_device(self) -> int:
        """The current CUDA device's index (only where replays are kept: :meth:`takes`)."""
        return int(self._current())

    def put(self, key: Hashable, replay: R | None) -> None:
        """Keep ``replay`` under ``key`` (None: a call under ``key`` cannot be replayed)."""
        self._by_key[key] = replay

    def keep(self: Replays[Replay], key: Hashable, recorded: Sequence[Recorded], *, per_call: Sequence[Any],
             scratch: Sequence[Any], static: Sequence[Any]) -> None:
        """Keep the replay of ``recorded`` under ``key`` (None where it cannot be replayed: :meth:`Replay.of`)."""
        self.put(key, Replay.of(recorded, device=self.current_device(), per_call=per_call, scratch=scratch,
                                static=static))

    def __getitem__(self, key: Hashable) -> R | None:
        """What was kept under ``key``: its replay, or None for a call that cannot be replayed."""
        return self._by_key[key]

    def __contains__(self, key: Hashable) -> bool:
        """Whether a call under ``key`` was kept (its replay, or None: it cannot be replayed)."""
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)


def _launcher_calls(steps: Sequence[tuple[Any, tuple[int, int, int], tuple[Any, ...], tuple[tuple[int, int, int], ...]]],
                    hooked: Callable[[Sequence[int], int], None]) -> Callable[[Sequence[int], int], None]:
    """One function ``(addresses, stream)`` that calls every step's compiled launcher in turn, each
    value written into its call: the recorded ones by name, the call's addresses as
    ``addresses[i] + offset``. Generated once per replay (as Triton generates its own launchers): a
    replay then costs one Python frame and the launcher calls, not a list filled per step. While
    Triton's launch hooks are set (a profiler's: what :meth:`_Direct.hooks` reads, here inline) it
    calls ``hooked`` instead."""
    first = steps[0][0]
    namespace: dict[str, Any] = {"runtime": first.runtime, "chain": first.chain, "hooked": hooked}
    lines = ["def launch_all(addresses, stream):",
             "    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook",
             "    if (enter is not None or leave is not None) and not (type(enter) is chain and type(leave) is chain",
             "                                                          and not enter.calls and not leave.calls):",
             "        return hooked(addresses, stream)"]
    for i, (kernel, grid, template, subs) in enumerate(steps):
        at = {pos: (base, offset) for pos, base, offset in subs}
        values = []
        for pos, value in enumerate(template):
            if pos in at:
                values.append(f"addresses[{at[pos][0]}] + {int(at[pos][1])}")
            else:
                namespace[f"v{i}_{pos}"] = value
                values.append(f"v{i}_{pos}")
        namespace.update({f"launcher{i}": kernel.launcher, f"function{i}": kernel.function,
                          f"metadata{i}": kernel.metadata})
        x, y, z = (int(g) for g in grid)
        lines.append(f"    launcher{i}({x}, {y}, {z}, stream, function{i}, metadata{i}, None, None, None, "
                     f"{', '.join(values)})")
    exec("\n".join(lines), namespace)  # the source holds ints and generated names only
    launch_all: Callable[[Sequence[int], int], None] = namespace["launch_all"]
    return launch_all
