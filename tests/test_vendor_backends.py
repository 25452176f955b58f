"""The vendor adapters end to end on CPU: resolve under a vendor's snapshot, prepare, call, compare.

Each test installs the strict fake of the vendor package (``tests/fakes``), which checks every
argument as the published API documents it and computes in float64; the layer's output is
compared with the independent fp64 reference (``fp64_reference.expected``). The fallback is
the pure-torch ``reference`` backend (``order=[vendor, "reference"]``), so calls the adapter
declines (an M, an output dtype, a shape) run on CPU too. One test per adapter substitutes a
deliberately wrong layout and asserts that the fake rejects the call.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fakes import FakeVendor, install
from fp64_reference import expected, quantize_groups, random_problem, rel_err
from matrix import MATRIX

from fp8select import Capabilities, CapabilitiesError, resolve
from fp8select.backends.aiter import AiterBackend
from fp8select.backends.cutlass import CutlassBackend
from fp8select.backends.deepgemm import DeepGemmBackend
from fp8select.backends.flashinfer import FlashInferBackend
from fp8select.backends.npu import NpuBackend
from fp8select.capabilities import replace_caps
from fp8select.detect import _installed_packages, _package_symbols
from fp8select.kernels import vendor_layouts as vl
from fp8select.kernels.quant import ROW_MAJOR
from fp8select.layer import Fp8Linear

BLOCK = (128, 128)
TOL = 1e-2


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _layer(row: str, backend: str, n: int, k: int, *, seed: int = 0, scale: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> tuple[Fp8Linear, torch.Tensor, torch.Tensor]:
    """A layer under the snapshot ``row``, which must choose ``backend``, with ``reference`` as its fallback."""
    caps = MATRIX[row][0]
    assert resolve(caps, plugins=False).backend.name == backend
    selection = resolve(caps, plugins=False, order=[backend, "reference"], tuning=False)  # the adapter alone, no table
    w, s = random_problem(n, k, seed=seed)
    if scale is not None:
        s = scale
    return selection.prepare(w, s, out_dtype=out_dtype), w, s


def _run_and_compare(layer: Fp8Linear, w: torch.Tensor, s: torch.Tensor, ms: tuple[int, ...], *,
                     dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> None:
    """Calls with each M (with a bias) and one 3-D input, each within TOL of the fp64 reference."""
    gen = torch.Generator().manual_seed(seed)
    n, k = w.shape
    for m in ms:
        x = torch.randn(m, k, generator=gen).to(dtype)
        bias = torch.randn(n, generator=gen).to(dtype)
        y = layer(x, bias=bias)
        assert y.shape == (m, n) and y.dtype == dtype
        assert rel_err(y, expected(x, w, s, BLOCK, bias)) < TOL, (m, layer)
    x3 = torch.randn(2, 3, k, generator=gen).to(dtype)
    y3 = layer(x3)
    assert y3.shape == (2, 3, n)
    assert rel_err(y3, expected(x3, w, s, BLOCK)) < TOL


def _all_ok(fake: FakeVendor) -> None:
    assert fake.calls and all(c.ok for c in fake.calls), [c for c in fake.calls if not c.ok]


# =============================================================================== DeepGEMM


@pytest.mark.parametrize("row, api, entry", [
    ("h200-deepgemm", "v2", "fp8_gemm_nt"),
    ("h200-deepgemm", "v2.6", "fp8_gemm_nt"),
    ("h200-deepgemm", "v2.8", "fp8_gemm_nt"),
    ("h100-deepgemm-v1", "v1", "gemm_fp8_fp8_bf16_nt"),
])
@pytest.mark.parametrize("n, k", [(256, 512), (192, 640)])
def test_deepgemm_sm90_end_to_end(monkeypatch: pytest.MonkeyPatch, row: str, api: str, entry: str, n: int, k: int) -> None:
    fake = install(monkeypatch, "deep_gemm", arch="sm90", api=api)
    layer, w, s = _layer(row, "deepgemm", n, k, seed=n + k)
    assert layer.backends == ("deepgemm",)  # nothing measured: the first of the chain for every M
    prepared = layer.prepared["deepgemm"]
    assert prepared.weight is w and prepared.scale is s and prepared.weight_nk is w  # checkpoint layout, shared
    _run_and_compare(layer, w, s, (1, 5, 16))
    _all_ok(fake)
    calls = fake.calls_to(entry)
    assert len(calls) == 4
    (a, sfa) = calls[1].arguments["a" if api != "v1" else "lhs"]
    assert a.shape == (5, k) and sfa.shape == (5, k // 128) and sfa.stride() == (1, 8)  # MN-major, TMA-aligned


def test_deepgemm_routes_fp16_calls_to_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "deep_gemm", arch="sm90")
    layer, w, s = _layer("h200-deepgemm", "deepgemm", 256, 512)
    assert layer.backend_for(4, torch.float16).name == "reference"  # DeepGEMM writes bf16 only
    _run_and_compare(layer, w, s, (4,), dtype=torch.float16)
    assert not fake.calls_to("fp8_gemm_nt")


def test_deepgemm_sm90_pre_quantized_input(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "deep_gemm", arch="sm90")
    layer, w, s = _layer("h200-deepgemm", "deepgemm", 256, 512, out_dtype=torch.bfloat16)
    q, xs = quantize_groups(torch.randn(6, 512))
    y = layer(q.contiguous(), input_scale=xs.float())
    assert rel_err(y, expected(q, w, s, BLOCK, input_scale=xs)) < TOL
    sfa = fake.last("fp8_gemm_nt").arguments["a"][1]
    assert sfa.stride() == (1, 8)  # the caller's row-major scale, laid out for TMA


def _quantize_pow2(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's sm100 activation recipe, written independently: scale = 2**ceil(log2(amax / 448))."""
    m, k = x.shape
    groups = -(-k // 128)
    padded = torch.zeros(m, groups * 128)
    padded[:, :k] = x.float()
    tiles = padded.view(m, groups, 128)
    scale32 = tiles.abs().amax(-1).clamp_min(1e-10) / 448.0
    scale = torch.exp2(torch.ceil(torch.log2(scale32.double()))).float()
    q = (tiles / scale[:, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(m, -1)[:, :k]
    return q, scale


def test_deepgemm_sm100_requantizes_to_ue8m0_and_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "deep_gemm", arch="sm100")
    n, k = 256, 640
    layer, w, s = _layer("b200-deepgemm", "deepgemm", n, k, seed=7)
    prepared = layer.prepared["deepgemm"]
    w2, s2 = vl.requantize_ue8m0(w, s)
    assert torch.equal(prepared.weight.view(torch.uint8), w2.view(torch.uint8))
    assert torch.equal(prepared.extra["scale_nk"], s2) and vl.is_power_of_two(s2)
    assert prepared.scale.dtype == torch.int32 and prepared.scale.shape == (n, 2) and prepared.scale.stride() == (1, n)
    assert torch.equal(vl.unpack_ue8m0(prepared.scale, 5), vl.expand_block_rows(s2, n))
    # the plan reads only the requantized copy, so the layer lets the checkpoint go (one copy, not two)
    assert layer.memory() == {"checkpoint_held": False, "copies": 1, "copy_bytes": n * k}

    gen = torch.Generator().manual_seed(1)
    for shape in ((1, k), (5, k), (16, k), (2, 3, k)):
        x = torch.randn(*shape, generator=gen).to(torch.bfloat16)
        bias = torch.randn(n, generator=gen).to(torch.bfloat16)
        y = layer(x, bias=bias)
        q, xs = _quantize_pow2(x.reshape(-1, k))
        # The function DeepGEMM computes: power-of-two activation scales, the re-quantized weight.
        assert rel_err(y, expected(q, w2, s2, BLOCK, bias, input_scale=xs).reshape(*shape[:-1], n)) < TOL
        # Against the checkpoint's own recipe both operands are rounded onto other fp8 grids: each
        # rounding is ~2**-3/sqrt(12) ~ 3.6% RMS relative at worst, two operands ~5%; 8% bounds it.
        assert rel_err(y, expected(x, w, s, BLOCK, bias)) < 8e-2
    _all_ok(fake)
    sfa = fake.last("fp8_gemm_nt").arguments["a"][1]
    assert sfa.dtype == torch.int32 and sfa.shape == (6, 2) and sfa.stride() == (1, 8)


def test_deepgemm_sm100_keeps_a_ue8m0_checkpoint_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "deep_gemm", arch="sm100")
    _, s = random_problem(256, 512, seed=2)
    s_pow2 = torch.exp2(torch.ceil(torch.log2(s)))
    layer, w, _ = _layer("b200-deepgemm", "deepgemm", 256, 512, seed=2, scale=s_pow2)
    assert layer.prepared["deepgemm"].weight_nk is w and layer.memory()["copies"] == 0
    x = torch.randn(8, 512).to(torch.bfloat16)
    q, xs = _quantize_pow2(x)
    assert rel_err(layer(x), expected(q, w, s_pow2, BLOCK, input_scale=xs)) < TOL


def test_deepgemm_sm100_sends_pre_quantized_input_to_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "deep_gemm", arch="sm100")
    layer, w, s = _layer("b200-deepgemm", "deepgemm", 256, 512, out_dtype=torch.bfloat16)
    assert layer.backend_for(4, torch.float8_e4m3fn).name == "reference"
    q, xs = quantize_groups(torch.randn(4, 512))
    y = layer(q.contiguous(), input_scale=xs.float())
    w2, s2 = vl.requantize_ue8m0(w, s)  # the fallback shares the requantized weight
    assert rel_err(y, expected(q, w2, s2, BLOCK, input_scale=xs)) < TOL
    assert not fake.calls_to("fp8_gemm_nt")
    assert layer.prepared["reference"].weight is layer.prepared["deepgemm"].weight_nk  # the copy, not a new one
    verdict = DeepGemmBackend().supports(layer._problem(4, torch.float8_e4m3fn, torch.bfloat16), layer.caps)
    assert not verdict.ok and "UE8M0" in verdict.reason


def test_deepgemm_wrong_layouts_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "deep_gemm", arch="sm90")
    monkeypatch.setattr(DeepGemmBackend, "sm90_scale_layout", ROW_MAJOR)
    layer, _, _ = _layer("h200-deepgemm", "deepgemm", 256, 512)
    with pytest.raises(RuntimeError, match="MN-major and TMA-aligned"):
        layer(torch.randn(16, 512).to(torch.bfloat16))
    monkeypatch.undo()
    install(monkeypatch, "deep_gemm", arch="sm100")
    monkeypatch.setattr(DeepGemmBackend, "pack_activation_scales", False)
    layer, _, _ = _layer("b200-deepgemm", "deepgemm", 256, 512)
    with pytest.raises(RuntimeError, match="packed UE8M0"):
        layer(torch.randn(16, 512).to(torch.bfloat16))


def test_deepgemm_entry_point_missing_at_first_use_goes_to_the_next_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # The snapshot does not record deep_gemm's entry points; the installed one is v1, which has
    # no sm100 kernel: the layer declines DeepGEMM with that reason and runs on the next backend.
    install(monkeypatch, "deep_gemm", arch="sm100", api="v1")
    caps = replace_caps(MATRIX["b200-deepgemm"][0], package_symbols={})
    selection = resolve(caps, plugins=False, order=["deepgemm", "reference"])
    assert selection.backend.name == "deepgemm"  # resolution does not import the vendor package
    w, s = random_problem(256, 512)
    layer = selection.prepare(w, s)
    assert layer.backends == ("reference",)
    reason = layer.candidates["deepgemm"].reason
    assert "deep_gemm.fp8_gemm_nt" in reason and "SM90 only" in reason and "without it" in reason
    x = torch.randn(3, 512).to(torch.bfloat16)
    assert rel_err(layer(x), expected(x, w, s, BLOCK)) < TOL


def test_deepgemm_not_importable_goes_to_the_next_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm raises ImportError
    selection = resolve(MATRIX["h200-deepgemm"][0], plugins=False, order=["deepgemm", "reference"])
    assert selection.backend.name == "deepgemm"
    layer = selection.prepare(*random_problem(256, 512))
    assert layer.backends == ("reference",)
    assert "import deep_gemm failed: ModuleNotFoundError" in layer.candidates["deepgemm"].reason


# =============================================================================== FlashInfer


@pytest.mark.parametrize("n, k", [(256, 512), (384, 1024)])
def test_flashinfer_trtllm_end_to_end(monkeypatch: pytest.MonkeyPatch, n: int, k: int) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=(10, 0))
    layer, w, s = _layer("b200-flashinfer", "flashinfer", n, k, seed=n)
    prepared = layer.prepared["flashinfer"]
    assert prepared.weight is w and prepared.scale is s and prepared.weight_nk is w
    _run_and_compare(layer, w, s, (1, 5, 16))
    _all_ok(fake)
    call = fake.calls_to("gemm_fp8_nt_groupwise")[1]
    assert call.arguments["backend"] == "trtllm" and call.arguments["a"].shape == (5, k)
    assert call.arguments["a_scale"].stride() == (1, 5) and call.arguments["b_scale"] is s
    # fp16 output is not written by the TRT-LLM kernel: such calls go to the fallback
    assert layer.backend_for(4, torch.float16).name == "reference"
    _run_and_compare(layer, w, s, (4,), dtype=torch.float16)
    assert len(fake.calls_to("gemm_fp8_nt_groupwise")) == 4


def test_flashinfer_trtllm_small_k_goes_to_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=(10, 0))
    layer, w, s = _layer("b200-flashinfer", "flashinfer", 256, 128)
    assert layer.backends == ("reference",)
    assert "K >= 256" in layer.candidates["flashinfer"].reason and "K=128" in layer.candidates["flashinfer"].reason
    _run_and_compare(layer, w, s, (3,))
    assert not fake.calls


@pytest.mark.parametrize("row, cc", [("gb10-flashinfer", (12, 1)), ("rtx5090-flashinfer", (12, 0))])
def test_flashinfer_cutlass_end_to_end(monkeypatch: pytest.MonkeyPatch, row: str, cc: tuple[int, int]) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=cc)
    layer, w, s = _layer(row, "flashinfer", 256, 640, seed=3)
    prepared = layer.prepared["flashinfer"]
    assert prepared.weight_nk is w and prepared.scale.shape == (5, 2) and prepared.scale.is_contiguous()
    assert torch.equal(prepared.scale, s.t())  # "MN" major: transposed once, at load
    _run_and_compare(layer, w, s, (1, 5, 16))
    _run_and_compare(layer, w, s, (6,), dtype=torch.float16)  # fp16 output on the CUTLASS path
    _all_ok(fake)
    call = fake.calls_to("gemm_fp8_nt_groupwise")[1]
    assert call.arguments["backend"] == "cutlass" and call.arguments["scale_major_mode"] == "MN"
    assert call.arguments["a"].shape == (8, 640)  # M=5 padded to a multiple of 4
    assert call.arguments["a_scale"].shape == (5, 8) and call.arguments["a_scale"].is_contiguous()


def test_flashinfer_sm90_small_m_by_rule_any_m_when_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=(9, 0))
    layer, w, s = _layer("h200-flashinfer", "flashinfer", 256, 512, seed=4)
    assert layer.prepared["flashinfer"].weight_nk is w
    # Nothing measured: SGLang's speed rule (M < 32, by bucket) applies; it is no gate.
    assert [layer.backend_for(m).name for m in (1, 31, 32, 33, 1024)] == ["flashinfer"] * 3 + ["reference"] * 2
    assert FlashInferBackend().supports_m(1024, layer.caps).ok
    _run_and_compare(layer, w, s, (1, 5, 31, 32, 40))
    _run_and_compare(layer, w, s, (2,), dtype=torch.float16)  # the kernel quantizes bf16 only: another backend
    _all_ok(fake)
    # A route's first call goes through the public function (which builds the runner), later ones
    # straight to the runner it calls: M 32 shares M 31's bucket, the 3-D call (6 rows) M 5's.
    calls = fake.calls_to("fp8_blockscale_gemm_sm90")
    assert [c.arguments["input"].shape[0] for c in calls] == [1, 5, 31]
    assert calls[0].arguments["input"].dtype == torch.bfloat16 and calls[0].arguments["input_scale"] is None
    assert calls[0].arguments["weight_scale"] is s
    runs = fake.calls_to("run_gemm")
    assert [c.arguments["input"].shape[0] for c in runs] == [1, 5, 31, 32, 6]
    assert all(c.arguments["scales_b"] is s and c.arguments["scales_a"] is None for c in runs)
    sizes = fake.calls_to("get_workspace_size")
    assert [c.arguments["shape_m"] for c in sizes] == [1, 5, 31, 32, 6] and len(fake.calls_to("configure_workspace")) == 5


@pytest.mark.parametrize("runner", ["missing", "incomplete"])
def test_flashinfer_sm90_without_the_runner_calls_the_public_function(monkeypatch: pytest.MonkeyPatch, runner: str) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=(9, 0), runner_factory=runner != "missing")
    asked = []
    if runner == "incomplete":  # a release whose runner lacks a function this one calls
        monkeypatch.setattr(fake.modules["flashinfer.gemm.gemm_base"], "get_fp8_blockscale_gemm_runner_sm90",
                            lambda: asked.append(1) or SimpleNamespace(run_gemm=fake.impl.runner.run_gemm))
    layer, w, s = _layer("h200-flashinfer", "flashinfer", 256, 512, seed=5)
    _run_and_compare(layer, w, s, (3, 3, 4))
    _all_ok(fake)
    assert [c.arguments["input"].shape[0] for c in fake.calls_to("fp8_blockscale_gemm_sm90")] == [3, 3, 4, 6]
    assert len(asked) == (2 if runner == "incomplete" else 0)  # once per route (M 3-4, 5-8), at its first call


def test_flashinfer_wrong_layouts_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "flashinfer", compute_capability=(10, 0))
    monkeypatch.setattr(FlashInferBackend, "trtllm_scale_layout", ROW_MAJOR)
    layer, _, _ = _layer("b200-flashinfer", "flashinfer", 256, 512)
    with pytest.raises(RuntimeError, match="a_scale must be"):
        layer(torch.randn(16, 512).to(torch.bfloat16))
    monkeypatch.undo()
    install(monkeypatch, "flashinfer", compute_capability=(12, 1))
    monkeypatch.setattr(FlashInferBackend, "cutlass_scale_layout", ROW_MAJOR)
    layer, _, _ = _layer("gb10-flashinfer", "flashinfer", 256, 512)
    with pytest.raises(RuntimeError, match="a_scale must be a contiguous"):
        layer(torch.randn(16, 512).to(torch.bfloat16))


# =============================================================================== CUTLASS (sgl-kernel)


@pytest.mark.parametrize("row, sm", [("h200-sglkernel", 90), ("b200-sglkernel", 100)])
def test_cutlass_end_to_end(monkeypatch: pytest.MonkeyPatch, row: str, sm: int) -> None:
    fake = install(monkeypatch, "sgl_kernel", sm_version=sm)
    layer, w, s = _layer(row, "cutlass", 256, 768, seed=sm)
    prepared = layer.prepared["cutlass"]
    assert prepared.weight_nk is w and prepared.weight.t() is not None
    assert prepared.weight.data_ptr() == w.data_ptr() and prepared.scale.data_ptr() == s.data_ptr()  # views, no copy
    _run_and_compare(layer, w, s, (1, 5, 16))
    _run_and_compare(layer, w, s, (4,), dtype=torch.float16)
    _all_ok(fake)
    call = fake.calls_to("fp8_blockwise_scaled_mm")[1]
    assert call.arguments["mat_b"].stride() == (1, 768) and call.arguments["scales_b"].stride() == (1, 6)
    assert call.arguments["scales_a"].stride(0) == 1


def test_cutlass_unaligned_n_goes_to_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "sgl_kernel", sm_version=90)
    layer, w, s = _layer("h200-sglkernel", "cutlass", 192, 512)
    assert layer.backends == ("reference",) and "N % 128 == 0" in layer.candidates["cutlass"].reason
    _run_and_compare(layer, w, s, (2,))
    assert not fake.calls


def test_cutlass_wrong_layout_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "sgl_kernel", sm_version=90)
    monkeypatch.setattr(CutlassBackend, "activation_scale_layout", ROW_MAJOR)
    layer, _, _ = _layer("h200-sglkernel", "cutlass", 256, 512)
    with pytest.raises(RuntimeError, match="scales_a must be M major"):
        layer(torch.randn(16, 512).to(torch.bfloat16))


# =============================================================================== AITER


def _fnuz(w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gfx942 operands, converted independently of the adapter: half the value, double the scale."""
    return (w.float() / 2).to(torch.float8_e4m3fnuz), s * 2


def test_aiter_gfx942_normalises_to_fnuz(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "aiter", gfx="gfx942")
    layer, w, s = _layer("mi300x-aiter", "aiter", 256, 512, seed=5)
    prepared = layer.prepared["aiter"]
    w_fnuz, s_fnuz = _fnuz(w, s)
    assert prepared.weight.dtype == torch.float8_e4m3fnuz and torch.equal(prepared.scale, s_fnuz)
    assert torch.equal(prepared.weight.float(), w_fnuz.float())
    assert layer.memory() == {"checkpoint_held": False, "copies": 1, "copy_bytes": 256 * 512}  # the fnuz copy only
    _run_and_compare(layer, w_fnuz, s_fnuz, (1, 5, 16))  # activations are quantized to e4m3fnuz (max 240)
    _all_ok(fake)
    call = fake.calls_to("gemm_a8w8_blockscale")[1]
    assert call.arguments["XQ"].dtype == torch.float8_e4m3fnuz and call.arguments["x_scale"].is_contiguous()


def test_aiter_gfx942_converts_pre_quantized_e4m3fn_input(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "aiter", gfx="gfx942")
    layer, w, s = _layer("mi300x-aiter", "aiter", 256, 512, out_dtype=torch.bfloat16)
    q, xs = quantize_groups(torch.randn(6, 512))
    y = layer(q.contiguous(), input_scale=xs.float())
    assert rel_err(y, expected(q, w, s, BLOCK, input_scale=xs)) < TOL


def test_aiter_gfx950_shares_the_weight_and_avoids_large_m(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "aiter", gfx="gfx950")
    layer, w, s = _layer("mi355x-aiter", "aiter", 256, 512, seed=6)
    assert layer.prepared["aiter"].weight is w and layer.prepared["aiter"].weight_nk is w
    _run_and_compare(layer, w, s, (1, 5, 16))
    _all_ok(fake)
    # HIP 6.4 < 7.2: the non-preshuffled CK kernel gave NaN at M >= 4096 in SGLang; the plan keeps a
    # backend out of a whole M bucket (2049..4096) where its gate rejects part of it
    assert layer.backend_for(2048).name == "aiter" and layer.backend_for(2049).name == "reference"


def test_aiter_gfx950_preshuffle_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, "aiter", gfx="gfx950")
    layer, w, s = _layer("mi355x-aiter-preshuffle", "aiter", 256, 512, seed=8)
    prepared = layer.prepared["aiter"]
    assert prepared.extra["preshuffled"] and prepared.weight_nk is None
    assert torch.equal(prepared.weight.view(torch.uint8), vl.shuffle_weight_16x16(w).view(torch.uint8))
    _run_and_compare(layer, w, s, (1, 5, 16))
    _all_ok(fake)
    call = fake.calls_to("gemm_a8w8_blockscale_bpreshuffle")[1]
    assert call.arguments["x_scale"].stride() == (1, 5)  # column-major activation scales
    assert layer.backend_for(8192).name == "aiter"  # HIP 7.2 preshuffle path: no large-M limit known


def test_aiter_wrong_layouts_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "aiter", gfx="gfx942")
    monkeypatch.setattr(AiterBackend, "normalise_fnuz", False)
    layer, _, _ = _layer("mi300x-aiter", "aiter", 256, 512)
    with pytest.raises(RuntimeError, match=r"must be torch\.float8_e4m3fnuz"):
        layer(torch.randn(16, 512).to(torch.bfloat16))
    monkeypatch.undo()
    install(monkeypatch, "aiter", gfx="gfx950")
    monkeypatch.setattr(AiterBackend, "preshuffle_scale_layout", ROW_MAJOR)
    layer, _, _ = _layer("mi355x-aiter-preshuffle", "aiter", 256, 512)
    with pytest.raises(RuntimeError, match="column-major"):
        layer(torch.randn(16, 512).to(torch.bfloat16))


# =============================================================================== Ascend NPU


@pytest.mark.parametrize("row", ["ascend-950", "ascend-950-by-soc"])
def test_npu_end_to_end(monkeypatch: pytest.MonkeyPatch, row: str) -> None:
    fake = install(monkeypatch, "torch_npu")
    layer, w, s = _layer(row, "npu", 256, 640, seed=9)
    prepared = layer.prepared["npu"]
    assert prepared.weight.shape == (640, 256) and prepared.weight.t() is not None and prepared.weight_nk is w
    assert prepared.weight.data_ptr() == w.data_ptr() and prepared.scale.shape == (5, 2)
    assert torch.equal(prepared.scale, s.t())
    _run_and_compare(layer, w, s, (1, 5, 16))
    _run_and_compare(layer, w, s, (4,), dtype=torch.float16)
    _all_ok(fake)
    quant = fake.calls_to("npu_dynamic_block_quant")[1].arguments
    assert quant["dst_type"] == torch.float8_e4m3fn and (quant["row_block_size"], quant["col_block_size"]) == (1, 128)
    call = fake.calls_to("npu_quant_matmul")[1].arguments
    assert call["group_sizes"] == [1, 128, 128] and call["bias"].dtype == torch.float32
    assert call["pertoken_scale"].shape == (5, 5)


def test_npu_wrong_layout_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "torch_npu")
    monkeypatch.setattr(NpuBackend, "transpose_views", False)  # scale materialised, weight a view: mismatch
    layer, _, _ = _layer("ascend-950", "npu", 256, 512)
    with pytest.raises(RuntimeError, match="transposition of scale"):
        layer(torch.randn(16, 512).to(torch.bfloat16))


# =============================================================================== pre-quantized input


@pytest.mark.parametrize("row, backend, vendor, knobs, runs_on", [
    ("b200-flashinfer", "flashinfer", "flashinfer", {"compute_capability": (10, 0)}, "flashinfer"),
    ("gb10-flashinfer", "flashinfer", "flashinfer", {"compute_capability": (12, 1)}, "flashinfer"),
    ("h200-flashinfer", "flashinfer", "flashinfer", {"compute_capability": (9, 0)}, "reference"),
    ("h200-sglkernel", "cutlass", "sgl_kernel", {"sm_version": 90}, "cutlass"),
    ("mi355x-aiter", "aiter", "aiter", {"gfx": "gfx950"}, "aiter"),
    ("mi355x-aiter-preshuffle", "aiter", "aiter", {"gfx": "gfx950"}, "aiter"),
    ("ascend-950", "npu", "torch_npu", {}, "npu"),
])
def test_pre_quantized_input(monkeypatch: pytest.MonkeyPatch, row: str, backend: str, vendor: str,
                             knobs: dict[str, object], runs_on: str) -> None:
    """A caller's fp8 activations with row-major [M, K/128] scales, re-laid out where the kernel needs it."""
    fake = install(monkeypatch, vendor, **knobs)
    layer, w, s = _layer(row, backend, 256, 512, out_dtype=torch.bfloat16)
    for m in (1, 5):
        q, xs = quantize_groups(torch.randn(m, 512))
        assert layer.backend_for(m, torch.float8_e4m3fn).name == runs_on
        y = layer(q.contiguous(), input_scale=xs.float())
        assert rel_err(y, expected(q, w, s, BLOCK, input_scale=xs)) < TOL
    assert all(c.ok for c in fake.calls) and bool(fake.calls) == (runs_on == backend)


@pytest.mark.parametrize("row, backend, vendor, knobs", [
    ("h200-sglkernel", "cutlass", "sgl_kernel", {"sm_version": 90}),
    ("b200-flashinfer", "flashinfer", "flashinfer", {"compute_capability": (10, 0)}),
    ("gb10-flashinfer", "flashinfer", "flashinfer", {"compute_capability": (12, 1)}),
])
def test_pre_quantized_row_strided_input_is_packed(monkeypatch: pytest.MonkeyPatch, row: str, backend: str, vendor: str,
                                                   knobs: dict[str, object]) -> None:
    """A caller's fp8 activation that is a column slice of a wider tensor (rows K + 128 apart) is
    handed to kernels that read rows K apart as a packed copy."""
    fake = install(monkeypatch, vendor, **knobs)
    layer, w, s = _layer(row, backend, 256, 512, out_dtype=torch.bfloat16)
    q, xs = quantize_groups(torch.randn(8, 512))
    wide = torch.zeros(8, 640, dtype=torch.float8_e4m3fn)
    wide[:, :512] = q
    y = layer(wide[:, :512], input_scale=xs.float())
    assert rel_err(y, expected(q, w, s, BLOCK, input_scale=xs)) < TOL
    _all_ok(fake)


# =============================================================================== explain: rejections


REJECTIONS = [
    # (snapshot, backend, fragments its rejection reason must contain)
    ("gb10-deepgemm", "deepgemm", ("compute capability sm90", "sm100", "found sm121")),
    ("rtx5090-deepgemm", "deepgemm", ("found sm120",)),
    ("a100-deepgemm", "deepgemm", ("found sm80",)),
    ("b200", "deepgemm", ("package deep_gemm", "not installed")),
    ("b200-deepgemm-cuda12.8", "deepgemm", ("CUDA>=12.9", "12.8")),
    ("b200-deepgemm-v1", "deepgemm", ("exposing fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt", "SM90 only")),
    ("h100-deepgemm-no-entry-point", "deepgemm", ("fp8_gemm_nt or gemm_fp8_fp8_bf16_nt", "none of the entry points")),
    ("b200", "flashinfer", ("package flashinfer", "not installed")),
    ("a100-flashinfer", "flashinfer", ("sm100/sm103", "sm120/sm121", "found sm80")),
    ("b200-flashinfer-0.2.8", "flashinfer", ("flashinfer>=0.2.9", "0.2.8")),
    ("h200-flashinfer-0.5", "flashinfer", ("flashinfer>=0.6.0", "0.5.3")),
    ("b200", "cutlass", ("package sgl_kernel", "not installed")),
    ("rtx5090-sglkernel", "cutlass", ("found sm120",)),
    ("mi300x", "aiter", ("package aiter", "not installed")),
    ("mi300x-aiter-no-flag", "aiter", ("FP8SELECT_USE_AITER=1", "unset")),
    ("h200-deepgemm", "aiter", ("device rocm", "found cuda")),
    ("ascend-910b", "npu", ("Ascend A5/arch35", "Ascend910B3", "SoC version 223")),
    ("ascend-950-no-torch-npu", "npu", ("package torch_npu", "not installed")),
    ("mi300x-aiter", "npu", ("device npu", "found rocm")),
]


@pytest.mark.parametrize("row, backend, fragments", REJECTIONS)
def test_explain_states_why_a_vendor_backend_is_rejected(row: str, backend: str, fragments: tuple[str, ...]) -> None:
    selection = resolve(MATRIX[row][0], plugins=False)
    verdict = next(c for c in selection.verdicts if c.name == backend)
    assert not verdict.accepted and selection.backend.name != backend
    assert verdict.reason.startswith("requires") and "found" in verdict.reason
    for fragment in fragments:
        assert fragment in verdict.reason, (fragment, verdict.reason)
    line = next(ln for ln in selection.explain().splitlines() if ln.split()[1:2] == [backend])
    assert "rejected" in line and verdict.reason in line


VENDORS = ("deepgemm", "flashinfer", "cutlass", "aiter", "npu")


@pytest.mark.parametrize("row", sorted(MATRIX))
def test_every_vendor_rejection_in_the_matrix_names_required_and_found(row: str) -> None:
    selection = resolve(MATRIX[row][0], plugins=False)
    for c in selection.verdicts:
        if c.name in VENDORS and not c.accepted:
            assert c.reason.startswith("requires") and "found" in c.reason, (row, c)


def test_resolution_imports_no_vendor_package(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("deep_gemm", "flashinfer", "sgl_kernel", "aiter", "torch_npu"):
        monkeypatch.setitem(sys.modules, module, None)  # any import would raise
    for row in ("h200-deepgemm", "b200-flashinfer", "h200-sglkernel", "mi300x-aiter", "ascend-950"):
        caps, choice = MATRIX[row]
        assert resolve(caps, plugins=False).backend.name == choice


# =============================================================================== snapshot: package_symbols


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_package_symbols_are_read_from_source_without_importing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write(tmp_path, "deep_gemm/__init__.py", "raise RuntimeError('imported')\nfrom ._C import (\n    fp8_gemm_nt, fp8_gemm_nn,\n)\n")
    _write(tmp_path, "flashinfer/gemm/__init__.py", "from .gemm_base import gemm_fp8_nt_groupwise as gemm_fp8_nt_groupwise\n")
    _write(tmp_path, "flashinfer/__init__.py", "raise RuntimeError('imported')\n")
    _write(tmp_path, "sgl_kernel/__init__.py", "from sgl_kernel.gemm import *\n")  # star import: unknown
    _write(tmp_path, "aiter/__init__.py", "raise RuntimeError('imported')\n")
    _write(tmp_path, "aiter/ops/gemm_op_a8w8.py", "def gemm_a8w8_blockscale_bpreshuffle(XQ, WQ, x_scale, w_scale): ...\n")
    for module in ("deep_gemm", "flashinfer", "sgl_kernel", "aiter"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    packages = {"deep_gemm": "2.1.1", "flashinfer": "0.6.1", "sgl_kernel": "0.3.9", "aiter": "0.1.5"}
    found = _package_symbols(packages)
    # gemm_a8w8_blockscale is not matched inside gemm_a8w8_blockscale_bpreshuffle (whole words only)
    assert found == {"deep_gemm": ("fp8_gemm_nt",), "flashinfer": ("gemm_fp8_nt_groupwise",),
                     "aiter": ("gemm_a8w8_blockscale_bpreshuffle",)}
    assert not any(m in sys.modules for m in packages)
    assert _package_symbols({}) == {}


def test_vendor_versions_are_read_from_their_distributions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The distributions of the real vendor builds: ``deep_gemm`` (2.6.1+local from a source build),
    ``flashinfer-python`` and ``sglang-kernel`` (whose import name is ``sgl_kernel``)."""
    for module, dist, version in (("deep_gemm", "deep_gemm", "2.6.1+local"),
                                  ("flashinfer", "flashinfer-python", "0.7.2.post1"),
                                  ("sgl_kernel", "sglang-kernel", "0.4.4")):
        _write(tmp_path, f"{module}/__init__.py", "raise RuntimeError('imported')\n")
        info = f"{dist.replace('-', '_')}-{version}.dist-info"
        _write(tmp_path, f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        _write(tmp_path, f"{info}/top_level.txt", f"{module}\n")
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    found = _installed_packages()
    assert {m: found.get(m) for m in ("deep_gemm", "flashinfer", "sgl_kernel")} == {
        "deep_gemm": "2.6.1+local", "flashinfer": "0.7.2.post1", "sgl_kernel": "0.4.4"}


def test_package_symbols_round_trip_and_validation() -> None:
    caps = MATRIX["b200-deepgemm-v1"][0]
    data = caps.to_dict()
    assert data["package_symbols"] == {"deep_gemm": ["gemm_fp8_fp8_bf16_nt"]}
    assert Capabilities.from_json(caps.to_json()) == caps
    older = {k: v for k, v in data.items() if k != "package_symbols"}  # a snapshot from before the field
    assert Capabilities.from_dict(older).package_symbols == {}
    for bad in ({"deep_gemm": "fp8_gemm_nt"}, {"deep_gemm": [1]}, ["deep_gemm"]):
        with pytest.raises(CapabilitiesError, match="package_symbols"):
            Capabilities.from_dict({**data, "package_symbols": bad})
    edited = caps.with_overrides({"package_symbols.deep_gemm": '["fp8_gemm_nt"]'})
    assert edited.package_symbols == {"deep_gemm": ("fp8_gemm_nt",)}
    assert resolve(edited, plugins=False).backend.name == "deepgemm"


def test_a_vendor_the_plan_does_not_use_is_never_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot recorded DeepGEMM's entry points, so its gate accepts without importing it; the
    plan runs the reference (first in this order, nothing measured), so nothing imports deep_gemm (its import takes
    seconds for some vendors)."""
    imported: list[str] = []
    monkeypatch.delitem(sys.modules, "deep_gemm", raising=False)
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real_import(name, *a))
    selection = resolve(MATRIX["h200-deepgemm"][0], plugins=False, order=["reference", "deepgemm"], tuning=False)
    layer = selection.prepare(*random_problem(256, 512))
    assert layer.backends == ("reference",) and layer.candidates["deepgemm"].accepted
    assert "deep_gemm" not in imported and "deep_gemm" not in sys.modules


def test_deepgemm_warms_up_by_building_its_smallest_layout_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up starts DeepGEMM's JIT compiler with one call of its public layout function on a tiny
    row-major fp32 scale tensor (which its transpose kernel re-lays out), on the device given."""
    fake = install(monkeypatch, "deep_gemm", arch="sm90")
    DeepGemmBackend().warm_up(MATRIX["h200-deepgemm"][0], torch.device("cpu"))
    (call,) = fake.calls_to("get_mn_major_tma_aligned_tensor")
    sf = call.arguments["sf"]
    assert sf.dtype == torch.float32 and sf.shape == (8, 4) and sf.stride() == (4, 1) and sf.device.type == "cpu"
