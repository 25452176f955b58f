"""The vendor fakes accept correctly formed calls, compute the right numbers, and reject wrong ones.

Every accepted call here is built by hand the way ``docs/vendor-apis.md`` says an adapter must
build it; every rejected call differs from an accepted one in exactly one documented respect.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fakes import (
    BlockFP8Problem,
    FakeVendor,
    ceil_div,
    dequantize_blockwise,
    fake_vendor,  # noqa: F401 - registers the fixture in this module
    install,
    installed,
    make_problem,
    round_up,
    unpack_ue8m0,
)

M, N, K = 16, 256, 512


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``out`` against the float64 reference."""
    return float((out.to(torch.float64) - ref).norm() / ref.norm())


def close(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-2) -> bool:
    """``out`` matches ``ref`` up to output rounding."""
    return rel_err(out, ref) < tol


@pytest.fixture(scope="module")
def problem() -> BlockFP8Problem:
    return make_problem(M, N, K, seed=1)


@pytest.fixture(scope="module")
def pow2_problem() -> BlockFP8Problem:
    return make_problem(M, N, K, seed=2, pow2_scales=True)


# =============================================================================== installation


def test_install_registers_modules_and_restores_sys_modules() -> None:
    assert "deep_gemm" not in sys.modules
    with installed("flashinfer") as fake:
        import flashinfer
        from flashinfer.gemm import gemm_fp8_nt_groupwise

        assert flashinfer is fake.module
        assert gemm_fp8_nt_groupwise is fake.modules["flashinfer.gemm"].gemm_fp8_nt_groupwise
    assert "flashinfer" not in sys.modules and "flashinfer.gemm" not in sys.modules


def test_fake_vendor_fixture_and_find_spec(fake_vendor: Callable[..., FakeVendor]) -> None:  # noqa: F811
    fake = fake_vendor("torch_npu", device_name="Ascend910B2", soc_version=220)
    spec = importlib.util.find_spec("torch_npu")
    assert spec is not None and spec.name == "torch_npu"
    import torch_npu

    assert torch_npu._C._npu_get_soc_version() == 220 and not fake.impl.is_arch35
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torch_npu.contrib")


def test_unknown_vendor_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LookupError, match="no fake for vendor"):
        install(monkeypatch, "cublas")


def test_calls_are_recorded_with_bound_arguments(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    fake = install(monkeypatch, "deep_gemm")
    import deep_gemm

    sfa = deep_gemm.get_mn_major_tma_aligned_tensor(problem.x_scale)
    d = torch.empty(M, N, dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt((problem.x_q, sfa), (problem.w_q, problem.w_scale), d)
    call = fake.last("fp8_gemm_nt")
    assert call.ok and call.arguments["d"] is d and call.arguments["disable_ue8m0_cast"] is False
    assert "float8_e4m3fn[16, 512]" in repr(call)
    with pytest.raises(RuntimeError):
        deep_gemm.fp8_gemm_nt((problem.x_q, problem.x_scale), (problem.w_q, problem.w_scale), d)
    assert not fake.last().ok and isinstance(fake.last().error, RuntimeError)
    assert [c.function for c in fake.calls] == ["get_mn_major_tma_aligned_tensor", "fp8_gemm_nt", "fp8_gemm_nt"]
    with pytest.raises(TypeError):
        deep_gemm.fp8_gemm_nt((problem.x_q, sfa), (problem.w_q, problem.w_scale), d, alpha=1.0)  # not in 2.6.1
    assert isinstance(fake.last().error, TypeError)
    fake.clear_calls()
    with pytest.raises(LookupError):
        fake.last()


def test_fixture_helpers_agree(problem: BlockFP8Problem) -> None:
    assert ceil_div(257, 128) == 3 and round_up(6, 4) == 8
    direct = problem.x_q.double() * problem.x_scale.double().repeat_interleave(128, 1)
    assert torch.equal(dequantize_blockwise(problem.x_q, problem.x_scale, 1, 128), direct)


# =============================================================================== DeepGEMM


def _deepgemm(monkeypatch: pytest.MonkeyPatch, **options: Any) -> tuple[FakeVendor, Any]:
    fake = install(monkeypatch, "deep_gemm", **options)
    return fake, fake.module


def test_deepgemm_sm90_accepts_tma_aligned_mn_major_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    p = make_problem(6, 128, 256, seed=3)  # M = 6: the scale is padded to 8 rows
    _, dg = _deepgemm(monkeypatch, arch="sm90")
    sfa = dg.get_mn_major_tma_aligned_tensor(p.x_scale)
    assert sfa.shape == (6, 2) and sfa.stride() == (1, 8)
    assert dg.get_mn_major_tma_aligned_tensor(sfa) is sfa
    assert dg.get_tma_aligned_size(6, 4) == 8
    d = torch.zeros(6, 128, dtype=torch.bfloat16)
    assert dg.fp8_gemm_nt((p.x_q, sfa), (p.w_q, p.w_scale), d) is None
    assert close(d, p.reference)
    d2 = torch.zeros_like(d)
    dg.fp8_gemm_nt((p.x_q, sfa), (p.w_q, p.w_scale.t().contiguous().t()), d2)  # transposed-contiguous SFB
    assert torch.equal(d, d2)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("row_major_sfa", "MN-major and TMA-aligned"),
        ("unpadded_sfa", "MN-major and TMA-aligned"),
        ("int_scales_on_sm90", "FP32 SFA and SFB"),
        ("e5m2_input", "kFloat8_e4m3fn"),
        ("fp16_output", "kBFloat16 or kFloat"),
        ("column_major_output", "row-major output"),
        ("wrong_output_shape", "m == m_"),
        ("misaligned_a_rows", "a leading stride is 16-byte aligned"),
        ("mn_major_b", "K-major"),
        ("accumulate_on_sm90", "not c.has_value"),
        ("wrong_sfb_shape", "sfb shape"),
    ],
)
def test_deepgemm_sm90_rejects(monkeypatch: pytest.MonkeyPatch, case: str, match: str) -> None:
    p = make_problem(6, 128, 256, seed=4)
    _, dg = _deepgemm(monkeypatch, arch="sm90")
    n = p.n
    a, sfa = p.x_q, dg.get_mn_major_tma_aligned_tensor(p.x_scale)
    b, sfb = p.w_q, p.w_scale
    d, c = torch.zeros(6, n, dtype=torch.bfloat16), None
    if case == "row_major_sfa":
        sfa = p.x_scale
    elif case == "unpadded_sfa":
        sfa = p.x_scale.t().contiguous().t()  # MN-major but strides (1, 6), not (1, 8)
    elif case == "int_scales_on_sm90":
        sfa = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(p.x_scale)
    elif case == "e5m2_input":
        a = p.x_q.to(torch.float8_e5m2)
    elif case == "fp16_output":
        d = d.half()
    elif case == "column_major_output":
        d = torch.zeros(n, 6, dtype=torch.bfloat16).t()
    elif case == "wrong_output_shape":
        d = torch.zeros(8, n, dtype=torch.bfloat16)
    elif case == "mn_major_b":
        b = p.w_q.t().contiguous().t()
    elif case == "misaligned_a_rows":  # rows 264 bytes apart: no TMA descriptor
        a = torch.zeros(6, 264, dtype=torch.float8_e4m3fn)[:, :256]
        a.copy_(p.x_q)
    elif case == "accumulate_on_sm90":
        c = torch.zeros_like(d)
    elif case == "wrong_sfb_shape":
        sfb = p.w_scale.repeat_interleave(128, 0)[:n]  # per-row [N, K/128] needs recipe (1, 1, 128)
    with pytest.raises(RuntimeError, match=match):
        dg.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c)


def test_deepgemm_transform_mode_accepts_row_major_sfa_on_sm90(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    _, dg = _deepgemm(monkeypatch, arch="sm90", layout_check="transform")
    d = torch.zeros(M, N, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((problem.x_q, problem.x_scale), (problem.w_q, problem.w_scale), d)
    assert close(d, problem.reference)


def test_deepgemm_ue8m0_packing_order_and_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    _, dg = _deepgemm(monkeypatch, arch="sm100")
    exps = torch.tensor([[120, 121, 122, 123, 124], [125, 126, 127, 128, 129], [1, 2, 3, 4, 5]], dtype=torch.int32)
    sf = (exps << 23).view(torch.float32) * 1.5  # not powers of two: packing keeps the exponent only
    packed = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert packed.dtype == torch.int32 and packed.shape == (3, 2) and packed.stride() == (1, 4)
    assert int(packed[0, 0]) == 120 | 121 << 8 | 122 << 16 | 123 << 24  # group 4j in the lowest byte
    assert int(packed[0, 1]) == 124  # padding groups are zero
    assert torch.equal(unpack_ue8m0(packed, 5), torch.exp2(exps.double() - 127))


def _packed_weight_scale(dg: Any, p: BlockFP8Problem) -> torch.Tensor:
    """SGLang's ``transform_scale_ue8m0``: broadcast the 128-row blocks to rows, then pack."""
    per_row = p.w_scale.index_select(0, torch.arange(p.n) // 128)
    return dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(per_row)


def test_deepgemm_sm100_accepts_packed_ue8m0(monkeypatch: pytest.MonkeyPatch, pow2_problem: BlockFP8Problem) -> None:
    _, dg = _deepgemm(monkeypatch, arch="sm100")
    p = pow2_problem
    sfa = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(p.x_scale)
    sfb = _packed_weight_scale(dg, p)
    assert sfb.shape == (N, ceil_div(K // 128, 4)) and sfb.stride() == (1, N)
    d = torch.zeros(M, N, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((p.x_q, sfa), (p.w_q, sfb), d)
    assert close(d, p.reference)
    c = torch.ones(M, N, dtype=torch.float32)
    d32 = torch.zeros(M, N, dtype=torch.float32)
    dg.fp8_gemm_nt((p.x_q, sfa), (p.w_q, sfb), d32, c=c, recipe=(1, 1, 128))
    assert close(d32, p.reference + 1.0, 1e-5)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("fp32_sfa", "packed UE8M0"),
        ("fp32_sfb", "packed UE8M0"),
        ("packed_without_tma_padding", "TMA-aligned MN"),
        ("packed_k_major", r"stride\(-2\) == 1"),
        ("block_recipe_with_packed_sfb", "sfb shape"),
        ("disable_cast_with_fp32", "Unsupported architecture or scaling factor types"),
    ],
)
def test_deepgemm_sm100_rejects(monkeypatch: pytest.MonkeyPatch, case: str, match: str) -> None:
    p = make_problem(6, 128, 768, seed=5, pow2_scales=True)  # M = 6, K/128 = 6 groups -> 2 packed words
    _, dg = _deepgemm(monkeypatch, arch="sm100")
    sfa = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(p.x_scale)
    sfb = _packed_weight_scale(dg, p)
    d = torch.zeros(6, 128, dtype=torch.bfloat16)
    kwargs: dict[str, object] = {}
    if case == "fp32_sfa":
        sfa = p.x_scale
    elif case == "fp32_sfb":
        sfb = p.w_scale
    elif case == "packed_without_tma_padding":
        sfa = sfa.t().contiguous().t()  # MN-major, strides (1, 6) instead of (1, 8)
    elif case == "packed_k_major":
        sfa = sfa.contiguous()
    elif case == "block_recipe_with_packed_sfb":
        kwargs["recipe"] = (1, 128, 128)
    elif case == "disable_cast_with_fp32":
        dg.set_layout_check("transform")
        sfa, sfb = dg.get_mn_major_tma_aligned_tensor(p.x_scale), p.w_scale
        kwargs["disable_ue8m0_cast"] = True
    with pytest.raises(RuntimeError, match=match):
        dg.fp8_gemm_nt((p.x_q, sfa), (p.w_q, sfb), d, **kwargs)


def test_deepgemm_sm100_transform_mode_truncates_fp32_scales(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    fake, dg = _deepgemm(monkeypatch, arch="sm100", layout_check="transform")
    d = torch.zeros(M, N, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((problem.x_q, dg.get_mn_major_tma_aligned_tensor(problem.x_scale)), (problem.w_q, problem.w_scale), d)
    floor2 = dg.FAKE  # the knob object is also reachable from the module
    assert floor2 is fake.impl
    truncated_x = torch.exp2(torch.floor(torch.log2(problem.x_scale)))
    truncated_w = torch.exp2(torch.floor(torch.log2(problem.w_scale)))
    silently = dequantize_blockwise(problem.x_q, truncated_x, 1, 128) @ dequantize_blockwise(problem.w_q, truncated_w, 128, 128).T
    assert close(d, silently) and not close(d, problem.reference, 0.1)


def test_deepgemm_arch_knob_is_resettable(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    fake, dg = _deepgemm(monkeypatch, arch="sm90")
    dg.set_arch("sm120")
    d = torch.zeros(M, N, dtype=torch.bfloat16)
    sfa = dg.get_mn_major_tma_aligned_tensor(problem.x_scale)
    with pytest.raises(RuntimeError, match="Unsupported architecture"):
        dg.fp8_gemm_nt((problem.x_q, sfa), (problem.w_q, problem.w_scale), d)
    dg.reset()
    assert fake.impl.arch == "sm90"
    dg.fp8_gemm_nt((problem.x_q, sfa), (problem.w_q, problem.w_scale), d)
    assert close(d, problem.reference)


def test_deepgemm_asserts_no_n_or_k_multiple_in_2x(monkeypatch: pytest.MonkeyPatch) -> None:
    # DeepGEMM 2.6.1's host code has no N % 64 / K % 128 assert (only TMA alignment); v1 has one.
    p = make_problem(6, 160, 256, seed=9)
    _, dg = _deepgemm(monkeypatch, arch="sm90")
    d = torch.zeros(6, 160, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((p.x_q, dg.get_mn_major_tma_aligned_tensor(p.x_scale)), (p.w_q, p.w_scale), d)
    assert close(d, p.reference)
    _, dg1 = _deepgemm(monkeypatch, api="v1")
    with pytest.raises(AssertionError, match="n % 64 == 0"):
        dg1.gemm_fp8_fp8_bf16_nt((p.x_q, dg1.get_col_major_tma_aligned_tensor(p.x_scale)), (p.w_q, p.w_scale), d)


def test_deepgemm_api_variants(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    _, dg26 = _deepgemm(monkeypatch)  # the default: DeepGEMM 2.6.1 as read at commit 54e2261
    params = inspect.signature(dg26.fp8_gemm_nt).parameters
    assert dg26.__version__ == "2.6.1" and dg26.fp8_gemm_nt is dg26.fp8_fp4_gemm_nt
    assert list(params) == ["a", "b", "d", "c", "recipe", "recipe_a", "recipe_b", "compiled_dims", "disable_ue8m0_cast"]
    _, dg2 = _deepgemm(monkeypatch, api="v2")
    assert "recipe_a" not in inspect.signature(dg2.fp8_gemm_nt).parameters and not hasattr(dg2, "fp8_fp4_gemm_nt")
    _, dg28 = _deepgemm(monkeypatch, api="v2.8")
    assert "recipe_a" in inspect.signature(dg28.fp8_gemm_nt).parameters
    assert dg28.__version__ == "2.8.0" and dg28.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor

    fake, dg1 = _deepgemm(monkeypatch, api="v1")
    assert not hasattr(dg1, "fp8_gemm_nt") and "deep_gemm.utils" not in fake.modules
    out = torch.zeros(M, N, dtype=torch.bfloat16)
    sfa = dg1.get_col_major_tma_aligned_tensor(problem.x_scale)
    dg1.gemm_fp8_fp8_bf16_nt((problem.x_q, sfa), (problem.w_q, problem.w_scale), out)
    assert close(out, problem.reference)
    with pytest.raises(AssertionError, match=r"rhs_scales\.is_contiguous"):
        dg1.gemm_fp8_fp8_bf16_nt((problem.x_q, sfa), (problem.w_q, problem.w_scale.t().contiguous().t()), out)
    with pytest.raises(AssertionError, match="TMA-aligned and transposed"):
        dg1.gemm_fp8_fp8_bf16_nt((problem.x_q, problem.x_scale), (problem.w_q, problem.w_scale), out)


def test_deepgemm_transform_sf_into_required_layout(monkeypatch: pytest.MonkeyPatch, pow2_problem: BlockFP8Problem) -> None:
    _, dg = _deepgemm(monkeypatch, arch="sm100")
    p = pow2_problem
    sfb = dg.transform_sf_into_required_layout(p.w_scale, mn=N, k=K, recipe=(1, 128, 128), is_sfa=False)
    assert torch.equal(sfb, _packed_weight_scale(dg, p))
    with pytest.raises(RuntimeError, match="is_sfa"):
        dg.transform_sf_into_required_layout(p.w_scale, mn=N, k=K, recipe=(1, 128, 128))


# =============================================================================== FlashInfer


def test_flashinfer_trtllm_accepts_sglang_layouts(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    install(monkeypatch, "flashinfer", compute_capability=(10, 0))
    from flashinfer.gemm import gemm_fp8_nt_groupwise

    column_major = problem.x_scale.t().contiguous().t()  # (M, K/128), strides (1, M)
    out = gemm_fp8_nt_groupwise(problem.x_q, problem.w_q, column_major, problem.w_scale, out_dtype=torch.bfloat16, backend="trtllm")
    assert out.shape == (M, N) and out.dtype == torch.bfloat16 and close(out, problem.reference)
    # FlashInfer's own test passes the same memory as a (K/128, M) tensor and b_scale (N/128, K/128).
    buf = torch.empty(M, N, dtype=torch.bfloat16)
    same = gemm_fp8_nt_groupwise(
        problem.x_q, problem.w_q, problem.x_scale.t().contiguous(), problem.w_scale, "MN", out=buf, backend="trtllm"
    )
    assert same is buf and torch.equal(same, out)


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("k_below_256", ValueError, ">= 256 in TRTLLM"),
        ("fp16_out", RuntimeError, "bfloat16 only"),
        ("row_major_a_scale", RuntimeError, "contiguous on the first dimension"),
        ("transposed_b_scale_copy", RuntimeError, "b_scale must be"),
        ("sm120", Exception, "does not support backend 'trtllm' with capability 120"),
        ("block_granularity", ValueError, r"\(1, 128, 128\) in TRTLLM"),
        ("fp32_out", ValueError, "Unsupported output dtype"),
    ],
)
def test_flashinfer_trtllm_rejects(
    monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem, case: str, error: type[Exception], match: str
) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=(10, 0))
    gemm = fake.module.gemm.gemm_fp8_nt_groupwise
    p = make_problem(M, N, 128, seed=6) if case == "k_below_256" else problem
    a_scale, b_scale = p.x_scale.t().contiguous().t(), p.w_scale
    kwargs: dict[str, object] = {"backend": "trtllm", "out_dtype": torch.bfloat16}
    if case == "fp16_out":
        kwargs["out_dtype"] = torch.float16
    elif case == "fp32_out":
        kwargs["out_dtype"] = torch.float32
    elif case == "row_major_a_scale":
        a_scale = p.x_scale
    elif case == "transposed_b_scale_copy":
        b_scale = p.w_scale.t().contiguous()  # (K/128, N/128) row-major: not the expected memory
    elif case == "sm120":
        fake.impl.set_compute_capability((12, 0))
    elif case == "block_granularity":
        kwargs["scale_granularity_mnk"] = (128, 128, 128)
    with pytest.raises(error, match=match) as info:
        gemm(p.x_q, p.w_q, a_scale, b_scale, **kwargs)
    if case == "sm120":
        from flashinfer.utils import BackendSupportedError

        assert isinstance(info.value, BackendSupportedError) and not isinstance(info.value, ValueError)


@pytest.mark.parametrize("mode", ["MN", "K"])
def test_flashinfer_cutlass_accepts_both_scale_major_modes(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem, mode: str) -> None:
    install(monkeypatch, "flashinfer", compute_capability=(12, 0))
    import flashinfer.gemm

    if mode == "MN":
        a_scale, b_scale = problem.x_scale.t().contiguous(), problem.w_scale.t().contiguous()
    else:
        a_scale, b_scale = problem.x_scale, problem.w_scale
    out = flashinfer.gemm.gemm_fp8_nt_groupwise(problem.x_q, problem.w_q, a_scale, b_scale, scale_major_mode=mode, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and close(out, problem.reference)


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("missing_scale_major_mode", ValueError, "scale_major_mode is required in CUTLASS"),
        ("non_contiguous_view", RuntimeError, "must be a contiguous"),
        ("m_not_padded_to_4", RuntimeError, "multiple of 4"),
        ("wrong_out_buffer", RuntimeError, "out must be a contiguous"),
        ("sm90", Exception, "capability 90"),
        ("mixed_fp8_types", RuntimeError, "share an FP8 dtype"),
    ],
)
def test_flashinfer_cutlass_rejects(
    monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem, case: str, error: type[Exception], match: str
) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=(10, 0))
    gemm = fake.module.gemm.gemm_fp8_nt_groupwise
    p = make_problem(6, N, K, seed=7) if case == "m_not_padded_to_4" else problem
    a, b = p.x_q, p.w_q
    a_scale, b_scale = p.x_scale.t().contiguous(), p.w_scale.t().contiguous()
    kwargs: dict[str, object] = {"scale_major_mode": "MN"}
    if case == "missing_scale_major_mode":
        kwargs = {}
    elif case == "non_contiguous_view":
        a_scale = p.x_scale.t()  # right shape, but the kernel would read row-major memory
    elif case == "wrong_out_buffer":
        kwargs["out"] = torch.empty(N, M, dtype=torch.bfloat16).t()
    elif case == "sm90":
        fake.impl.set_compute_capability((9, 0))
    elif case == "mixed_fp8_types":
        b = p.w_q.to(torch.float8_e5m2)
    with pytest.raises(error, match=match):
        gemm(a, b, a_scale, b_scale, **kwargs)


def test_flashinfer_sm90_blockscale_gemm(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    fake = install(monkeypatch, "flashinfer", compute_capability=(9, 0))
    from flashinfer.gemm import fp8_blockscale_gemm_sm90

    x = problem.x
    out = fp8_blockscale_gemm_sm90(x, problem.w_q, None, problem.w_scale, out_dtype=torch.bfloat16)
    w64 = dequantize_blockwise(problem.w_q, problem.w_scale, 128, 128)
    assert close(out, x.double() @ w64.T, 3e-2)
    # W8A8: the kernel reads the activation scale as DeepGEMM's MN-major, TMA-aligned buffer
    x_scale_mn = torch.empty(K // 128, round_up(M, 4)).t()[:M]
    x_scale_mn.copy_(problem.x_scale)
    w8a8 = fp8_blockscale_gemm_sm90(problem.x_q, problem.w_q, x_scale_mn, problem.w_scale)
    assert close(w8a8, problem.reference)
    with pytest.raises(ValueError, match="MN-major TMA-aligned"):
        fp8_blockscale_gemm_sm90(problem.x_q, problem.w_q, problem.x_scale, problem.w_scale)  # row-major: misread
    with pytest.raises(ValueError, match="divisible by 64"):
        fp8_blockscale_gemm_sm90(x[:, :K], make_problem(M, 160, K).w_q, None, make_problem(M, 160, K).w_scale)
    with pytest.raises(ValueError, match="input_scale should not be provided"):
        fp8_blockscale_gemm_sm90(x, problem.w_q, problem.x_scale, problem.w_scale)
    with pytest.raises(ValueError, match="weight_scale shape mismatch"):
        fp8_blockscale_gemm_sm90(x, problem.w_q, None, problem.w_scale.t())
    with pytest.raises(RuntimeError, match="input_ptr"):
        fp8_blockscale_gemm_sm90(x[:0], problem.w_q, None, problem.w_scale)
    fake.impl.set_compute_capability((10, 0))
    with pytest.raises(ValueError, match="only supported on SM90"):
        fp8_blockscale_gemm_sm90(x, problem.w_q, None, problem.w_scale)


def test_flashinfer_sm90_runner_wants_its_workspace(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    install(monkeypatch, "flashinfer", compute_capability=(9, 0))
    from flashinfer.gemm.gemm_base import get_fp8_blockscale_gemm_runner_sm90

    runner = get_fp8_blockscale_gemm_runner_sm90()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Workspace not configured"):
        runner.run_gemm(problem.x, problem.w_q, out, None, problem.w_scale)
    small = runner.get_workspace_size(1, N, K)
    runner.configure_workspace(torch.empty(small, dtype=torch.uint8))
    assert runner.get_workspace_size(M, N, K) > small  # sized by the largest M asked about so far
    with pytest.raises(RuntimeError, match="the kernels write"):
        runner.run_gemm(problem.x, problem.w_q, out, None, problem.w_scale)
    assert runner.get_workspace_size(1, N, K) == runner.get_workspace_size(M, N, K)
    runner.configure_workspace(torch.empty(runner.get_workspace_size(M, N, K), dtype=torch.uint8))
    runner.run_gemm(problem.x, problem.w_q, out, None, problem.w_scale)
    assert close(out, problem.x.double() @ dequantize_blockwise(problem.w_q, problem.w_scale, 128, 128).T, 3e-2)
    with pytest.raises(RuntimeError, match="scales_b shape mismatch"):
        runner.run_gemm(problem.x, problem.w_q, out, None, problem.w_scale.t())


def test_flashinfer_sm90_writes_bf16_bits_whatever_out_dtype(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    install(monkeypatch, "flashinfer", compute_capability=(9, 0))
    from flashinfer.gemm import fp8_blockscale_gemm_sm90

    ref = problem.x.double() @ dequantize_blockwise(problem.w_q, problem.w_scale, 128, 128).T
    out = fp8_blockscale_gemm_sm90(problem.x, problem.w_q, None, problem.w_scale, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and close(out.view(torch.bfloat16), ref, 3e-2)
    assert not close(out, ref, 0.5)  # bf16 bit patterns read as fp16


def test_flashinfer_sm90_quantizer_propagates_nan_and_inf(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    install(monkeypatch, "flashinfer", compute_capability=(9, 0))
    from fakes.flashinfer import quantize_1x128_like_flashinfer
    from flashinfer.gemm import fp8_blockscale_gemm_sm90

    x = problem.x.clone()
    x[3, 5], x[7, 200] = float("nan"), float("-inf")
    q, scale = quantize_1x128_like_flashinfer(x)
    assert torch.isnan(q[3, 5].float()) and torch.isfinite(scale[3]).all()  # NaN skipped by amax, kept as a value
    assert scale[7, 1] == float("inf") and torch.isnan(q[7, 200].float()) and q[7, 130].float() == 0
    out = fp8_blockscale_gemm_sm90(x, problem.w_q, None, problem.w_scale, out_dtype=torch.bfloat16)
    finite = torch.isfinite(out.float())
    assert not finite[3].any() and not finite[7].any()
    rows = [i for i in range(M) if i not in (3, 7)]
    assert finite[rows].all()
    ref = problem.x.double() @ dequantize_blockwise(problem.w_q, problem.w_scale, 128, 128).T
    assert close(out[rows], ref[rows], 3e-2)


def test_flashinfer_version_gates(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    old = install(monkeypatch, "flashinfer", version="0.5.3").module
    assert old.__version__ == "0.5.3" and not hasattr(old.gemm, "fp8_blockscale_gemm_sm90")
    legacy = install(monkeypatch, "flashinfer", version="0.2.8").module.gemm.gemm_fp8_nt_groupwise
    assert "backend" not in inspect.signature(legacy).parameters
    with pytest.raises(TypeError):
        legacy(problem.x_q, problem.w_q, problem.x_scale, problem.w_scale, backend="trtllm")


# =============================================================================== sgl-kernel (CUTLASS)


def test_sgl_kernel_dispatch_by_build(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    fake = install(monkeypatch, "sgl_kernel", sm_version=120)  # 0.4.4 holds an SM120 launcher
    assert fake.module.__version__ == "0.4.4"
    args = (problem.x_q, problem.w_q.t(), problem.x_scale.t().contiguous().t(), problem.w_scale.t(), torch.bfloat16)
    assert close(fake.module.fp8_blockwise_scaled_mm(*args), problem.reference)
    old = install(monkeypatch, "sgl_kernel", sm_version=120, supported_sms=(90, 100), version="0.3.9")
    with pytest.raises(NotImplementedError, match="compute capability: 120"):
        old.module.fp8_blockwise_scaled_mm(*args)


def test_sgl_kernel_accepts_sglang_layouts(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    install(monkeypatch, "sgl_kernel", sm_version=90)
    from sgl_kernel import fp8_blockwise_scaled_mm

    x_scale_m_major = problem.x_scale.t().contiguous().t()
    out = fp8_blockwise_scaled_mm(problem.x_q, problem.w_q.t(), x_scale_m_major, problem.w_scale.t(), torch.bfloat16)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16 and close(out, problem.reference)
    one = make_problem(1, N, K, seed=8)  # M = 1: a contiguous [1, K/128] scale is a "contiguous vector"
    out1 = fp8_blockwise_scaled_mm(one.x_q, one.w_q.t(), one.x_scale, one.w_scale.t(), torch.float16)
    assert close(out1, one.reference)


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("row_major_b", RuntimeError, "mat_b must be a column major tensor"),
        ("row_major_scales_a", RuntimeError, "scales_a must be M major"),
        ("contiguous_scales_b", RuntimeError, "scales_b must be K major"),
        ("checkpoint_scales_b", RuntimeError, "size of scales_b is not matched"),
        ("fp32_out", RuntimeError, "out_dtype must be Half or BFloat16"),
        ("e5m2", RuntimeError, "mat_a must be Float8_e4m3fn"),
        ("sm89", NotImplementedError, "compute capability: 89"),
        ("row_strided_a", RuntimeError, "mat_a must be packed"),
    ],
)
def test_sgl_kernel_rejects(
    monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem, case: str, error: type[Exception], match: str
) -> None:
    fake = install(monkeypatch, "sgl_kernel", sm_version=100)
    a, b = problem.x_q, problem.w_q.t()
    sa, sb = problem.x_scale.t().contiguous().t(), problem.w_scale.t()
    out_dtype = torch.bfloat16
    if case == "row_major_b":
        b = problem.w_q.t().contiguous()
    elif case == "row_major_scales_a":
        sa = problem.x_scale
    elif case == "contiguous_scales_b":
        sb = problem.w_scale.t().contiguous()
    elif case == "checkpoint_scales_b":
        sb = problem.w_scale
    elif case == "fp32_out":
        out_dtype = torch.float32
    elif case == "e5m2":
        a = problem.x_q.to(torch.float8_e5m2)
    elif case == "sm89":
        fake.module.set_sm_version(89)
    elif case == "row_strided_a":
        a = torch.zeros(M, K + 128, dtype=torch.float8_e4m3fn)[:, :K]
        a.copy_(problem.x_q)
    with pytest.raises(error, match=match):
        fake.module.fp8_blockwise_scaled_mm(a, b, sa, sb, out_dtype)


# =============================================================================== AITER


def _to_fnuz(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's ``normalize_e4m3fn_to_e4m3fnuz``: same bits (-128 -> 0), scale doubled."""
    bits = q.view(torch.int8).clone()
    bits[bits == -128] = 0
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0


def test_aiter_gfx942_accepts_fnuz_checkpoint_layouts(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    install(monkeypatch, "aiter", gfx="gfx942")
    import aiter

    assert aiter.dtypes.fp8 == torch.float8_e4m3fnuz
    xq, xs = _to_fnuz(problem.x_q, problem.x_scale)
    wq, ws = _to_fnuz(problem.w_q, problem.w_scale)
    out = aiter.gemm_a8w8_blockscale(xq, wq, xs, ws, dtype=torch.bfloat16)
    assert out.shape == (M, N) and close(out, problem.reference)


def test_aiter_gfx950_bpreshuffle(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    fake = install(monkeypatch, "aiter", gfx="gfx950")
    import aiter
    from aiter.ops.shuffle import shuffle_weight

    assert aiter.dtypes.fp8 == torch.float8_e4m3fn
    shuffled = shuffle_weight(problem.w_q, layout=(16, 16))
    assert shuffled.is_shuffled and shuffled.shape == problem.w_q.shape and not torch.equal(shuffled, problem.w_q)
    x_scale_col = problem.x_scale.t().contiguous().t()
    out = aiter.gemm_a8w8_blockscale_bpreshuffle(problem.x_q, shuffled, x_scale_col, problem.w_scale, torch.bfloat16)
    assert close(out, problem.reference)
    asm = aiter.gemm_a8w8_blockscale(problem.x_q, shuffled, x_scale_col, problem.w_scale, torch.bfloat16, isBpreshuffled=True)
    assert torch.equal(asm, out)
    forgot_to_shuffle = aiter.gemm_a8w8_blockscale_bpreshuffle(problem.x_q, problem.w_q, x_scale_col, problem.w_scale)
    assert not close(forgot_to_shuffle, problem.reference, 0.5)
    with pytest.raises(RuntimeError, match="column-major"):
        aiter.gemm_a8w8_blockscale_bpreshuffle(problem.x_q, shuffled, problem.x_scale, problem.w_scale)
    fake.impl.set_gfx("gfx942")
    assert aiter.dtypes.fp8 == torch.float8_e4m3fnuz
    fake.impl.reset()
    assert aiter.dtypes.fp8 == torch.float8_e4m3fn


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("e4m3fn_on_gfx942", RuntimeError, "float8_e4m3fnuz"),
        ("fp32_out", AssertionError, "is currently not supported"),
        ("column_major_x_scale", RuntimeError, "row-major contiguous"),
        ("transposed_w_scale", RuntimeError, "w_scale must be row-major"),
        ("asm_on_gfx942", AssertionError, "asm kernel only support"),
    ],
)
def test_aiter_rejects(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem, case: str, error: type[Exception], match: str) -> None:
    fake = install(monkeypatch, "aiter", gfx="gfx942")
    xq, xs = _to_fnuz(problem.x_q, problem.x_scale)
    wq, ws = _to_fnuz(problem.w_q, problem.w_scale)
    kwargs: dict[str, object] = {"dtype": torch.bfloat16}
    if case == "e4m3fn_on_gfx942":
        xq, wq = problem.x_q, problem.w_q
    elif case == "fp32_out":
        kwargs["dtype"] = torch.float32
    elif case == "column_major_x_scale":
        xs = xs.t().contiguous().t()
    elif case == "transposed_w_scale":
        ws = ws.t().contiguous().t()
    elif case == "asm_on_gfx942":
        kwargs["isBpreshuffled"] = True
    with pytest.raises(error, match=match):
        fake.module.gemm_a8w8_blockscale(xq, wq, xs, ws, **kwargs)


# =============================================================================== Ascend torch_npu


def test_npu_dynamic_block_quant(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    install(monkeypatch, "torch_npu")
    import torch_npu

    y, scale = torch_npu.npu_dynamic_block_quant(problem.x, dst_type=torch.float8_e4m3fn, row_block_size=1, col_block_size=128)
    assert y.dtype == torch.float8_e4m3fn and y.shape == (M, K) and scale.shape == (M, K // 128)
    assert close(dequantize_blockwise(y, scale, 1, 128), problem.x.double(), 0.05)
    y3, scale3 = torch_npu.npu_dynamic_block_quant(problem.x.view(2, M // 2, K), dst_type=torch.int8)
    assert y3.dtype == torch.int8 and scale3.shape == (2, M // 2, K // 128)
    assert torch_npu._C._npu_get_soc_version() == 260 and "Ascend950" in torch_npu.npu.get_device_name()


@pytest.mark.parametrize("layout", ["views_of_checkpoint", "materialized_kn"])
def test_npu_quant_matmul_accepts_block_fp8(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem, layout: str) -> None:
    install(monkeypatch, "torch_npu")
    import torch_npu

    if layout == "views_of_checkpoint":
        w, w_scale = problem.w_q.t(), problem.w_scale.t()
    else:
        w, w_scale = problem.w_q.t().contiguous(), problem.w_scale.t().contiguous()
    out = torch_npu.npu_quant_matmul(
        problem.x_q, w, w_scale, pertoken_scale=problem.x_scale, output_dtype=torch.bfloat16, group_sizes=[1, 128, 128]
    )
    assert out.shape == (M, N) and out.dtype == torch.bfloat16 and close(out, problem.reference)


@pytest.mark.parametrize(
    ("case", "error", "match"),
    [
        ("mismatched_transpose", RuntimeError, "transposition of scale"),
        ("a2_device", RuntimeError, "Ascend 950"),
        ("block_group_sizes", RuntimeError, "group_sizes must be"),
        ("column_major_pertoken_scale", RuntimeError, "pertoken_scale must be a contiguous"),
        ("checkpoint_scale_shape", RuntimeError, "scale must be"),
        ("positional_pertoken_scale", TypeError, "positional"),
    ],
)
def test_npu_quant_matmul_rejects(
    monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem, case: str, error: type[Exception], match: str
) -> None:
    fake = install(monkeypatch, "torch_npu")
    npu = fake.module
    w, w_scale, x_scale = problem.w_q.t(), problem.w_scale.t(), problem.x_scale
    group_sizes = [1, 128, 128]
    if case == "mismatched_transpose":
        w_scale = problem.w_scale.t().contiguous()
    elif case == "a2_device":
        npu.set_soc("Ascend910B2", 220)
    elif case == "block_group_sizes":
        group_sizes = [128, 128, 128]
    elif case == "column_major_pertoken_scale":
        x_scale = problem.x_scale.t().contiguous().t()
    elif case == "checkpoint_scale_shape":
        w_scale = problem.w_scale
    with pytest.raises(error, match=match):
        if case == "positional_pertoken_scale":
            npu.npu_quant_matmul(problem.x_q, w, w_scale, None, x_scale)
        else:
            npu.npu_quant_matmul(problem.x_q, w, w_scale, pertoken_scale=x_scale, output_dtype=torch.bfloat16, group_sizes=group_sizes)


def test_npu_fp8_quant_rejected_on_a2(monkeypatch: pytest.MonkeyPatch, problem: BlockFP8Problem) -> None:
    fake = install(monkeypatch, "torch_npu", device_name="Ascend910B2", soc_version=220)
    with pytest.raises(RuntimeError, match="arch35"):
        fake.module.npu_dynamic_block_quant(problem.x, dst_type=torch.float8_e4m3fn)
    y, _ = fake.module.npu_dynamic_block_quant(problem.x, dst_type=torch.int8)
    assert y.dtype == torch.int8
    fake.impl.set_soc("Ascend950PR", 260)
    fake.impl.reset()
    assert not fake.impl.is_arch35
