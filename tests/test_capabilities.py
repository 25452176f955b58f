"""The snapshot: detection on this machine, JSON round trip, overrides, malformed input."""

from __future__ import annotations

import json

import pytest
from matrix import MATRIX

from fp8select import Capabilities, CapabilitiesError, detect_capabilities

SNAPSHOT_KEYS = {"device_kind", "device_name", "compute_capability", "gfx_arch", "torch_version", "cuda_version",
                 "hip_version", "xpu_version", "has_scaled_mm", "scaling_types", "float8_dtypes", "packages", "env",
                 "package_symbols", "functional", "triton_backends", "npu_soc_version"}


def test_detect_on_this_machine_is_cached_and_plain() -> None:
    import torch

    caps = detect_capabilities()
    assert caps is detect_capabilities()
    assert caps.torch_version == str(torch.__version__)
    assert SNAPSHOT_KEYS <= set(caps.to_dict())
    if not torch.cuda.is_available():
        assert caps.device_kind in ("cpu", "xpu", "npu")
    assert "float8_e4m3fn" in caps.float8_dtypes


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_json_round_trip(name: str) -> None:
    caps = MATRIX[name][0]
    text = caps.to_json()
    assert SNAPSHOT_KEYS <= set(json.loads(text))
    assert Capabilities.from_json(text) == caps
    assert Capabilities.from_json(text).fingerprint() == caps.fingerprint()


def test_detected_snapshot_round_trips() -> None:
    caps = detect_capabilities()
    assert Capabilities.from_json(caps.to_json()) == caps


@pytest.mark.parametrize("text, fragment", [
    ("{", "not valid JSON"),
    ('{"device_kind": "cuda", "torch_version": "2.11.0"', "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"device_kind": "tpu"}', "device_kind"),
    ('{"compute_capability": [9]}', "compute_capability"),
    ('{"compute_capability": "9.0"}', "compute_capability"),
    ('{"scaling_types": "BlockWise1x128"}', "scaling_types"),
    ('{"packages": {"triton": 3}}', "packages"),
    ('{"has_scaled_mm": "yes"}', "has_scaled_mm"),
    ('{"torch_version": ""}', "torch_version"),
    ('{"gpu": "H200"}', "unknown key"),
    ('{"npu_soc_version": "260"}', "npu_soc_version"),
])
def test_malformed_snapshots_raise_a_typed_error(text: str, fragment: str) -> None:
    with pytest.raises(CapabilitiesError) as info:
        Capabilities.from_json(text)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_overrides_for_what_if_questions() -> None:
    caps = Capabilities(torch_version="2.13.0")
    new = caps.with_overrides({"device_kind": "xpu", "torch_version": "2.11", "compute_capability": "[9, 0]",
                               "packages.deep_gemm": "2.1.1", "env.FP8SELECT_USE_AITER": "1", "functional.x": "true"})
    assert new.device_kind == "xpu" and new.torch_version == "2.11"
    assert new.compute_capability == (9, 0)
    assert new.packages == {"deep_gemm": "2.1.1"} and new.env == {"FP8SELECT_USE_AITER": "1"}
    assert new.functional == {"x": True}
    assert new.with_overrides({"packages.deep_gemm": ""}).packages == {}
    with pytest.raises(CapabilitiesError, match="unknown key"):
        caps.with_overrides({"gpu": "x"})
    with pytest.raises(CapabilitiesError, match="device_kind"):
        caps.with_overrides({"device_kind": "tpu"})
