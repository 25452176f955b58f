"""The snapshot: detection on this machine, JSON round trip, overrides, malformed input."""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import replace

import pytest
from matrix import MATRIX

from fp8select import Capabilities, CapabilitiesError, detect_capabilities, forget_detected, resolve
from fp8select.capabilities import FrozenMap
from fp8select.detect import read_env

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


# --- the environment is read on every call; the device and package facts once -------------------------

def test_environment_is_read_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FP8SELECT_BACKEND", raising=False)
    before = detect_capabilities()
    assert "FP8SELECT_BACKEND" not in before.env
    monkeypatch.setenv("FP8SELECT_BACKEND", "reference")
    after = detect_capabilities()
    assert after.env["FP8SELECT_BACKEND"] == "reference"
    assert after.packages is before.packages  # the expensive facts were not gathered again
    assert after is detect_capabilities()  # an unchanged environment gives the same snapshot
    assert resolve(plugins=False, tuning=False).source == "environment"
    monkeypatch.delenv("FP8SELECT_BACKEND")
    assert "FP8SELECT_BACKEND" not in detect_capabilities().env


def test_forget_detected_gathers_the_facts_again() -> None:
    forget_detected()  # a snapshot an earlier test cached may hold the fake vendor modules it had installed
    first = detect_capabilities()
    forget_detected()
    again = detect_capabilities()
    assert again == first and again is not first


def test_environment_values_that_are_not_utf8_are_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP8SELECT_USE_AITER", "\udcff1")  # the byte 0xff, as the OS hands it to Python
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/cache")
    env = read_env()
    assert env["FP8SELECT_USE_AITER"] == "\ufffd1" and env["XDG_CACHE_HOME"] == "/somewhere/cache"
    assert Capabilities.from_json(detect_capabilities().to_json()).env["FP8SELECT_USE_AITER"] == "\ufffd1"


# --- immutable and hashable ------------------------------------------------------------------------------

def test_snapshots_are_immutable_and_hashable() -> None:
    packages = {"triton": "3.9.0"}
    caps = Capabilities(torch_version="2.13.0", packages=packages, env={"A": "1"}, functional={"x": True},
                        package_symbols={"deep_gemm": ["fp8_gemm_nt"]}, scaling_types=["RowWise"], compute_capability=[9, 0])
    packages["triton"] = "0"  # the caller's dict is copied
    assert caps.packages == {"triton": "3.9.0"} and isinstance(caps.packages, FrozenMap)
    assert caps.package_symbols == {"deep_gemm": ("fp8_gemm_nt",)}
    assert caps.scaling_types == ("RowWise",) and caps.compute_capability == (9, 0)
    with pytest.raises(TypeError):
        caps.env["A"] = "2"  # type: ignore[index]
    with pytest.raises(AttributeError):
        caps.packages._data = {}  # type: ignore[attr-defined]
    twin = Capabilities.from_json(caps.to_json())
    assert twin == caps and hash(twin) == hash(caps) and {caps: 1}[twin] == 1
    assert hash(replace(caps, env={"A": "2"})) != hash(caps) or replace(caps, env={"A": "2"}) != caps
    assert pickle.loads(pickle.dumps(caps)) == caps and copy.deepcopy(caps) == caps
    assert caps.with_overrides({"packages.deep_gemm": "2.1.1"}).packages == {"triton": "3.9.0", "deep_gemm": "2.1.1"}


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_matrix_snapshots_hash_like_their_json(name: str) -> None:
    caps = MATRIX[name][0]
    assert hash(Capabilities.from_json(caps.to_json())) == hash(caps)


# --- versions typed in overrides --------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("torch_version", "2.10.0a0+git1234567"), ("packages.triton", "3.5.0"),
                                        ("packages.deep_gemm", "unknown"), ("hip_version", "6.2.41133-dd7f95766"),
                                        ("cuda_version", "12.9"), ("xpu_version", "20250301"), ("cuda_version", "null")])
def test_overrides_accept_real_versions(key: str, value: str) -> None:
    caps = Capabilities(torch_version="2.13.0").with_overrides({key: value})
    head, _, sub = key.partition(".")
    found = getattr(caps, head)[sub] if sub else getattr(caps, head)
    assert found == (None if value == "null" else value)


@pytest.mark.parametrize("key, value", [("torch_version", "banana"), ("torch_version", "2.11 beta"), ("packages.triton", "main"),
                                        ("cuda_version", "v12"), ("hip_version", "")])
def test_overrides_reject_what_is_not_a_version(key: str, value: str) -> None:
    with pytest.raises(CapabilitiesError, match=f"--set {key}: expected"):
        Capabilities(torch_version="2.13.0").with_overrides({key: value})
