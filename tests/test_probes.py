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
    ScalingTypes,
    ToolkitVersion,
    TorchVersion,
    TritonTarget,
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
