"""On an sm90 GPU with the real vendor packages: each vendor adapter pinned, run for real.

For DeepGEMM (``deep_gemm``), FlashInfer (``flashinfer``) and sgl-kernel's CUTLASS GEMM
(``sgl_kernel``, distribution ``sglang-kernel``): the snapshot reads the package's version,
``resolve`` accepts the backend, and a layer with that backend pinned (``resolve(backend=...)``:
it runs every call its gates accept) computes within 1e-2 of the fp64 reference over DeepSeek
shapes and odd ones (N = 576, K = 640 and 1152, i.e. K/128 not a multiple of 4) and M from 1
to 1024, with a bias, a leading-dims and a row-strided input, a pre-quantized input, under
CUDA-graph capture and replay, and with NaN/inf in activation rows (those output rows
non-finite, the others finite and correct).

Skipped without a CUDA GPU, on other GPUs than sm90 (the paths checked are the sm90 ones), and
per vendor without its package. Run on the H200 with the carried vendor builds::

    source .vendors/setup.sh && python -m pytest -m gpu tests/test_gpu_vendors.py -q

Each new (N, K) and launch configuration is compiled by the vendor's JIT at its first call (2-5 s;
cached while the machine stays up), so the shapes below are few and every test reuses them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import importlib.util
from pathlib import Path

import pytest
import torch
from fp64_reference import expected, quantize_groups, random_problem, rel_err
from packaging.version import Version

import fp8select

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BLOCK = (128, 128)
TOL = 1e-2
MS = (1, 2, 5, 16, 31, 32, 64, 200, 1024)

# backend -> (import name, distributions that may carry it, entry point the adapter calls on sm90)
VENDORS = {
    "deepgemm": ("deep_gemm", ("deep_gemm", "deep-gemm"), "fp8_gemm_nt"),
    "flashinfer": ("flashinfer", ("flashinfer-python", "flashinfer"), "fp8_blockscale_gemm_sm90"),
    "cutlass": ("sgl_kernel", ("sglang-kernel", "sgl-kernel"), "fp8_blockwise_scaled_mm"),
}

# (N, K) per backend: DeepSeek-V3 shapes (q_a 1536x7168, kv_a 576x7168, q_a + kv_a fused
# 2112x7168, 4096x7168) and small ones with K/128 = 5 and 9. sgl-kernel needs N % 128 == 0.
SHAPES = {
    "deepgemm": ((2112, 7168), (576, 7168), (4096, 7168), (384, 1152), (256, 640)),
    "flashinfer": ((2112, 7168), (576, 7168), (4096, 7168), (384, 1152), (256, 640)),
    "cutlass": ((1536, 7168), (4096, 7168), (384, 1152), (256, 640)),
}
BACKENDS = tuple(VENDORS)


@functools.cache
def _capabilities() -> fp8select.Capabilities:
    fp8select.forget_detected()
    return fp8select.detect_capabilities()


def _require(backend: str) -> None:
    """Skip unless this is an sm90 GPU with ``backend``'s package installed."""
    caps = _capabilities()
    if caps.compute_capability != (9, 0):
        pytest.skip(f"the vendor paths checked here are sm90's; found {caps.compute_capability}")
    module = VENDORS[backend][0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (on the H200: source .vendors/setup.sh)")


@functools.cache
def _selection(backend: str) -> fp8select.Selection:
    return fp8select.resolve(backend=backend, plugins=False)


@functools.cache
def _layer(backend: str, n: int, k: int) -> tuple[fp8select.Fp8Linear, torch.Tensor, torch.Tensor]:
    w, s = random_problem(n, k, BLOCK, seed=n + k, device="cuda")
    return _selection(backend).prepare(w, s, BLOCK), w, s


def _randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)


# =============================================================================== the snapshot and the verdicts


@pytest.mark.parametrize("backend", BACKENDS)
def test_snapshot_reads_the_vendor_version_and_entry_point(backend: str) -> None:
    _require(backend)
    module, distributions, entry_point = VENDORS[backend]
    caps = _capabilities()
    found = caps.packages.get(module)
    assert found is not None and found != "unknown", caps.packages
    installed = []
    for dist in distributions:
        try:
            installed.append(md.version(dist))
        except md.PackageNotFoundError:
            continue
    assert found in installed, (found, installed)
    declared = getattr(importlib.import_module(module), "__version__", None)
    assert declared is not None and Version(found).public == Version(declared).public, (found, declared)
    assert entry_point in caps.package_symbols.get(module, ()), caps.package_symbols


@pytest.mark.parametrize("backend", BACKENDS)
def test_resolve_accepts_the_installed_vendor(backend: str) -> None:
    _require(backend)
    automatic = fp8select.resolve(_capabilities(), plugins=False)
    verdict = next(c for c in automatic.verdicts if c.name == backend)
    assert verdict.accepted, verdict.reason
    pinned = _selection(backend)  # detected capabilities: verification on this GPU runs too
    assert pinned.backend.name == backend
    assert next(c for c in pinned.verdicts if c.name == backend).accepted


def test_deepgemm_warms_up_on_the_gpu() -> None:
    """Its warm-up (the side thread of a warm ``resolve(background=True)``) runs DeepGEMM's layout kernel,
    which starts its JIT compiler, without error; a second one too."""
    _require("deepgemm")
    from fp8select.backends.deepgemm import DeepGemmBackend

    backend = DeepGemmBackend()
    for _ in range(2):
        backend.warm_up(_capabilities(), torch.device("cuda", torch.cuda.current_device()))
    torch.cuda.synchronize()


def test_deepgemm_picks_the_tile_width_the_model_restates(capfd: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The model weighs shapes by the BLOCK_N DeepGEMM picks (fp8select/measured/deepgemm_tiles.py, a
    restatement of its heuristic on 132 SMs): DeepGEMM's own pick, which it prints with DG_PRINT_CONFIGS=1,
    is that width, at shapes where it picks 112 (N 5120 and 7168 at M 2048) and elsewhere."""
    _require("deepgemm")
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the restated choice is for 132 SMs")
    import re

    from fp8select.measured.deepgemm_tiles import deepgemm_block_n

    monkeypatch.setenv("DG_PRINT_CONFIGS", "1")
    for n, k in ((5120, 5120), (7168, 2048), (4096, 7168), (2112, 7168)):
        layer, _, _ = _layer("deepgemm", n, k)
        for m in (1, 16, 256, 2048):
            layer(_randn(m, k, seed=m))
    torch.cuda.synchronize()
    printed = re.findall(r"m=(\d+), n=(\d+), k=(\d+),.*?block_n=(\d+)", capfd.readouterr().out)
    assert printed, "DeepGEMM printed no configuration (DG_PRINT_CONFIGS)"
    picks = {(int(m), int(n), int(k)): int(bn) for m, n, k, bn in printed}
    assert {mnk: deepgemm_block_n(*mnk) for mnk in picks} == picks
    assert picks.get((2048, 5120, 5120)) == 112


# =============================================================================== numerics


@pytest.mark.parametrize("backend, n, k", [(b, n, k) for b in BACKENDS for n, k in SHAPES[b]])
def test_pinned_backend_runs_every_m_and_matches_the_reference(backend: str, n: int, k: int) -> None:
    _require(backend)
    layer, w, s = _layer(backend, n, k)
    bias = _randn(n, seed=n)
    for m in MS:
        assert layer.backend_for(m).name == backend, (m, layer.describe())
        x = _randn(m, k, seed=m + n + k)
        out = layer(x, bias=bias)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        assert rel_err(out, expected(x, w, s, BLOCK, bias)) < TOL, (backend, n, k, m)


def test_flashinfer_bound_launch_equals_the_public_function() -> None:
    """After a route's first call the launch calls FlashInfer's sm90 runner directly: the same bits as
    ``fp8_blockscale_gemm_sm90``, at Ms going up and down (the runner sizes its workspace by the largest M)."""
    _require("flashinfer")
    from flashinfer.gemm import fp8_blockscale_gemm_sm90

    n, k = SHAPES["flashinfer"][0]
    layer, w, s = _layer("flashinfer", n, k)
    for m in (1, 5, 31, 200, 2, 31, 1024, 16):  # Ms the other tests compile too
        x = _randn(m, k, seed=m)
        for _ in range(2):  # the route's first call, then the direct one
            assert torch.equal(layer(x), fp8_blockscale_gemm_sm90(x, w, None, s, out_dtype=torch.bfloat16)), m


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_dims_and_row_strided_inputs(backend: str) -> None:
    _require(backend)
    n, k = SHAPES[backend][-1]
    layer, w, s = _layer(backend, n, k)
    x3 = _randn(2, 8, k, seed=3)  # 16 rows: an M already compiled
    out = layer(x3)
    assert out.shape == (2, 8, n) and rel_err(out, expected(x3, w, s, BLOCK)) < TOL
    wide = _randn(2, 8, k + 128, seed=4)[..., :k]  # rows k + 128 apart
    out = layer(wide)
    assert rel_err(out, expected(wide.contiguous(), w, s, BLOCK)) < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_pre_quantized_input(backend: str) -> None:
    """A caller's fp8 activation and row-major scale, packed and row-strided; FlashInfer's sm90
    kernel takes bf16 only, so there another backend of the chain runs it."""
    _require(backend)
    n, k = SHAPES[backend][-1]
    w, s = random_problem(n, k, BLOCK, seed=n + k, device="cuda")
    layer = _selection(backend).prepare(w, s, BLOCK, out_dtype=torch.bfloat16)
    q, xs = quantize_groups(_randn(5, k, seed=5).float())
    runs = layer.backend_for(5, torch.float8_e4m3fn).name
    assert (runs == backend) == (backend != "flashinfer"), runs
    ref = expected(q, w, s, BLOCK, input_scale=xs)
    assert rel_err(layer(q.contiguous(), input_scale=xs.float()), ref) < TOL
    wide = torch.zeros(5, k + 128, dtype=q.dtype, device="cuda")
    wide[:, :k] = q
    assert rel_err(layer(wide[:, :k], input_scale=xs.float()), ref) < TOL


# =============================================================================== CUDA graphs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m", [5, 200])  # FlashInfer: its swapAB kernel (M < 32) and the other one
def test_cuda_graph_replay_equals_eager(backend: str, m: int) -> None:
    _require(backend)
    n, k = SHAPES[backend][0]
    layer, _, _ = _layer(backend, n, k)
    bias = _randn(n, seed=n)
    static_x = _randn(m, k, seed=m)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (JIT compilation, lazy allocations) outside the capture
        for _ in range(2):
            layer(static_x, bias=bias)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = layer(static_x, bias=bias)
    previous = static_out.clone()
    for seed in (11, 12):
        x = _randn(m, k, seed=seed)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        eager = layer(x, bias=bias)
        # One kernel reading the same data; a vendor kernel may still sum its K splits in another order
        # from run to run (sgl-kernel's CUTLASS at M=200 did on the H200), so compare to bf16 rounding.
        assert rel_err(static_out, eager.double()) < 2e-3, (backend, m, seed)
        assert not torch.equal(static_out, previous), "the replay must read the new input"
        previous = static_out.clone()


# =============================================================================== NaN and inf


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m", [16, 200])
def test_nan_and_inf_rows_propagate(backend: str, m: int) -> None:
    """A NaN, +inf or -inf in an activation row makes that output row non-finite (as in the fp64
    reference); every other row stays finite and correct."""
    _require(backend)
    n, k = SHAPES[backend][0]
    layer, w, s = _layer(backend, n, k)
    x = _randn(m, k, seed=m + 1)
    bad = {3: (7, float("nan")), 9: (k - 1, float("inf")), 11: (130, float("-inf"))}
    for row, (col, value) in bad.items():
        x[row, col] = value
    out = layer(x).float()
    for row in bad:
        assert not torch.isfinite(out[row]).any(), (backend, m, row, out[row, :4])
    good = [r for r in range(m) if r not in bad]
    assert torch.isfinite(out[good]).all()
    assert rel_err(out[good], expected(x[good], w, s, BLOCK)) < TOL


# =============================================================================== load-time measurement


def test_load_time_measurement_compiles_the_vendors_kernels_in_jit_workers_first(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``FP8SELECT_JIT_PROCESSES``: a shape no table holds, on empty caches, has the vendors' kernels at its open
    points compiled in worker processes (every worker done, none failed), then measured within the budget; the
    rows go to the cache directory and the plan runs the buckets they cover as measured."""
    _require("deepgemm")
    from structlog.testing import capture_logs

    for name, sub in (("FP8SELECT_CACHE_DIR", "fp8select"), ("DG_JIT_CACHE_DIR", "dg"), ("TRTLLM_DG_CACHE_DIR", "fi")):
        monkeypatch.setenv(name, str(tmp_path / sub))  # the workers' JIT caches empty (this process's may be warm)
    monkeypatch.setenv("FP8SELECT_JIT_PROCESSES", "4")
    monkeypatch.delenv("FP8SELECT_TUNE", raising=False)
    fp8select.forget_detected()
    selection = fp8select.resolve(plugins=False)
    assert selection.tune_at_load and "FP8SELECT_JIT_PROCESSES" in selection.explain()
    n, k = 2304, 3200  # in no table
    w, s = random_problem(n, k, BLOCK, seed=5, device="cuda")
    with capture_logs() as logs:
        layer = selection.prepare(w, s, BLOCK)
    (jit,) = [e for e in logs if e["event"] == "fp8select.load_time_jit"]
    assert jit["jobs"] >= 1 and jit["failed"] == 0, jit
    (measured,) = [e for e in logs if e["event"] == "fp8select.load_time_tuning"]
    assert measured["points"] > 0, measured
    assert "measured" in {route.why for route in layer.main_plan.routes}
    assert list((tmp_path / "fp8select").glob("tuning-*.json"))
    x = _randn(64, k, seed=3)
    assert rel_err(layer(x).float(), expected(x, w, s, BLOCK)) < TOL
