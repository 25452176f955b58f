"""On a CUDA GPU: the MoE experts layer compiled, captured and compared with fp64 (skipped without one).

Run in a process of its own (the CPU Triton tests set TRITON_INTERPRET=1 for theirs):
``python -m pytest -m gpu tests/test_moe_gpu.py``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from fp64_moe_reference import expected_moe, random_moe, random_routing, rel_err, with_strays

import fp8select
from fp8select.backends.moe import MoeProblem, MoeWeights, Replayed
from fp8select.kernels.moe_routing import masked_counts, masked_rows, route, row_experts, row_of_slot
from fp8select.moe_select import moe_chain, moe_verdicts
from fp8select.nn import BlockFp8MoE

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
E, H, INTER, K = 16, 1024, 384, 8
TOL = 1e-2
BF16_GEMMS = ("deepgemm", "cutlass")


@pytest.fixture(scope="module")
def selection() -> fp8select.Selection:
    fp8select.forget_detected()
    return fp8select.resolve(plugins=False)


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(E, H, INTER, seed=0)


def _cuda(problem):  # type: ignore[no-untyped-def]
    return [t.cuda() for t in problem.weights()]


def _inputs(m: int, seed: int = 0, skew: bool = False):  # type: ignore[no-untyped-def]
    w, ids = random_routing(m, K, E, seed=seed, skew=skew)
    x = torch.randn(m, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return x, w, ids


@pytest.mark.parametrize("m", [1, 7, 64, 300])
@pytest.mark.parametrize("skew", [False, True])
def test_every_backend_and_layout_within_1e2(selection, problem, m: int, skew: bool) -> None:  # type: ignore[no-untyped-def]
    x, w, ids = _inputs(m, seed=m, skew=skew)
    ids[0, -1] = -1
    want = expected_moe(x, *problem.weights(), w, ids)
    for name, layout, run in _every_route(selection, problem, m):
        y = run(x.cuda(), w.cuda(), ids.cuda()).cpu()
        gemm_out = torch.bfloat16 if name in BF16_GEMMS else None  # the vendors write gate/up in bf16
        ref = want if gemm_out is None else expected_moe(x, *problem.weights(), w, ids, gemm_out=gemm_out)
        assert rel_err(y, ref) < TOL, (name, layout)


def _every_route(selection, problem, m: int):  # type: ignore[no-untyped-def]
    """``(backend, layout, launch)`` for every backend of the MoE chain and every layout it accepts at M ``m``,
    at its default configuration."""
    caps = selection.capabilities
    moe_problem = MoeProblem(E, H, INTER, K, m=m)
    for backend in moe_chain(selection):
        prepared = backend.prepare(MoeWeights(*_cuda(problem), (128, 128)), caps)
        for layout in backend.layouts:
            if backend.supports(moe_problem, caps, layout).ok:
                yield backend.name, layout, backend.bind(prepared, layout, backend.default_config(moe_problem, layout, m), caps)


def test_cuda_graph_replay_equals_eager(selection, problem) -> None:  # type: ignore[no-untyped-def]
    moe = selection.prepare_moe(*_cuda(problem), top_k=K)
    for m in (1, 16, 64):
        x, w, ids = (t.cuda() for t in _inputs(m, seed=m))
        eager = moe(x, w, ids)
        moe(x, w, ids)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = moe(x, w, ids)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager), m


def test_module_compiles_fullgraph_dynamic(selection, problem) -> None:  # type: ignore[no-untyped-def]
    module = BlockFp8MoE(E, H, INTER, selection=selection, top_k=K, device="meta")
    w13, s13, w2, s2 = _cuda(problem)
    module.load_state_dict({"w13_weight": w13, "w13_weight_scale_inv": s13, "w2_weight": w2,
                            "w2_weight_scale_inv": s2}, assign=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, ids: module(x, w, ids) + x, fullgraph=True, dynamic=True)
    for m in (3, 40, 129):
        x, w, ids = (t.cuda() for t in _inputs(m, seed=m))
        assert torch.equal(compiled(x, w, ids), module(x, w, ids) + x), m


@pytest.mark.parametrize("backend", ["triton", "deepgemm", "cutlass"])
def test_a_route_called_eagerly_then_under_compiled_cuda_graphs_gives_its_bits(problem, backend: str) -> None:  # type: ignore[no-untyped-def]
    """The module on one backend, its calls replayed at an M (eager calls recorded them), runs under
    ``torch.compile(mode="reduce-overhead")``: the trees' warm-up replays on their own stream, the graph records
    and replays, each giving the eager call's bits; no scratch buffer of the trees' stream is kept (the trees
    refuse a live tensor of their pool)."""
    from torch._inductor import cudagraph_trees

    from fp8select.kernels.stream_scratch import SCRATCH

    selection = fp8select.resolve(backend=backend, plugins=False)
    if backend not in {b.name for b in moe_chain(selection)}:
        pytest.skip(f"{backend} runs no MoE route here")
    module = BlockFp8MoE(E, H, INTER, selection=selection, top_k=K, device="meta")
    w13, s13, w2, s2 = _cuda(problem)
    module.load_state_dict({"w13_weight": w13, "w13_weight_scale_inv": s13, "w2_weight": w2,
                            "w2_weight_scale_inv": s2}, assign=True)
    torch._dynamo.reset()
    SCRATCH.clear()
    for m in (1, 16):
        x, w, ids = (t.cuda() for t in _inputs(m, seed=m))
        want = module(x, w, ids)
        assert torch.equal(module(x, w, ids), want) and torch.equal(module(x, w, ids), want)  # recorded, replayed
        assert module.fp8_moe is not None and module.fp8_moe.backends == (backend,)
        graphed = torch.compile(module, mode="reduce-overhead", dynamic=False)
        for _ in range(4):  # warm-up, recording, replays
            assert torch.equal(graphed(x, w, ids), want), (backend, m)
    tree = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert tree is not None and all(stream != tree.stream.cuda_stream for _, stream in SCRATCH._free)


@pytest.mark.parametrize("m", [5, 64])
def test_every_backend_and_layout_counts_ids_outside_the_experts_nowhere(selection, problem, m: int) -> None:  # type: ignore[no-untyped-def]
    """Ids outside ``[0, E)`` that are not -1 (E, 99, -2) give the bits of the same call with those as -1 (which
    ``test_every_backend_and_layout_within_1e2`` checks against fp64), on every route: what an unchecked call
    runs, and what a checked eager call has queued when it reads its check."""
    x, w, ids = (t.cuda() for t in _inputs(m, seed=m + 1))
    stray, minus = with_strays(ids, E)
    for name, layout, run in _every_route(selection, problem, m):
        assert torch.equal(run(x, w, stray), run(x, w, minus)), (name, layout)


def test_every_route_on_a_repeated_id_counts_each_slot_or_drops_it(selection, problem) -> None:  # type: ignore[no-untyped-def]
    """An unchecked call (a CUDA graph, ``check_ids=False``) naming expert 0 in every slot, 800 slots of 100
    tokens: each slot counts, except on DeepGEMM's masked layout, which keeps an expert's first M slots (all a
    top-k routing gives it) and drops the rest; no route adds rows it did not compute."""
    m = 100
    x, w, _ = _inputs(m, seed=11)
    ids = torch.zeros(m, K, dtype=torch.int32)
    dropped = torch.where(torch.arange(m * K).view(m, K) < m, ids, -1)
    routes = set()
    for name, layout, run in _every_route(selection, problem, m):
        y = run(x.cuda(), w.cuda(), ids.cuda()).cpu()
        gemm_out = torch.bfloat16 if name in BF16_GEMMS else None
        want = expected_moe(x, *problem.weights(), w, dropped if layout == "masked" else ids, gemm_out=gemm_out)
        assert rel_err(y, want) < TOL, (name, layout)
        routes.add((name, layout))
    assert ("deepgemm", "masked") in routes or "deepgemm" not in {name for name, _ in routes}


def test_bad_ids_are_typed_errors_on_eager_calls(selection, problem) -> None:  # type: ignore[no-untyped-def]
    """Raised after the call's launches were queued (the check is read after them); the next call is unharmed."""
    moe = selection.prepare_moe(*_cuda(problem), top_k=K)
    x, w, ids = (t.cuda() for t in _inputs(4))
    good = moe(x, w, ids)
    with pytest.raises(fp8select.InvalidInputError, match="topk_ids"):
        moe(x, w, ids.masked_fill(ids == ids[0, 0], E))
    with pytest.raises(fp8select.InvalidInputError, match="distinct"):
        moe(x, w, ids[:, :1].repeat(1, K))
    with pytest.raises(fp8select.InvalidInputError, match=r"\[-2"):
        moe(x.clone().t().contiguous().t(), w, ids.masked_fill(ids == ids[1, 1], -2))  # the checked path
    assert torch.equal(moe(x, w, ids), good)


@pytest.mark.skipif(importlib.util.find_spec("sgl_kernel") is None, reason="needs sgl_kernel (sglang-kernel 0.4.4)")
@pytest.mark.parametrize("m", [1, 64, 300])  # 8 / 512 / 2400 rows: the kernel swaps A and B up to 2048 rows
def test_sgl_kernel_cutlass_within_1e2_and_replays_in_a_cuda_graph(selection, problem, m: int) -> None:  # type: ignore[no-untyped-def]
    verdicts = {b.name: (b, c) for b, c in moe_verdicts(selection)}
    backend, verdict = verdicts["cutlass"]
    assert verdict.accepted, verdict.reason
    caps = selection.capabilities
    prepared = backend.prepare(MoeWeights(*_cuda(problem), (128, 128)), caps)
    run = backend.bind(prepared, "offsets", None, caps)
    x, w, ids = _inputs(m, seed=m, skew=m == 64)
    ids[0, -1] = -1
    want = expected_moe(x, *problem.weights(), w, ids, gemm_out=torch.bfloat16)
    x, w, ids = x.cuda(), w.cuda(), ids.cuda()
    eager = run(x, w, ids)
    assert rel_err(eager.cpu(), want) < TOL
    row = min(1, m - 1)
    poisoned = x.clone()
    poisoned[row, 5] = float("nan")
    nan = run(poisoned, w, ids).cpu()
    assert torch.isnan(nan[row]).all() and (m == 1 or torch.isfinite(nan[0]).all())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(x, w, ids)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(captured.cpu(), want) < TOL  # row order within an expert may differ (atomics): not bitwise


@pytest.mark.parametrize(("m", "k", "e", "block_m"), [(1, 8, 256, 128), (64, 8, 256, 1), (300, 6, 1023, 16),
                                                     (512, 8, 256, 64)])
def test_routing_kernel_writes_the_torch_paths_bits_and_replays(m: int, k: int, e: int, block_m: int) -> None:
    def ids_of(seed: int) -> torch.Tensor:
        return torch.randint(-2, e + 2, (m, k), generator=torch.Generator().manual_seed(seed), dtype=torch.int32).cuda()

    ids = ids_of(m)
    routing = route(ids, e, block_m, max_m=m, row_expert=True)
    assert routing.slot_row is not None and routing.row_expert is not None  # the kernel ran
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = route(ids, e, block_m, max_m=m, row_expert=True)
    for seed in (m, m + 1):
        ids.copy_(ids_of(seed))
        graph.replay()
        want = route(ids, e, block_m, kernel=False)
        for got in (route(ids, e, block_m, max_m=m, row_expert=True), captured):
            for name in ("slot_ids", "block_expert", "counts", "slot_rank"):
                assert torch.equal(getattr(got, name), getattr(want, name)), (name, seed)
            assert torch.equal(row_of_slot(got), row_of_slot(want))
            assert torch.equal(masked_rows(got, e, m), masked_rows(want, e, m))
            assert torch.equal(masked_counts(got, m), masked_counts(want, m))
            assert torch.equal(row_experts(got), row_experts(want))


def _as_its_twin(problem, config, twin, m: int, skew: bool = False, twin_tol: float = 1e-3):  # type: ignore[no-untyped-def]
    """The Triton experts op at ``config`` against fp64 (1e-2) and against ``twin``, the same products in another
    kernel (``twin_tol``: compiled, fp32 rounding may differ), with an id -1 in the batch; every id -1 gives
    zeros; a NaN token's row NaN, the others finite. Returns the op and the inputs, for more checks."""
    from fp8select.kernels.moe_triton import TritonExperts

    experts = TritonExperts(*_cuda(problem))
    x, w, ids = _inputs(m, seed=m, skew=skew)
    ids[0, -1] = -1
    y = experts(x.cuda(), w.cuda(), ids.cuda(), config)
    assert rel_err(y.cpu(), expected_moe(x, *problem.weights(), w, ids)) < TOL
    assert rel_err(y, experts(x.cuda(), w.cuda(), ids.cuda(), twin)) < twin_tol
    assert torch.equal(experts(x.cuda(), w.cuda(), torch.full_like(ids, -1).cuda(), config).cpu(), torch.zeros_like(x))
    nan = x.clone()
    nan[m - 1, 5] = float("nan")
    y = experts(nan.cuda(), w.cuda(), ids.cuda(), config).cpu()
    assert torch.isnan(y[m - 1]).all() and torch.isfinite(y[: m - 1]).all()
    return experts, x, w, ids


@pytest.mark.parametrize("block_m", [16, 64])
@pytest.mark.parametrize("m", [1, 64, 300])
def test_the_triton_plain_gate_up_within_1e2_and_as_the_fused_kernel(problem, block_m: int, m: int) -> None:  # type: ignore[no-untyped-def]
    """The plain gate-up (a grouped GEMM over the 2I columns writing fp32, then silu(gate) * up quantized
    by its own kernel) against fp64, and against the fused kernel of the same tiles (the same fp32 sums
    and quantizer; compiled, the two may differ in fp32 rounding); a NaN token's row NaN, the others
    finite; an id -1 contributes nothing."""
    from fp8select.kernels.moe_config import MoeTritonConfig

    fused = MoeTritonConfig(BLOCK_M=block_m, BLOCK_N=128, GROUP_M=8 if block_m == 64 else 1, num_warps=4,
                            num_stages=3, QUANT_IN_KERNEL=0)
    _as_its_twin(problem, MoeTritonConfig(**{**fused.to_dict(), "FUSED_ACT": 0}), fused, m)


@pytest.mark.parametrize("tiles", [(64, 4, 0, 128), (128, 8, 0, 128), (64, 4, 1, 128), (64, 4, 0, 256), (64, 4, 1, 256)])
@pytest.mark.parametrize("m", [1, 64, 300])
def test_the_wgmma_path_within_1e2_and_as_the_tl_dot_kernel_of_the_same_tiles(problem, tiles, m: int) -> None:  # type: ignore[no-untyped-def]
    """``WGMMA`` 1: both GEMMs on the Gluon kernels (the activation gathered into the sorted rows, the down
    GEMM into sorted rows summed through each slot's row), the plain gate-up and the fused one, against
    fp64 and against the ``tl.dot`` kernels of the same tiles (the same products; compiled, fp32 rounding
    may differ); every token on one expert; a NaN token's row NaN, the others finite; ids -1 contribute
    nothing. The fused gate-up against the plain one: the same bits (the same MMAs and scalings per output
    element, silu*up quantized by the same code). 256 columns: each tile on two warpgroups side by side."""
    from fp8select.kernels.moe_config import MoeTritonConfig
    from fp8select.kernels.triton_device import wgmma_runs

    if not wgmma_runs(torch.device("cuda")):
        pytest.skip("the wgmma kernel does not run on this GPU")
    block_m, warps, fused, block_n = tiles
    wgmma = MoeTritonConfig(BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=8, num_warps=warps, num_stages=4,
                            QUANT_IN_KERNEL=0, FUSED_ACT=fused, WGMMA=1)
    # the fused tl.dot gate-up and the Gluon one round their fp32 sums differently (mma.sync against wgmma):
    # a few elements of silu*up on the other side of an fp8 step, as the transposed tile's test says
    experts, x, w, ids = _as_its_twin(problem, wgmma, MoeTritonConfig(**{**wgmma.to_dict(), "WGMMA": 0}), m,
                                      twin_tol=5e-3 if fused else 1e-3)
    one = torch.zeros_like(ids)
    assert rel_err(experts(x.cuda(), w.cuda(), one.cuda(), wgmma).cpu(), expected_moe(x, *problem.weights(), w, one)) < TOL
    if fused:
        plain = MoeTritonConfig(**{**wgmma.to_dict(), "FUSED_ACT": 0})
        assert torch.equal(experts(x.cuda(), w.cuda(), ids.cuda(), wgmma), experts(x.cuda(), w.cuda(), ids.cuda(), plain))


@pytest.mark.parametrize("tiles", [(64, 4, 1, 128, 3), (128, 8, 0, 128, 3), (64, 4, 1, 256, 3), (64, 4, 0, 128, 4)])
@pytest.mark.parametrize("m", [1, 64, 300])
@pytest.mark.parametrize("skew", [False, True])
def test_persistent_wgmma_programs_write_the_bits_of_one_program_per_tile(problem, tiles, m: int, skew: bool) -> None:  # type: ignore[no-untyped-def]
    """``PERSISTENT`` 1: each program takes tile after tile, loading the next one's first K blocks under the
    last one's epilogue; the same products in the same order as one program per tile, so the same bits, and
    within 1e-2 of fp64, ids -1 and NaN as there. At M 300 each GEMM has more tiles than the GPU has SMs
    (programs loop), at M 1 fewer (programs past the last tile return); the unused row blocks come last. The
    down GEMM's K (384) holds 3 blocks: at 4 stages it runs one program per tile (the last case)."""
    from fp8select.kernels.moe_config import MoeTritonConfig
    from fp8select.kernels.triton_device import wgmma_runs

    if not wgmma_runs(torch.device("cuda")):
        pytest.skip("the wgmma kernel does not run on this GPU")
    block_m, warps, fused, block_n, stages = tiles
    persistent = MoeTritonConfig(BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=8, num_warps=warps, num_stages=stages,
                                 QUANT_IN_KERNEL=0, FUSED_ACT=fused, WGMMA=1, PERSISTENT=1)
    twin = MoeTritonConfig(**{**persistent.to_dict(), "PERSISTENT": 0})
    experts, x, w, ids = _as_its_twin(problem, persistent, twin, m, skew=skew, twin_tol=1e-9)
    assert torch.equal(experts(x.cuda(), w.cuda(), ids.cuda(), persistent), experts(x.cuda(), w.cuda(), ids.cuda(), twin))
    one = torch.zeros_like(ids)
    assert torch.equal(experts(x.cuda(), w.cuda(), one.cuda(), persistent), experts(x.cuda(), w.cuda(), one.cuda(), twin))


def test_prepare_moe_measures_a_shape_no_table_holds_at_load_time(problem, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``tune=True``: the open buckets of this shape (in no table) are timed with the layer's weights, saved in
    the cache directory, and the layer's plan reads them."""
    monkeypatch.setenv("FP8SELECT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FP8SELECT_TUNE_BUDGET_S", "30")
    fp8select.forget_detected()
    try:
        sel = fp8select.resolve(plugins=False)
        moe = sel.prepare_moe(*_cuda(problem), top_k=K, tune=True)
    finally:
        fp8select.forget_detected()
    assert "measured" in {r.why for r in moe.main_plan.routes}
    assert list(sel._memo.measured_moe) == [(E, H, INTER, K)]
    assert any(path.suffix == ".json" for path in tmp_path.rglob("*"))


@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize("m", [1, 64])
def test_the_transposed_tile_within_1e2_and_as_the_normal_one(problem, block_m: int, m: int) -> None:  # type: ignore[no-untyped-def]
    """``SWAP_AB`` 1 compiled: against fp64 and the normal tile of the same sizes, under skew (:func:`_as_its_twin`).
    The two tiles run different instructions (``mma.sync`` normal, ``wgmma`` transposed), whose fp32 sums of
    the FP8 products round differently; a few elements of silu(gate) * up then land on the other side of an
    fp8 rounding step: 1.7e-3 and 2.8e-3 apart on the H200, against 1e-3 between kernels of one instruction."""
    from fp8select.kernels.moe_config import MoeTritonConfig

    plain = MoeTritonConfig(BLOCK_M=block_m, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                            FUSED_ACT=0)
    _as_its_twin(problem, MoeTritonConfig(**{**plain.to_dict(), "SWAP_AB": 1}), plain, m, skew=True, twin_tol=5e-3)


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("m", [1, 64])
def test_the_fused_gate_up_on_the_transposed_tile_within_1e2_and_as_the_plain_one(problem, stages: int, m: int) -> None:  # type: ignore[no-untyped-def]
    """``FUSED_ACT`` 1 with ``SWAP_AB`` 1 compiled (both gate-up products on ``wgmma``'s transposed tile, silu*up
    quantized in the epilogue): against fp64 and against the plain structure on the same tile, under skew."""
    from fp8select.kernels.moe_config import MoeTritonConfig

    plain = MoeTritonConfig(BLOCK_M=16, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=stages, QUANT_IN_KERNEL=0,
                            FUSED_ACT=0, SWAP_AB=1)
    _as_its_twin(problem, MoeTritonConfig(**{**plain.to_dict(), "FUSED_ACT": 1}), plain, m, skew=True, twin_tol=5e-3)


REPLAY_CONFIGS = {  # the decode structures (PDL at M <= 16), the normal tile, the activation quantized in the kernel
    "swap-plain": {"BLOCK_M": 16, "BLOCK_N": 128, "SWAP_AB": 1, "FUSED_ACT": 0},
    "swap-fused": {"BLOCK_M": 16, "BLOCK_N": 128, "SWAP_AB": 1, "FUSED_ACT": 1},
    "tile-plain": {"BLOCK_M": 64, "BLOCK_N": 128, "FUSED_ACT": 0},
    "quant-in-kernel": {"BLOCK_M": 16, "BLOCK_N": 64, "QUANT_IN_KERNEL": 1},
}


def _replay_calls():  # type: ignore[no-untyped-def]
    """``(key, label, inputs)`` of the calls a replay test makes: at M 1 / 16 / 64 with int32 and int64 ids, four
    calls each, their tokens and routings other than the recorded call's (skew, and a -1 id and a NaN row)."""
    for m in (1, 16, 64):
        for ids_dtype in (torch.int32, torch.int64):
            for seed in range(4):
                x, w, ids = (t.cuda() for t in _inputs(m, seed=seed, skew=seed % 2 == 1))
                ids = ids.to(ids_dtype)
                if seed == 2:
                    ids[0, -1] = -1
                    x[m - 1, 3] = float("nan")
                yield (m, K, torch.bfloat16, torch.float32, ids_dtype), (m, ids_dtype, seed), (x, w, ids)


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("config", list(REPLAY_CONFIGS.values()), ids=list(REPLAY_CONFIGS))
def test_a_triton_experts_call_replays_its_launches_bit_for_bit(problem, config) -> None:  # type: ignore[no-untyped-def]
    """From the third call under one M, k, dtypes and configuration the op replays the second call's recorded
    launches: each call's bits as its launches run afresh, for other tokens and routings than the recorded
    call's (:func:`_replay_calls`); and a replay is kept for every key it was called under."""
    from fp8select.kernels.moe_config import MoeTritonConfig
    from fp8select.kernels.moe_triton import TritonExperts

    cfg = MoeTritonConfig(**{"GROUP_M": 8, "num_warps": 4, "num_stages": 3, "QUANT_IN_KERNEL": 0, **config})
    experts = TritonExperts(*_cuda(problem))
    keys = set()
    for key, label, inputs in _replay_calls():
        assert _same_bits(experts(*inputs, cfg), experts._launch(*inputs, cfg, None)), label
        keys.add((*key, cfg))
    assert all(experts._calls._replays[key] is not None for key in keys)


def test_every_vendor_route_replays_its_calls_bit_for_bit(selection, problem) -> None:  # type: ignore[no-untyped-def]
    """From the third call under one M, k and dtypes a vendor route replays the second call's launches and calls
    its vendor's GEMMs again on views of the workspace: each call's bits as a fresh bind's first call gives them,
    for other tokens and routings than the recorded call's (:func:`_replay_calls`); a replay with vendor steps is
    kept for every key; captured into a CUDA graph, a replayed call gives the same bits."""
    caps = selection.capabilities
    weights = MoeWeights(*_cuda(problem), (128, 128))
    routes = 0
    for backend in moe_chain(selection):
        if not backend.packages:
            continue
        prepared = backend.prepare(weights, caps)
        for layout in backend.layouts:
            if not backend.supports(MoeProblem(E, H, INTER, K), caps, layout).ok:
                continue
            routes += 1
            run = backend.bind(prepared, layout, None, caps)
            assert isinstance(run, Replayed)
            keys = set()
            for key, label, inputs in _replay_calls():
                want = backend.bind(prepared, layout, None, caps)(*inputs)
                assert _same_bits(run(*inputs), want), (backend.name, layout, label)
                keys.add(key)
            kept = [run.calls._replays[key] for key in keys]
            assert all(r is not None and r.launches is None for r in kept), (backend.name, layout)
            x, w, ids = (t.cuda() for t in _inputs(16, seed=5))
            eager = run(x, w, ids)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = run(x, w, ids)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(captured, eager), (backend.name, layout)
    if not routes:
        pytest.skip("no vendor MoE backend runs here")


def test_a_triton_experts_call_on_gluon_launches_is_not_replayed(problem) -> None:  # type: ignore[no-untyped-def]
    """The wgmma kernels launch through Gluon's launcher: their calls are kept as not replayable, and run afresh."""
    from fp8select.kernels.moe_config import MoeTritonConfig
    from fp8select.kernels.moe_triton import TritonExperts
    from fp8select.kernels.triton_device import wgmma_runs

    if not wgmma_runs(torch.device("cuda")):
        pytest.skip("the wgmma kernel does not run on this GPU")
    cfg = MoeTritonConfig(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0, WGMMA=1)
    experts = TritonExperts(*_cuda(problem))
    x, w, ids = (t.cuda() for t in _inputs(64, seed=1))
    first = [experts(x, w, ids, cfg) for _ in range(3)]
    assert experts._calls._replays[(64, K, torch.bfloat16, torch.float32, torch.int32, cfg)] is None
    assert all(torch.equal(y, first[0]) for y in first)


def test_every_bound_launch_keeps_the_kernel_triton_runs(selection, problem, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every Triton launch of the MoE routes goes through ``triton_launch.launch``, bound per kernel and
    constexprs and keyed by ``args_class``; here each bound launch also goes through Triton's dispatcher, which
    must run the very kernel its key kept: every route, M 1 / 7 / 64 / 300, int32 and int64 ids, an activation
    16-byte aligned and not, and the layer's ids' check."""
    from fp8select.kernels import triton_launch

    checked = []
    call = triton_launch.BoundKernel.__call__

    def checking(self, grid, args, key=(), record=None):  # type: ignore[no-untyped-def]
        call(self, grid, args, key, record)
        ran, kept = self.compiled_for(grid, args, key)
        if kept is not None:
            checked.append(self._fn)
            assert ran is kept, f"{self._fn} key {key} kept another kernel than Triton runs for these arguments"

    monkeypatch.setattr(triton_launch.BoundKernel, "__call__", checking)
    layer = selection.prepare_moe(*_cuda(problem), top_k=K)
    for m in (1, 7, 64, 300):
        routes = list(_every_route(selection, problem, m))
        for ids_dtype in (torch.int32, torch.int64):
            x, w, ids = _inputs(m, seed=m)
            flat = torch.empty(m * H + 8, dtype=torch.bfloat16, device="cuda")
            for offset in (0, 1):  # 16-byte aligned, then 2 bytes past
                xs = flat[offset:offset + m * H].view(m, H)
                xs.copy_(x)
                for _, _, run in routes:
                    run(xs, w.cuda(), ids.to(ids_dtype).cuda())
                layer(xs, w.cuda(), ids.to(ids_dtype).cuda())
    assert len(set(checked)) >= 5, checked
