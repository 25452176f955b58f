"""Each probe kind: accepts, rejects, and says what it required and what it found."""

from __future__ import annotations

import pytest

from fp8select import Capabilities
from fp8select.probes import (
    AllOf,
    AnyOf,
    ComputeCapability,
    DeviceKind,
    EnvFlag,
    Float8Dtype,
    Functional,
    GfxArch,
    HasScaledMM,
    Package,
    PackageSymbols,
    Probe,
    ScalingTypes,
    ToolkitVersion,
    TorchVersion,
    TritonTarget,
    evaluate,
)

CUDA = Capabilities(device_kind="cuda", compute_capability=(9, 0), torch_version="2.11.0+cu130", cuda_version="13.0",
                    has_scaled_mm=True, scaling_types=("RowWise", "BlockWise1x128"), float8_dtypes=("float8_e4m3fn",),
                    packages={"triton": "3.6.0", "odd": "unknown"}, env={"FLAG": "1", "OFF": "0"}, triton_backends=("nvidia",),
                    functional={"works": True, "broken": False})


@pytest.mark.parametrize("probe, ok, fragments", [
    (TorchVersion(">=2.10"), True, ["torch>=2.10", "2.11.0+cu130"]),
    (TorchVersion(">=2.13", "why"), False, ["requires torch>=2.13", "found torch 2.11.0+cu130", "why"]),
    (ToolkitVersion("cuda", ">=12.9"), True, ["CUDA>=12.9"]),
    (ToolkitVersion("hip", ">=6.0"), False, ["HIP>=6.0", "no hip build"]),
    (HasScaledMM(), True, ["scaled_mm"]),
    (ScalingTypes(("BlockWise1x128", "BlockWise128x128")), False, ["BlockWise128x128 missing", "RowWise, BlockWise1x128"]),
    (Float8Dtype("float8_e4m3fnuz"), False, ["float8_e4m3fnuz", "absent"]),
    (DeviceKind(("rocm",)), False, ["device rocm", "found cuda"]),
    (ComputeCapability(allowed=((9, 0),)), True, ["sm90"]),
    (ComputeCapability(minimum=(8, 9)), True, [">=sm89"]),
    (ComputeCapability(minimum=(10, 0)), False, [">=sm100", "found sm90"]),
    (ComputeCapability(maximum=(8, 9)), False, ["<=sm89", "found sm90"]),
    (GfxArch(("gfx942",)), False, ["gfx942", "none (cuda)"]),
    (Package("triton", ">=3.2"), True, ["triton>=3.2", "3.6.0"]),
    (Package("triton", ">=3.7"), False, ["triton>=3.7", "found 3.6.0"]),
    (Package("deep_gemm"), False, ["deep_gemm", "not installed"]),
    (Package("odd", ">=1"), False, ["without version metadata"]),
    (EnvFlag("FLAG"), True, ["FLAG=1"]),
    (EnvFlag("OFF"), False, ["OFF=1", "OFF=0"]),
    (EnvFlag("MISSING"), False, ["MISSING unset"]),
    (TritonTarget("intel"), False, ["intel", "nvidia"]),
    (Functional("works", "tiny call"), True, ["works", "passed"]),
    (Functional("broken", "tiny call"), False, ["broken", "failed"]),
    (Functional("absent", "tiny call"), False, ["no functional result"]),
    (AllOf((DeviceKind(("cuda",)), GfxArch(("gfx950",)))), False, ["gfx950"]),
    (AnyOf((DeviceKind(("xpu",)), DeviceKind(("rocm",)))), False, ["one of", "device xpu", "device rocm", "found cuda"]),
    (AnyOf((DeviceKind(("xpu",)), DeviceKind(("cuda",)))), True, ["device cuda"]),
])
def test_probe_verdicts(probe: object, ok: bool, fragments: list[str]) -> None:
    verdict = probe(CUDA)  # type: ignore[operator]
    assert verdict.ok is ok
    for fragment in fragments:
        assert fragment in verdict.reason, verdict.reason


@pytest.mark.parametrize("version, ok", [("2.10.0a0+git1234", True), ("2.10.0.dev20250901", True), ("2.9.1", False),
                                         ("2.10.0+cu129", True), ("not-a-version", False)])
def test_torch_version_uses_the_release_part(version: str, ok: bool) -> None:
    assert TorchVersion(">=2.10")(Capabilities(torch_version=version)).ok is ok


def test_compute_capability_compares_pairs() -> None:
    sm120 = ComputeCapability(allowed=((12, 0),))
    assert sm120(Capabilities(device_kind="cuda", compute_capability=(12, 0))).ok
    assert not sm120(Capabilities(device_kind="cuda", compute_capability=(12, 1))).ok
    assert not ComputeCapability(allowed=((9, 0),))(Capabilities(device_kind="cuda", compute_capability=(10, 0))).ok
    assert not ComputeCapability(minimum=(8, 9))(Capabilities(device_kind="cuda", compute_capability=(8, 6))).ok
    assert ComputeCapability(minimum=(8, 9))(Capabilities(device_kind="cuda", compute_capability=(12, 1))).ok


def test_bad_declarations_fail_loudly() -> None:
    with pytest.raises(ValueError, match="specifier"):
        TorchVersion("two point ten")
    with pytest.raises(ValueError):
        ComputeCapability()
    with pytest.raises(ValueError):
        ToolkitVersion("rocm", ">=6")


# -- the exact words of each verdict: what `explain()` and every rejection show a user ------------------

CPU = Capabilities(torch_version="2.9.1+cpu")
ROCM = Capabilities(device_kind="rocm", gfx_arch="gfx942", torch_version="2.9.1+rocm6.4", hip_version="6.4.1",
                    triton_backends=())
SM = {cc: Capabilities(device_kind="cuda", compute_capability=cc) for cc in ((8, 0), (8, 9), (9, 0), (10, 0))}
SYMBOLS = Capabilities(packages={"dg": "2.1", "fi": "0.6", "old": "1.0"},
                       package_symbols={"dg": ("fp8_gemm_nt", "other_entry"), "fi": ()})


@pytest.mark.parametrize("probe, caps, ok, reason", [
    (TorchVersion(">=2.10"), CUDA, True, "torch>=2.10 (found torch 2.11.0+cu130)"),
    (TorchVersion(">=2.13", "why"), CUDA, False, "requires torch>=2.13, found torch 2.11.0+cu130 (why)"),
    (ToolkitVersion("cuda", ">=13.1"), CUDA, False, "requires torch built with CUDA>=13.1, found 13.0"),
    (ToolkitVersion("hip", ">=6.4"), ROCM, True, "torch built with HIP>=6.4 (found 6.4.1)"),
    (ToolkitVersion("xpu", ">=1"), CUDA, False, "requires torch built with XPU>=1, found no xpu build"),
    (HasScaledMM(), CUDA, True, "torch.nn.functional.scaled_mm (found present)"),
    (HasScaledMM(), CPU, False, "requires torch.nn.functional.scaled_mm, found absent in torch 2.9.1+cpu"),
    (ScalingTypes(("RowWise", "BlockWise1x128")), CUDA, True, "ScalingType.RowWise/BlockWise1x128 (found all present)"),
    (ScalingTypes(("BlockWise1x128", "BlockWise128x128", "TensorWise")), CUDA, False,
     "requires ScalingType.BlockWise1x128/BlockWise128x128/TensorWise, found BlockWise128x128, TensorWise missing "
     "(torch 2.11.0+cu130 has RowWise, BlockWise1x128)"),
    (ScalingTypes(("RowWise",)), CPU, False, "requires ScalingType.RowWise, found RowWise missing (torch 2.9.1+cpu has no ScalingType)"),
    (Float8Dtype("float8_e4m3fn"), CUDA, True, "torch.float8_e4m3fn (found present)"),
    (Float8Dtype("float8_e4m3fnuz"), CUDA, False, "requires torch.float8_e4m3fnuz, found absent in torch 2.11.0+cu130"),
    (DeviceKind(("rocm", "cuda")), CUDA, True, "device rocm or cuda (found cuda)"),
    (DeviceKind(("rocm",)), CUDA, False, "requires device rocm, found cuda"),
    (GfxArch(("gfx942", "gfx950")), ROCM, True, "gfx arch gfx942/gfx950 (found gfx942)"),
    (GfxArch(("gfx950",)), CUDA, False, "requires gfx arch gfx950, found none (cuda)"),
    (ComputeCapability(allowed=((9, 0), (10, 0))), SM[(9, 0)], True, "compute capability sm90/sm100 (found sm90)"),
    (ComputeCapability(allowed=((9, 0),)), CPU, False, "requires compute capability sm90, found none (cpu)"),
    (ComputeCapability(minimum=(8, 9)), CPU, False, "requires compute capability >=sm89, found none (cpu)"),
    (ComputeCapability(minimum=(8, 9), maximum=(9, 0)), SM[(8, 0)], False, "requires compute capability >=sm89,<=sm90, found sm80"),
    (ComputeCapability(maximum=(9, 0)), SM[(8, 9)], True, "compute capability <=sm90 (found sm89)"),
    (Package("triton"), CUDA, True, "package triton (found 3.6.0)"),
    (Package("triton", ">=3.2"), CUDA, True, "package triton>=3.2 (found 3.6.0)"),
    (Package("deep_gemm", ">=2", "why"), CUDA, False, "requires package deep_gemm>=2, found not installed (why)"),
    (Package("odd", ">=1"), CUDA, False, "requires package odd>=1, found installed without version metadata"),
    (Package("odd"), CUDA, True, "package odd (found unknown)"),
    (EnvFlag("FLAG"), CUDA, True, "FLAG=1 (found FLAG=1)"),
    (EnvFlag("MISSING"), CUDA, False, "requires MISSING=1, found MISSING unset"),
    (TritonTarget("nvidia"), CUDA, True, "Triton's nvidia backend (found installed)"),
    (TritonTarget("amd"), CUDA, False, "requires Triton's amd backend, found backends: nvidia"),
    (TritonTarget("amd"), ROCM, False, "requires Triton's amd backend, found backends: none"),
    (TritonTarget("intel"), Capabilities(triton_backends=("amd", "nvidia")), False,
     "requires Triton's intel backend, found backends: amd, nvidia"),
    (Functional("works", "tiny call"), CUDA, True, "functional probe works (tiny call) (found passed)"),
    (Functional("broken", "tiny call"), CUDA, False, "requires functional probe broken (tiny call), found failed"),
    (Functional("absent", "tiny call"), CUDA, False,
     "requires functional probe absent (tiny call), found no functional result in the snapshot"),
    (Functional("absent", "tiny call", default=True), CUDA, True,
     "functional probe absent (tiny call) (found no functional result in the snapshot)"),
    (Functional("works", "tiny call", otherwise=TorchVersion(">=2.13")), CUDA, True,
     "functional probe works (tiny call) (found passed; a call tried on the device, instead of torch>=2.13)"),
    (Functional("broken", "tiny call", otherwise=TorchVersion(">=2.10")), CUDA, False,
     "requires functional probe broken (tiny call), found failed; a call tried on the device, instead of torch>=2.10"),
    (Functional("absent", "tiny call", otherwise=TorchVersion(">=2.10")), CUDA, True,
     "torch>=2.10 (found torch 2.11.0+cu130) (no functional result for absent in the snapshot)"),
    (Functional("absent", "tiny call", otherwise=TorchVersion(">=2.13")), CUDA, False,
     "requires torch>=2.13, found torch 2.11.0+cu130 (no functional result for absent in the snapshot)"),
    (AllOf((DeviceKind(("cuda",)), HasScaledMM())), CUDA, True,
     "device cuda (found cuda), torch.nn.functional.scaled_mm (found present)"),
    (AllOf((DeviceKind(("cuda",)), DeviceKind(("xpu",)), DeviceKind(("rocm",)))), CUDA, False,
     "requires device xpu, found cuda"),
    (AnyOf((DeviceKind(("xpu",)), DeviceKind(("rocm",)))), CUDA, False,
     "requires one of: device xpu, found cuda; device rocm, found cuda"),
    (PackageSymbols("dg", ("fp8_gemm_nt",)), SYMBOLS, True, "package dg exposing fp8_gemm_nt (found dg 2.1 with fp8_gemm_nt)"),
    (PackageSymbols("dg", ("gemm_v1", "other_entry", "fp8_gemm_nt")), SYMBOLS, True,
     "package dg exposing gemm_v1 or other_entry or fp8_gemm_nt (found dg 2.1 with other_entry, fp8_gemm_nt)"),
    (PackageSymbols("dg", ("gemm_v1",), "why"), SYMBOLS, False,
     "requires package dg exposing gemm_v1, found dg 2.1 exposing fp8_gemm_nt, other_entry (why)"),
    (PackageSymbols("fi", ("gemm",)), SYMBOLS, False,
     "requires package fi exposing gemm, found fi 0.6 exposing none of the entry points fp8select looks for"),
    (PackageSymbols("old", ("gemm",)), SYMBOLS, True,
     "package old exposing gemm (found old 1.0; entry points not recorded in the snapshot, checked when a layer is prepared)"),
    (PackageSymbols("absent", ("gemm",)), SYMBOLS, False, "requires package absent exposing gemm, found absent not installed"),
])
def test_verdict_words(probe: Probe, caps: Capabilities, ok: bool, reason: str) -> None:
    verdict = probe(caps)
    assert (verdict.ok, verdict.reason) == (ok, reason)


@pytest.mark.parametrize("value, ok", [("1", True), ("true", True), ("True", True), ("yes", True), (" on ", True),
                                       ("ON", True), ("0", False), ("false", False), ("no", False), ("off", False),
                                       ("", False), ("2", False)])
def test_env_flag_truthy_words(value: str, ok: bool) -> None:
    assert EnvFlag("F")(Capabilities(env={"F": value})).ok is ok


@pytest.mark.parametrize("cc, ok", [((8, 6), False), ((8, 9), True), ((9, 0), True), ((9, 1), False), ((10, 0), False)])
def test_compute_capability_bounds_are_inclusive(cc: tuple[int, int], ok: bool) -> None:
    assert ComputeCapability(minimum=(8, 9), maximum=(9, 0))(Capabilities(device_kind="cuda", compute_capability=cc)).ok is ok


def test_evaluate_answers_every_probe_in_order() -> None:
    probes = [DeviceKind(("cuda",)), DeviceKind(("rocm",)), HasScaledMM()]
    assert evaluate(probes, CUDA) == [p(CUDA) for p in probes] and [v.ok for v in evaluate(probes, CUDA)] == [True, False, True]


def test_every_declared_specifier_is_checked() -> None:
    assert [ToolkitVersion(t, ">=1").toolkit for t in ("cuda", "hip", "xpu")] == ["cuda", "hip", "xpu"]
    with pytest.raises(ValueError, match="toolkit: expected cuda, hip or xpu, found 'rocm'"):
        ToolkitVersion("rocm", ">=6")
    for make in (lambda: ToolkitVersion("cuda", "twelve"), lambda: Package("triton", "three"), lambda: TorchVersion("two")):
        with pytest.raises(ValueError, match="invalid version specifier"):
            make()
    with pytest.raises(ValueError, match=r"^ComputeCapability needs allowed, minimum or maximum$"):
        ComputeCapability()
