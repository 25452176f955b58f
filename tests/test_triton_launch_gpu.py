"""Bound Triton launches on a CUDA GPU: the direct launch runs the kernel Triton would run, bit for bit.

A :class:`~fp8select.kernels.triton_launch.BoundKernel` keeps one compiled kernel per
specialization key its caller computes. Here every bound launch is also run through Triton's
dispatcher, which must find the very kernel the key kept: across M (1, multiples of 16, others),
bias absent / bf16 / fp32, an activation at an address not 16-byte aligned, and every kernel path.
A replayed call gives the recorded call's bits, and a prepared layer's fast path gives the
checked path's bits. Run this file on its own (other
test modules set TRITON_INTERPRET=1): ``python -m pytest tests/test_triton_launch_gpu.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err

import fp8select

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

N, K = 384, 1152
MS = (1, 2, 3, 16, 17, 48, 100, 256)
PATHS = (
    {"path": "gemm", "BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 1},
    {"path": "gemm", "BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 3, "FIXUP": 1},
    {"path": "gemm", "BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 3, "FIXUP": 0},
    {"path": "fused", "BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 1},
    {"path": "decode", "BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 2, "TMA": 1},
    {"path": "swap", "BLOCK_M": 32, "BLOCK_N": 128, "SPLIT_K": 1, "TMA": 1},
    {"path": "gemm", "BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 1, "TMA": 1, "PERSISTENT": 1},
)


@pytest.fixture
def checked_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every bound launch also goes through Triton's dispatcher, which must run the kernel the key kept."""
    pytest.importorskip("triton")
    from fp8select.kernels import triton_gemm_kernels, triton_launch

    if type(triton_gemm_kernels._w8a8_swap_kernel).__name__ == "InterpretedFunction":
        pytest.skip("TRITON_INTERPRET=1 in this process: run this file on its own")
    direct = []
    call = triton_launch.BoundKernel.__call__

    def checked(self: Any, grid: Any, args: Any, key: Any = (), record: Any = None) -> None:
        call(self, grid, args, key, record)
        ran, kept = self.compiled_for(grid, args, key)
        if kept is not None:
            direct.append(1)
            assert ran is kept, f"{self._fn} key {key} kept another kernel than Triton runs for these arguments"

    monkeypatch.setattr(triton_launch.BoundKernel, "__call__", checked)
    return direct


def _layer(config: dict[str, Any]) -> Any:
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.kernels.triton_gemm import BoundLinear, fixup_counters

    w, s = random_problem(N, K, (128, 128), seed=7)
    w, s = w.cuda(), s.cuda()
    cfg = TritonConfig.from_dict({"BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 3, **config})
    # the layer's own split-K counters, as a prepared layer passes them (the process-wide ones are
    # shared between calls, so a launch that reads them is not replayed)
    return w, s, BoundLinear(w, s, (128, 128), cfg, out_dtype=torch.bfloat16, counters=fixup_counters(N, "cuda"))


@pytest.mark.parametrize("config", PATHS, ids=[f"{c['path']}-sk{c['SPLIT_K']}{'-p' if c.get('PERSISTENT') else ''}"
                                               for c in PATHS])
def test_the_key_keeps_the_kernel_triton_runs(checked_launches: list[int], config: dict[str, Any]) -> None:
    w, s, linear = _layer(config)
    for m in MS:
        for bias in (None, torch.randn(N, device="cuda", dtype=torch.bfloat16), torch.randn(N, device="cuda")):
            flat = torch.randn(m * K + 1, device="cuda", dtype=torch.bfloat16)
            for x in (flat[:-1].view(m, K), flat[1:].view(m, K)):  # 16-byte aligned, then not
                out = linear(x, bias)
                assert rel_err(out, expected(x.cpu(), w.cpu(), s.cpu(), (128, 128), None if bias is None else bias.cpu())) < 1e-2
    assert checked_launches, "no launch took the direct path"


@pytest.mark.parametrize("config", PATHS, ids=[f"{c['path']}-sk{c['SPLIT_K']}{'-p' if c.get('PERSISTENT') else ''}"
                                               for c in PATHS])
def test_a_replayed_call_gives_the_recorded_calls_bits(config: dict[str, Any]) -> None:
    """The second call at an M replays the first one's launches (where they can be: not the tile and
    persistent kernels reading the quantized activation through a TMA descriptor) and gives its bits."""
    w, s, linear = _layer(config)
    for m in MS:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        first = linear(x)
        replay = linear._replays[(m, torch.bfloat16)]
        assert (replay is None) == (config["path"] == "gemm" and bool(config.get("TMA"))), m  # TMA reads x_q
        again = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(linear(x), first)
        assert rel_err(linear(again), expected(again.cpu(), w.cpu(), s.cpu(), (128, 128), None)) < 1e-2


def test_the_fast_path_gives_the_checked_paths_bits() -> None:
    sel = fp8select.resolve(backend="triton", verify=False)
    w, s = random_problem(N, K, (128, 128), seed=3)
    layer = sel.prepare(w.cuda(), s.cuda())
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    for m in MS:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        strided = x.t().contiguous().t()  # the same values, column-major: declined by the fast path
        assert torch.equal(layer(x, bias), layer(strided, bias))
        assert torch.equal(layer(x.view(1, m, K)), layer(x).view(1, m, N))


def test_layers_sharing_a_streams_scratch_give_their_own_bits() -> None:
    """Replayed calls of two layers, alternating on one stream and then on a second stream, share the
    stream's scratch buffer (:mod:`fp8select.kernels.stream_scratch`) and each gives its own first
    call's bits; inside a CUDA-graph capture the store is left alone and the graph gives the same bits."""
    from fp8select.kernels.stream_scratch import SCRATCH

    layers = [_layer(config)[2] for config in PATHS[1:3]]  # split-K: workspaces of partials, not just x_q
    xs = [torch.randn(m, K, device="cuda", dtype=torch.bfloat16) for m in (3, 17)]
    first = {(i, j): layer(x) for i, layer in enumerate(layers) for j, x in enumerate(xs)}
    SCRATCH.clear()
    for _ in range(3):
        for (i, j), want in first.items():
            assert torch.equal(layers[i](xs[j]), want), (i, j)
    assert len(SCRATCH._free) == 1  # one stream, one buffer
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = {key: layers[key[0]](xs[key[1]]) for key in first}
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(outs[key], want) for key, want in first.items())
    assert len(SCRATCH._free) == 2
    held = dict(SCRATCH._free)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layers[0](xs[1])
    assert SCRATCH._free == held
    graph.replay()
    assert torch.equal(captured, first[(0, 1)])


def test_no_buffer_is_kept_from_a_compiled_cuda_graph_trees_stream() -> None:
    """torch.compile's CUDA graphs warm a graph up on their tree's stream with the thread's allocations in the
    graphs' pool: the store makes no buffer for that stream (one kept there is a live tensor in the pool,
    which the trees refuse), and makes one for any other stream as before."""
    from torch._inductor import cudagraph_trees

    from fp8select.kernels.stream_scratch import StreamScratch, cudagraph_tree_stream

    device = torch.device("cuda", torch.cuda.current_device())
    tree = cudagraph_trees.get_manager(device.index).stream.cuda_stream  # the tree's manager, made if none
    current = torch.cuda.current_stream().cuda_stream
    assert cudagraph_tree_stream(device, tree) and not cudagraph_tree_stream(device, current)
    scratch = StreamScratch()
    assert scratch.take(64, device, tree) is None
    assert scratch.take(64, device, current) is not None


def test_a_layer_called_eagerly_then_under_compiled_cuda_graphs_gives_its_bits() -> None:
    """A layer that has replayed launches at an M (an eager call recorded them) runs under
    ``torch.compile(mode="reduce-overhead")``: the warm-up replays on the tree's stream, the graph
    records and replays, each giving the eager call's bits; nothing of the graphs' pool is kept."""
    from torch._inductor import cudagraph_trees

    from fp8select.kernels.stream_scratch import SCRATCH
    from fp8select.nn import BlockFp8Linear

    w, s = random_problem(N, K, (128, 128), seed=7)
    layer = BlockFp8Linear.from_weights(w.cuda(), s.cuda(), selection=fp8select.resolve(backend="triton", plugins=False))
    torch._dynamo.reset()
    SCRATCH.clear()
    for m in (1, 3):
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        want = layer(x)
        assert torch.equal(layer(x), want)  # the second eager call replays
        graphed = torch.compile(layer, mode="reduce-overhead", dynamic=False)
        for _ in range(4):  # warm-up, recording, replays
            assert torch.equal(graphed(x), want), m
    tree = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert tree is not None and all(stream != tree.stream.cuda_stream for _, stream in SCRATCH._free)


def test_a_kernel_call_without_counters_under_compiled_cuda_graphs_keeps_none_of_their_pool() -> None:
    """The kernel-level ``linear`` with split-K summed in one launch, and no counters of the caller's, run from
    an engine's custom op under ``torch.compile(mode="reduce-overhead")``: on the trees' stream each call gets
    counters of its own (a kept buffer made in their warm-up is a live tensor in their pool, which they refuse),
    and warm-up, recording and replays give the eager call's bits."""
    from torch._inductor import cudagraph_trees

    from fp8select.kernels import triton_device
    from fp8select.kernels import triton_gemm as tg
    from fp8select.kernels.triton_config import TritonConfig

    w, s = random_problem(N, K, (128, 128), seed=11)
    w, s = w.cuda(), s.cuda()
    cfg = TritonConfig.from_dict({"path": "gemm", "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 3,
                                  "FIXUP": 1, "GROUP_M": 8, "num_warps": 4, "num_stages": 3})

    @torch.library.custom_op("fp8select_test::split_k_linear", mutates_args=())
    def split_k_linear(x: torch.Tensor) -> torch.Tensor:
        return tg.linear(x, w, s, (128, 128), out_dtype=torch.bfloat16, config=cfg)

    @split_k_linear.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], N))

    torch._dynamo.reset()
    x = torch.randn(5, K, device="cuda", dtype=torch.bfloat16)
    want = split_k_linear(x)
    graphed = torch.compile(lambda t: split_k_linear(t) * 1, mode="reduce-overhead", dynamic=False)
    for _ in range(4):  # warm-up, recording, replays
        assert torch.equal(graphed(x), want)
    tree = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert tree is not None and all(stream != tree.stream.cuda_stream for _, stream in triton_device._COUNTERS)
