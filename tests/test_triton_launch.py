"""The specialization key's parts, and that an interpreted kernel always goes through Triton."""

from __future__ import annotations

import types

import pytest
import torch

triton_launch = pytest.importorskip("fp8select.kernels.triton_launch")


@pytest.mark.parametrize(("value", "one", "sixteen", "wide"), [
    (1, True, False, False), (0, False, True, False), (16, False, True, False), (48, False, True, False),
    (17, False, False, False), (2**31, False, True, True), (2**31 + 1, False, False, True),
    (-(2**31), False, True, False), (-(2**31) - 1, False, False, True)])
def test_int_class_tells_apart_what_triton_specializes(value: int, one: bool, sixteen: bool, wide: bool) -> None:
    klass = triton_launch.int_class(value)
    assert (bool(klass & 1), bool(klass & 2), bool(klass & 4)) == (one, sixteen, wide)


def test_tensor_class_is_dtype_and_alignment() -> None:
    flat = torch.zeros(64, dtype=torch.bfloat16)
    assert triton_launch.tensor_class(None) is None
    assert triton_launch.tensor_class(flat) == (torch.bfloat16, True)
    assert triton_launch.tensor_class(flat[1:]) == (torch.bfloat16, False)  # 2 bytes past an aligned base


def test_only_a_compiled_kernel_launches_directly() -> None:
    """Triton's interpreter (and anything but a JIT function) always goes through ``kernel[grid]``."""
    launched: list[tuple[object, ...]] = []

    class InterpretedFunction:  # the interpreter's kernel type, by name
        def __getitem__(self, grid: object) -> object:
            return lambda *args, **kwargs: launched.append((grid, args, tuple(sorted(kwargs))))

    bound = triton_launch.BoundKernel(InterpretedFunction(), {"BLOCK": 16}, {"num_warps": 4})
    assert not bound._direct
    bound((2, 1, 1), ("x",), key=("anything",))
    bound((2, 1, 1), ("x",), key=("anything",))
    assert launched == [((2, 1, 1), ("x",), ("BLOCK", "num_warps"))] * 2


class _Chain:
    """Triton 3.6's hook chain: calls nothing while ``calls`` is empty."""

    def __init__(self, calls: list[object]) -> None:
        self.calls = calls


class _Kernel:
    """A compiled kernel's stand-in (``_Direct``'s attributes): keeps what each launch passed. ``runtime``
    holds Triton's launch hooks: ``hooked`` sets them, as chains (Triton 3.6 on) or plain (``chain=None``,
    earlier Triton, where no hook is None)."""

    function, metadata, tail = "function", "metadata", ("constexpr",)

    def __init__(self, hooked: bool = False, chain: type | None = _Chain) -> None:
        self.calls: list[tuple[object, list[object], int]] = []
        self.hooked = hooked
        self.chain = chain
        hook = (chain(["profiler"]) if chain else "profiler") if hooked else (chain([]) if chain else None)
        self.runtime = types.SimpleNamespace(launch_enter_hook=hook, launch_exit_hook=hook)

    def hooks(self) -> tuple[object, object] | None:
        return ("enter", "leave") if self.hooked else None

    def launcher(self, x: int, y: int, z: int, stream: int, function: str, metadata: str, launch_metadata: object,
                 enter: object, leave: object, *values: object) -> None:
        assert (function, metadata, launch_metadata, enter, leave) == ("function", "metadata", None, None, None)
        self.calls.append(((x, y, z), list(values), stream))

    def launch(self, grid: tuple[int, int, int], values: list[object], stream: int) -> None:
        self.calls.append((grid, [*values, "hooked"], stream))


def test_a_replay_fills_in_each_calls_addresses_and_keeps_the_rest() -> None:
    x, out, weight = torch.zeros(4, 8), torch.zeros(4, 2), torch.zeros(2, 8)
    q = torch.zeros(40, dtype=torch.uint8)  # 40 bytes: its place in the workspace takes 256
    partials = torch.zeros(3, 4, 2)
    second = partials[1]  # a view shares its storage's place
    descriptor = object()  # a static tensor descriptor passes as it is
    quant, gemm = _Kernel(), _Kernel()
    recorded = [(quant, (1, 1, 1), (x, q, 4, 8, 1.5)),
                (gemm, (2, 3, 1), (q, weight, descriptor, out, second, partials, None, 7))]
    replay = triton_launch.Replay.of(recorded, device=0, per_call=(x, out), scratch=(q, partials, second),
                                     static=(weight, descriptor))
    assert replay is not None and replay.device == 0
    assert replay.nbytes == 256 + 256  # each scratch storage in its own aligned place
    replay((1000, 5000, 90000), stream=42)
    assert quant.calls == [((1, 1, 1), [1000, 90000, 4, 8, 1.5, "constexpr"], 42)]
    row = 4 * 2 * 4  # the view starts one [4, 2] fp32 slab into its storage
    assert gemm.calls == [((2, 3, 1), [90000, weight.data_ptr(), descriptor, 5000, 90000 + 256 + row, 90000 + 256,
                                       None, 7, "constexpr"], 42)]


@pytest.mark.parametrize("chain", [_Chain, None], ids=["hook chains", "plain hooks"])
def test_a_replay_calls_launch_hooks_where_they_are_set(chain: type | None) -> None:
    """A profiler's launch hooks: each launch goes through the kernel's own launch, which calls them;
    set after the replay was made, they are seen at the next replay, and so is their removal."""
    x, out = torch.zeros(2, 2), torch.zeros(2, 2)
    kernel = _Kernel(hooked=True, chain=chain)
    replay = triton_launch.Replay.of([(kernel, (1, 1, 1), (x, out, 3))], device=0, per_call=(x, out), scratch=(),
                                     static=())
    assert replay is not None
    replay((10, 20, 0), stream=5)
    assert kernel.calls == [((1, 1, 1), [10, 20, 3, "constexpr", "hooked"], 5)]
    kernel.runtime.launch_enter_hook = kernel.runtime.launch_exit_hook = chain([]) if chain else None
    replay.run((11, 21, 0), 6)
    assert kernel.calls[-1] == ((1, 1, 1), [11, 21, 3, "constexpr"], 6)
    kernel.runtime.launch_exit_hook = chain(["profiler"]) if chain else "profiler"
    replay.run((12, 22, 0), 7)
    assert kernel.calls[-1] == ((1, 1, 1), [12, 22, 3, "constexpr", "hooked"], 7)


@pytest.mark.parametrize("case", ["unknown tensor", "not replayable", "nothing recorded"])
def test_a_call_that_cannot_be_replayed_has_no_replay(case: str) -> None:
    x, out, stray = torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2)
    recorded: list[tuple[object, object, tuple[object, ...]]] = {
        "unknown tensor": [(_Kernel(), (1, 1, 1), (x, out, stray))],  # e.g. a buffer shared between calls
        "not replayable": [(_Kernel(), (1, 1, 1), (x, out)), (None, None, ())],  # e.g. a Gluon launch
        "nothing recorded": [],
    }[case]
    assert triton_launch.Replay.of(recorded, device=0, per_call=(x, out), scratch=(), static=()) is None


def test_replays_are_kept_on_cuda_only_for_inputs_they_can_take_and_within_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store of a bound call's replays: nothing on a CPU; on CUDA contiguous 16-byte-aligned inputs, the
    replay of the current device, None kept for a call that cannot be replayed, and no recording past the bound."""
    assert not triton_launch.Replays(torch.device("cpu")).takes(torch.zeros(4))
    device = [0]
    monkeypatch.setattr(triton_launch, "device_and_stream", lambda: (lambda: device[0], lambda index: 100 + index))
    replays = triton_launch.Replays(torch.device("cuda"))
    flat = torch.zeros(64, dtype=torch.bfloat16)
    assert replays.takes(flat[:32].view(4, 8)) and not replays.takes(flat[1:33].view(4, 8))
    assert not replays.takes(flat[:32].view(4, 8).t())
    x, out = torch.zeros(2, 2), torch.zeros(2, 2)
    record = replays.recording()
    assert record == []
    replays.keep("a", [(_Kernel(), (1, 1, 1), (x, out))], per_call=(x, out), scratch=(), static=())
    replays.keep("b", [(None, None, ())], per_call=(x, out), scratch=(), static=())
    assert replays.get("a") is replays["a"] is not None and replays["b"] is None and replays.get("b") is None
    assert replays.stream(replays["a"].device) == 100
    device[0] = 1  # another current device: the replay recorded on device 0 is not run there
    assert replays.get("a") is None
    monkeypatch.setattr(triton_launch, "REPLAYS_MAX", 2)
    assert replays.recording() is None


class _Op:
    """A stand-in op for :class:`~fp8select.kernels.call_replay.CallReplays`: one launch reading its input, a
    buffer it allocates (through a view) and a weight, writing its output; ``extra`` does one more thing."""

    def __init__(self, extra: str = "") -> None:
        self.kernel, self.weight, self.extra, self.stray = _Kernel(), torch.zeros(2, 8), extra, torch.zeros(4)

    def __call__(self, x: torch.Tensor, record: list[object] | None) -> torch.Tensor:
        h = torch.empty(4, 8)
        y = torch.empty(4, 8)
        other = {"computes": lambda: torch.zeros(3), "fills": lambda: h.view(32).fill_(1.0),
                 "stray": lambda: self.stray, "output view": lambda: y[1:]}.get(self.extra, lambda: h.view(32))()
        if record is not None:
            record.append((self.kernel, (1, 1, 1), (x, h.view(32), other, self.weight, y, 5)))
            if self.extra == "not replayable":
                record.append((None, None, ()))  # e.g. a Gluon launch
        return y


@pytest.fixture
def call_replays(monkeypatch: pytest.MonkeyPatch) -> object:
    """``make(op)``: a CallReplays for ``op`` whose bookkeeping runs as on a GPU (device 0, stream 100), on CPU tensors."""
    from fp8select.kernels import call_replay, stream_scratch

    monkeypatch.setattr(triton_launch, "device_and_stream", lambda: (lambda: 0, lambda index: 100 + index))
    monkeypatch.setattr(stream_scratch, "SCRATCH",
                        stream_scratch.StreamScratch(capturing=lambda: False, pooled=lambda device, stream: False))

    def make(op: _Op) -> object:
        calls = call_replay.CallReplays(torch.device("cpu"), (op.weight,))
        calls._replays = triton_launch.Replays(torch.device("cuda"))
        return calls

    return make


def test_a_call_is_recorded_at_its_second_run_and_then_replayed(call_replays: object) -> None:
    """First run plain, second recorded (its allocations given places in the workspace, its input, output and
    the op's weight passed as addresses), third replayed: one launch with the new call's addresses."""
    op = _Op()
    calls = call_replays(op)  # type: ignore[operator]
    x = torch.zeros(4, 8)
    runs: list[object] = []

    def launch(record: list[object] | None) -> torch.Tensor:
        runs.append(record)
        return op(x, record)

    assert calls.run("k", (x,), (4, 8), torch.float32) is None
    calls.call("k", (x,), launch)
    assert runs == [None] and "k" not in calls._replays
    calls.call("k", (x,), launch)
    assert runs[1] and calls._replays["k"] is not None and calls._replays["k"].nbytes == 256
    x2 = torch.zeros(4, 8)
    y = calls.run("k", (x2,), (4, 8), torch.float32)
    assert y is not None and y.shape == (4, 8) and len(runs) == 2
    (grid, values, stream), = op.kernel.calls
    work = values[1]
    assert (grid, stream) == ((1, 1, 1), 100) and work == _stream_buffer().data_ptr()
    assert values == [x2.data_ptr(), work, work, op.weight.data_ptr(), y.data_ptr(), 5, "constexpr"]


def _stream_buffer() -> torch.Tensor:
    """The scratch buffer of the fixture's stream, given back after a replay."""
    from fp8select.kernels import stream_scratch

    return stream_scratch.SCRATCH._free[(torch.device("cpu"), 100)]


@pytest.mark.parametrize("extra", ["computes", "fills", "stray", "output view", "not replayable"])
def test_a_call_that_computes_in_torch_or_reads_memory_it_does_not_own_is_not_replayed(call_replays: object,
                                                                                        extra: str) -> None:
    """A torch op that computes (a new tensor, or in place on a buffer the call allocated: a replay would skip
    it), a tensor neither the call's, the op's nor allocated by the call, a view of the output taken as
    scratch, or a launch that cannot be replayed: kept as not replayable, every run plain after."""
    op = _Op(extra)
    calls = call_replays(op)  # type: ignore[operator]
    x = torch.zeros(4, 8)
    for _ in range(3):
        calls.call("k", (x,), lambda record: op(x, record))
    assert "k" in calls._replays and calls._replays["k"] is None
    assert calls.run("k", (x,), (4, 8), torch.float32) is None and op.kernel.calls == []


class _VendorOp:
    """A stand-in vendor route: a launch quantizing its input into a buffer, a vendor step reading it and the op's
    weight and writing another buffer (bf16, a transposed view) with torch ops of its own, a launch reading that
    and the weight into the bf16 output. ``kind`` "made": the second launch reads a buffer the vendor step
    allocated instead; "not replayable": the second launch cannot be replayed (a Gluon launch); "output view": the
    step writes a view of the output as its buffer."""

    def __init__(self, kind: str = "") -> None:
        self.quant, self.reduce, self.weight, self.kind = _Kernel(), _Kernel(), torch.zeros(2, 8), kind
        self.steps: list[tuple[torch.Tensor, ...]] = []

    def step(self, q: torch.Tensor, d: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor) -> None:
        self.steps.append((q, d, ids, weight))
        d.copy_(torch.ones_like(d))  # the vendor's own torch ops: a replay makes them again

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, record: list[object] | None) -> torch.Tensor:
        from fp8select.kernels.call_replay import vendor_call

        q = torch.empty(4, 8, dtype=torch.uint8)
        d = torch.empty(8, 4, dtype=torch.bfloat16).t()
        y = torch.empty(4, 8, dtype=torch.bfloat16)
        if self.kind == "output view":
            d = y.view(4, 8)
        if record is not None:
            record.append((self.quant, (1, 1, 1), (x, q)))
        vendor_call(record, self.step, q, d, ids, self.weight)
        read = self.steps[-1][1].clone() if self.kind == "made" else d
        if record is not None:
            record.append((None, None, ()) if self.kind == "not replayable" else
                          (self.reduce, (2, 1, 1), (read, self.weight, y)))
        return y


def test_a_call_with_a_vendor_step_replays_it_on_the_new_calls_tensors(call_replays: object) -> None:
    """Recorded at the second run like any call, the vendor's torch ops inside its step not watched; replayed
    from the third: each launch with the new call's addresses, the step called again with the new call's own
    tensors and the op's as they are and its buffers as views of the stream's workspace at their places (dtype,
    shape, strides kept)."""
    op = _VendorOp()
    calls = call_replays(op)  # type: ignore[operator]
    x, ids = torch.zeros(4, 8), torch.zeros(4, 2, dtype=torch.int32)
    for _ in range(2):
        calls("k", (x, ids), (4, 8), torch.bfloat16, lambda record: op(x, ids, record))
    replay = calls._replays["k"]
    assert replay is not None and replay.launches is None and replay.nbytes == 256 + 256
    x2, ids2 = torch.zeros(4, 8), torch.zeros(4, 2, dtype=torch.int32)
    y = calls("k", (x2, ids2), (4, 8), torch.bfloat16, lambda record: pytest.fail("replayed, not launched"))
    (_, (x_at, work, _), _), = op.quant.calls
    q, d, ids_seen, weight_seen = op.steps[-1]
    assert len(op.steps) == 3 and x_at == x2.data_ptr() and ids_seen is ids2 and weight_seen is op.weight
    assert work == _stream_buffer().data_ptr() and y.dtype == torch.bfloat16
    assert (q.data_ptr(), q.dtype, q.shape, q.stride()) == (work, torch.uint8, (4, 8), (8, 1))
    assert (d.data_ptr(), d.dtype, d.shape, d.stride()) == (work + 256, torch.bfloat16, (4, 8), (1, 4))
    assert torch.equal(d, torch.ones(4, 8, dtype=torch.bfloat16))  # the step ran on the workspace's view
    (_, values, stream), = op.reduce.calls
    assert values == [work + 256, op.weight.data_ptr(), y.data_ptr(), "constexpr"] and stream == 100


@pytest.mark.parametrize("kind", ["made", "not replayable", "output view"])
def test_a_call_with_a_vendor_step_and_a_launch_it_cannot_replay_is_not_replayed(call_replays: object,
                                                                                 kind: str) -> None:
    """A later launch reading memory the vendor step allocated (not the call: the watch does not see the step's
    ops), a launch that cannot be replayed, or a view of the output taken as the step's buffer (its place in the
    workspace would take the output's writes): kept as not replayable, every run plain after."""
    op = _VendorOp(kind)
    calls = call_replays(op)  # type: ignore[operator]
    x, ids = torch.zeros(4, 8), torch.zeros(4, 2, dtype=torch.int32)
    for _ in range(3):
        calls("k", (x, ids), (4, 8), torch.bfloat16, lambda record: op(x, ids, record))
    assert "k" in calls._replays and calls._replays["k"] is None and len(op.steps) == 3


def test_calls_are_recorded_for_at_most_replays_max_keys_waiting(call_replays: object,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys seen once and not yet recorded are counted up to ``REPLAYS_MAX``; a key past the bound runs plain
    every time, and a key recorded leaves room for another."""
    from fp8select.kernels import call_replay

    monkeypatch.setattr(call_replay, "REPLAYS_MAX", 1)
    op = _Op()
    calls = call_replays(op)  # type: ignore[operator]
    x = torch.zeros(4, 8)
    calls.call("a", (x,), lambda record: op(x, record))
    for _ in range(3):
        calls.call("b", (x,), lambda record: op(x, record))
    assert "b" not in calls._replays
    calls.call("a", (x,), lambda record: op(x, record))
    for _ in range(2):
        calls.call("b", (x,), lambda record: op(x, record))
    assert calls._replays["a"] is not None and calls._replays["b"] is not None


def test_a_call_whose_vendor_step_takes_only_its_own_tensors_needs_no_workspace(call_replays: object) -> None:
    """A step writing the call's output from its input: replayed with no workspace, on the new call's tensors."""
    from fp8select.kernels.call_replay import vendor_call

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        seen.append((x, y))
        y.copy_(x)

    def launch(x: torch.Tensor, record: list[object] | None) -> torch.Tensor:
        y = torch.empty(4, 8)
        vendor_call(record, step, x, y)
        return y

    calls = call_replays(_Op())  # type: ignore[operator]
    outs = [calls("k", (x,), (4, 8), torch.float32, lambda record, x=x: launch(x, record))
            for x in (torch.full((4, 8), float(i)) for i in range(3))]
    replay = calls._replays["k"]
    assert replay is not None and replay.launches is None and replay.nbytes == 0
    assert all(torch.equal(y, torch.full((4, 8), float(i))) for i, y in enumerate(outs))
    assert seen[-1][1] is outs[-1]


def test_args_class_is_what_triton_specializes_each_argument_on() -> None:
    flat = torch.zeros(64, dtype=torch.bfloat16)
    key = triton_launch.args_class((flat, flat[1:], 1, 32, 33, 2**31, -(2**31) - 1, 0.5, True, None))
    assert key == ((torch.bfloat16, True), (torch.bfloat16, False), 1, 2, 0, 6, 4, "fp32", "i1", None)
    assert triton_launch.args_class((flat, object())) is None  # a descriptor: no generic key


def test_launch_binds_each_kernel_and_constexprs_once_and_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """One bound kernel per kernel and constexprs; arguments of no generic key, or past the bound, go through
    ``kernel[grid]``; a recorded launch of a kernel with no compiled handle (here: interpreted) is not replayable."""
    launched: list[tuple[object, ...]] = []

    class InterpretedFunction:
        def __getitem__(self, grid: object) -> object:
            return lambda *args, **kwargs: launched.append((grid, args, tuple(sorted(kwargs))))

    monkeypatch.setattr(triton_launch, "_BOUND", {})
    fn, x = InterpretedFunction(), torch.zeros(4)
    record: list[object] = []
    triton_launch.launch(fn, (2,), (x, 4), {"BLOCK": 16, "num_warps": 4}, record)
    triton_launch.launch(fn, (3, 2), (x, 5), {"BLOCK": 16, "num_warps": 4})
    triton_launch.launch(fn, (2,), (x, 4), {"BLOCK": 32, "num_warps": 4})
    assert len(triton_launch._BOUND) == 2
    assert [g for g, _, _ in launched] == [(2, 1, 1), (3, 2, 1), (2, 1, 1)]
    assert record == [(None, (2, 1, 1), (x, 4))]
    triton_launch.launch(fn, (1,), (x, object()), {"BLOCK": 64}, record)  # no generic key: Triton's own launch
    monkeypatch.setattr(triton_launch, "LAUNCHES_MAX", 3)
    triton_launch.launch(fn, (1,), (x, 4), {"BLOCK": 128})  # past the bound
    assert len(triton_launch._BOUND) == 3 and [g for g, _, _ in launched[3:]] == [(1,), (1,)]
    assert record[-1] == (None, None, ())
