"""The per-stream scratch store: one buffer per stream, never handed to two callers at once."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fp8select.kernels.stream_scratch import SCRATCH_MAX_BYTES, StreamScratch

CPU = torch.device("cpu")


def test_a_given_buffer_serves_the_streams_next_call() -> None:
    scratch = StreamScratch(capturing=lambda: False)
    buf = scratch.take(1000, CPU, 7)
    assert buf is not None and buf.dtype == torch.uint8 and buf.numel() == 1024  # a power of two
    scratch.give(buf, CPU, 7)
    again = scratch.take(600, CPU, 7)
    assert again is buf
    scratch.give(again, CPU, 7)
    bigger = scratch.take(3000, CPU, 7)  # too small: a larger one replaces it
    assert bigger is not None and bigger.numel() == 4096


def test_a_buffer_taken_and_not_given_back_is_never_handed_out_again() -> None:
    scratch = StreamScratch(capturing=lambda: False)
    one = scratch.take(64, CPU, 1)
    two = scratch.take(64, CPU, 1)  # a second caller while the first holds it
    assert one is not None and two is not None and one.data_ptr() != two.data_ptr()
    scratch.give(one, CPU, 1)
    other_stream = scratch.take(64, CPU, 2)
    assert other_stream is not None and other_stream.data_ptr() != one.data_ptr()


def test_none_inside_a_capture_and_for_large_workspaces() -> None:
    capturing = [False]
    scratch = StreamScratch(capturing=lambda: capturing[0])
    assert scratch.take(SCRATCH_MAX_BYTES + 1, CPU, 1) is None
    buf = scratch.take(SCRATCH_MAX_BYTES, CPU, 1)
    assert buf is not None
    scratch.give(buf, CPU, 1)
    capturing[0] = True
    assert scratch.take(16, CPU, 1) is None
    capturing[0] = False
    assert scratch.take(16, CPU, 1) is buf
    scratch.clear()
    assert scratch.take(16, CPU, 1) is not buf


def test_no_buffer_is_made_where_allocations_may_go_to_a_graph_pool() -> None:
    pooled = {3}
    scratch = StreamScratch(capturing=lambda: False, pooled=lambda device, stream: stream in pooled)
    assert scratch.take(64, CPU, 3) is None  # the caller allocates its own for this call
    buf = scratch.take(64, CPU, 4)
    assert buf is not None
    scratch.give(buf, CPU, 4)
    pooled.add(4)
    assert scratch.take(32, CPU, 4) is buf  # a buffer made before serves without asking
    scratch.give(buf, CPU, 4)
    assert scratch.take(4096, CPU, 4) is None  # too small, and no larger one made here
    pooled.clear()
    assert scratch.take(32, CPU, 4) is buf  # kept


def test_only_the_stream_of_torch_compiles_cuda_graph_tree_counts_as_pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    from fp8select.kernels import stream_scratch

    device = torch.device("cuda", 0)
    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    assert not stream_scratch.cudagraph_tree_stream(device, 7)  # never loaded: nothing warms up

    class Manager:
        stream = types.SimpleNamespace(cuda_stream=7)

    managers: dict[int, object] = {}

    def get_manager(index: int, create_if_none_exists: bool = True) -> object:
        assert not create_if_none_exists
        return managers.get(index)

    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", types.SimpleNamespace(get_manager=get_manager))
    assert not stream_scratch.cudagraph_tree_stream(device, 7)  # no tree on this device
    managers[0] = Manager()
    assert stream_scratch.cudagraph_tree_stream(device, 7)
    assert not stream_scratch.cudagraph_tree_stream(device, 8)
    assert not stream_scratch.cudagraph_tree_stream(torch.device("cpu"), 7)  # only CUDA devices have trees
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", types.SimpleNamespace())
    assert stream_scratch.cudagraph_tree_stream(device, 8)  # internals moved: keep nothing
