"""The decision on named machines, and the invariants every decision keeps."""

from __future__ import annotations

import pytest
from matrix import MATRIX
from structlog.testing import capture_logs

import fp8select
from fp8select import BackendRejectedError, Capabilities, UnknownBackendError, resolve
from fp8select.backends import DEFAULT_ORDER
from fp8select.capabilities import replace_caps

NAMES = sorted(MATRIX)


def _resolve(caps: Capabilities, **kw: object) -> fp8select.Selection:
    return resolve(caps, plugins=False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_matrix_choice(name: str) -> None:
    caps, expected = MATRIX[name]
    selection = _resolve(caps)
    assert selection.backend.name == expected, selection.explain()
    assert selection.source == "auto"


@pytest.mark.parametrize("name", NAMES)
def test_one_verdict_per_candidate_in_order(name: str) -> None:
    selection = _resolve(MATRIX[name][0])
    assert [c.name for c in selection.verdicts] == list(DEFAULT_ORDER)
    assert [c.rank for c in selection.verdicts] == list(range(1, len(DEFAULT_ORDER) + 1))
    chosen = [c for c in selection.verdicts if c.name == selection.backend.name]
    assert len(chosen) == 1 and chosen[0].accepted
    # everything ranked before the auto choice was rejected, with a reason
    for c in selection.verdicts[: chosen[0].rank - 1]:
        assert not c.accepted and c.reason


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", DEFAULT_ORDER)
def test_explicit_choice_wins_or_raises(name: str, backend: str) -> None:
    caps = MATRIX[name][0]
    auto = _resolve(caps)
    accepted = {c.name for c in auto.verdicts if c.accepted}
    if backend in accepted:
        selection = _resolve(caps, backend=backend)
        assert selection.backend.name == backend and selection.source == "argument"
        assert selection.chain[0].name == backend
    else:
        with pytest.raises(BackendRejectedError) as info:
            _resolve(caps, backend=backend)
        assert info.value.name == backend
        assert [c.name for c in info.value.candidates] == list(DEFAULT_ORDER)
        assert backend in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_disabling_the_choice_yields_the_next(name: str) -> None:
    caps = MATRIX[name][0]
    first = _resolve(caps)
    accepted = [c.name for c in first.verdicts if c.accepted]
    if len(accepted) < 2:
        with pytest.raises(fp8select.NoBackendError):
            _resolve(caps, disable=[first.backend.name])
        return
    second = _resolve(caps, disable=[first.backend.name])
    assert second.backend.name == accepted[1]
    disabled = next(c for c in second.verdicts if c.name == first.backend.name)
    assert not disabled.accepted and "disabled" in disabled.reason


def test_xpu_defining_case_old_torch_falls_back_to_triton() -> None:
    caps, _ = MATRIX["arc-b580-torch2.11"]
    selection = _resolve(caps)
    verdict = next(c for c in selection.verdicts if c.name == "xpu-scaled-mm")
    assert not verdict.accepted
    assert "torch>=2.13" in verdict.reason and "2.11.0" in verdict.reason
    assert selection.backend.name == "triton"


def test_xpu_without_blockwise_members_is_rejected_even_on_new_torch() -> None:
    caps = replace_caps(MATRIX["arc-b580-torch2.13"][0], scaling_types=("TensorWise", "RowWise"))
    selection = _resolve(caps)
    verdict = next(c for c in selection.verdicts if c.name == "xpu-scaled-mm")
    assert not verdict.accepted and "BlockWise1x128" in verdict.reason
    assert selection.backend.name == "triton"


def test_xpu_new_torch_chooses_scaled_mm() -> None:
    assert _resolve(MATRIX["arc-b580-torch2.13"][0]).backend.name == "xpu-scaled-mm"


def test_cpu_explains_every_rejection() -> None:
    selection = _resolve(MATRIX["cpu-only"][0])
    text = selection.explain()
    assert selection.backend.name == "reference"
    for c in selection.verdicts:
        assert c.name in text
        if c.name != "reference":
            assert not c.accepted and "requires" in c.reason and "found" in c.reason


def test_unknown_names_raise_listing_valid_ones() -> None:
    caps = MATRIX["cpu-only"][0]
    for kw in ({"backend": "cublas"}, {"disable": ["cublas"]}, {"order": ["reference", "cublas"]}):
        with pytest.raises(UnknownBackendError) as info:
            _resolve(caps, **kw)
        assert "cublas" in str(info.value) and "reference" in str(info.value)
        assert isinstance(info.value, LookupError)


def test_environment_applies_when_arguments_are_absent() -> None:
    base = MATRIX["h200-torch2.11"][0]
    caps = replace_caps(base, env={"FP8SELECT_BACKEND": "triton"})
    selection = _resolve(caps)
    assert selection.backend.name == "triton" and selection.source == "environment"
    assert _resolve(caps, backend="reference").source == "argument"
    caps = replace_caps(base, env={"FP8SELECT_DISABLE": "cuda-scaled-mm, deepgemm"})
    selection = _resolve(caps)
    assert selection.backend.name == "triton"
    assert "FP8SELECT_DISABLE" in next(c.reason for c in selection.verdicts if c.name == "cuda-scaled-mm")
    assert _resolve(caps, disable=["triton"]).backend.name == "cuda-scaled-mm"


def test_environment_choice_rejected_raises_naming_the_source() -> None:
    caps = replace_caps(MATRIX["cpu-only"][0], env={"FP8SELECT_BACKEND": "deepgemm"})
    with pytest.raises(BackendRejectedError) as info:
        _resolve(caps)
    assert info.value.source == "environment"


def test_order_is_data() -> None:
    caps = MATRIX["h200-torch2.11"][0]
    selection = _resolve(caps, order=["triton", "cuda-scaled-mm", "reference"])
    assert selection.backend.name == "triton"
    assert [c.name for c in selection.verdicts] == ["triton", "cuda-scaled-mm", "reference"]


def test_not_implemented_backends_are_never_chosen() -> None:
    for name, (caps, _) in MATRIX.items():
        selection = _resolve(caps)
        for backend in selection.chain:
            assert backend.implemented, (name, backend.name)


def test_sm121_is_not_sm120_and_sm100_is_not_sm90() -> None:
    from fp8select.probes import ComputeCapability

    sm120 = ComputeCapability(allowed=((12, 0),))
    sm90 = ComputeCapability(allowed=((9, 0),))
    assert not sm120(MATRIX["gb10"][0]).ok and "sm121" in sm120(MATRIX["gb10"][0]).reason
    assert not sm90(MATRIX["b200"][0]).ok and "sm100" in sm90(MATRIX["b200"][0]).reason
    cuda_mm = next(c for c in _resolve(MATRIX["b200"][0]).verdicts if c.name == "cuda-scaled-mm")
    assert not cuda_mm.accepted and "sm90" in cuda_mm.reason and "sm100" in cuda_mm.reason


def test_one_log_event_per_resolution() -> None:
    with capture_logs() as logs:
        _resolve(MATRIX["arc-b580-torch2.11"][0])
    events = [e for e in logs if e["event"] == "fp8select.resolved"]
    assert len(events) == 1
    event = events[0]
    assert event["backend"] == "triton" and event["source"] == "auto"
    assert "xpu-scaled-mm" in event["rejected"] and "2.11.0" in event["rejected"]["xpu-scaled-mm"]


def test_failed_resolution_is_logged_too() -> None:
    with capture_logs() as logs, pytest.raises(BackendRejectedError):
        _resolve(MATRIX["cpu-only"][0], backend="deepgemm")
    assert [e["event"] for e in logs] == ["fp8select.resolved"]
    assert logs[0]["backend"] is None and "deepgemm" in logs[0]["rejected"]


def test_to_dict_is_json_and_complete() -> None:
    import json

    selection = _resolve(MATRIX["h200-torch2.11"][0])
    data = json.loads(json.dumps(selection.to_dict()))
    assert data["backend"] == "cuda-scaled-mm"
    assert data["chain"] == ["cuda-scaled-mm", "triton", "reference"]
    assert len(data["verdicts"]) == len(DEFAULT_ORDER)
    assert Capabilities.from_dict(data["capabilities"]) == selection.capabilities
