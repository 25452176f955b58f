"""Verification at resolve time: a backend that raises or computes wrong numbers is not used."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, for the Triton case

from dataclasses import replace
from typing import Any

import pytest
import torch
from interpreted import rebuild
from matrix import MATRIX
from structlog.testing import capture_logs

from fp8select import (
    Backend,
    BackendRejectedError,
    Capabilities,
    InvalidDtypeError,
    InvalidInputError,
    NoBackendError,
    PreparedWeight,
    resolve,
)
from fp8select.backends.reference import ReferenceBackend
from fp8select.backends.scaled_mm import XpuScaledMMBackend
from fp8select.capabilities import replace_caps
from fp8select.plugins import Placement, hookimpl
from fp8select.probes import DeviceKind
from fp8select.verify import (
    XPU_BLOCKWISE_KEY,
    device_for,
    expected_output,
    run_functional_probes,
    verify_backend,
)

CPU = MATRIX["cpu-only"][0]


class _Base(Backend):
    """A CPU backend computing through the reference, with one fault injected by subclasses."""

    requires = (DeviceKind(("cpu",)),)
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> Any:
        return ReferenceBackend().run(prepared, x, input_scale=input_scale, bias=bias, out_dtype=out_dtype, caps=caps)


class Good(_Base):
    name = "good"


class Raises(_Base):
    name = "raises"

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED\nsecond line")


class RaisesInPrepare(_Base):
    name = "raises-in-prepare"

    def prepare(self, *args: Any, **kwargs: Any) -> PreparedWeight:
        raise NotImplementedError("no layout for this device")


class Scaled(_Base):
    """Off by 5 %: a plausible-looking but wrong answer."""

    name = "scaled"

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return super().run(*args, **kwargs) * 1.05


class TransposedScales(_Base):
    """Uses the weight scale of block (0, 0) everywhere: the classic layout mistake."""

    name = "one-scale"

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        return super().prepare(weight, torch.full_like(weight_scale, float(weight_scale[0, 0])), block_size, caps)


class NaNs(_Base):
    name = "nans"

    def run(self, *args: Any, **kwargs: Any) -> Any:
        out = super().run(*args, **kwargs)
        out[0, 0] = float("nan")
        return out


class WrongShape(_Base):
    name = "wrong-shape"

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return super().run(*args, **kwargs)[:, :-1]


class WrongDtype(_Base):
    name = "wrong-dtype"

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return super().run(*args, **kwargs).float()


class NotATensor(_Base):
    name = "not-a-tensor"

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return [[0.0]]


class Gated(_Base):
    """Declines K % 512 != 0 problems, including the verification problem."""

    name = "gated"
    k_multiple = 512


class GateRaises(_Base):
    name = "gate-raises"

    def supports(self, problem: Any, caps: Capabilities) -> Any:
        raise KeyError("oops")


@pytest.mark.parametrize("backend, fragment", [
    (Raises(), "raised RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED"),
    (RaisesInPrepare(), "raised NotImplementedError: no layout for this device"),
    (Scaled(), "wrong result, relative Frobenius error"),
    (TransposedScales(), "wrong result"),
    (NaNs(), "1 NaN/inf"),
    (WrongShape(), "expected output bfloat16 [8, 256], found bfloat16 [8, 255]"),
    (WrongDtype(), "expected output bfloat16 [8, 256], found float32 [8, 256]"),
    (NotATensor(), "expected a tensor from run(), found list"),
    (GateRaises(), "its gate raised KeyError"),
], ids=lambda v: getattr(v, "name", None))
def test_faulty_backends_are_rejected_with_the_reason(backend: Backend, fragment: str) -> None:
    verdict = verify_backend(backend, CPU)
    assert not verdict.ok
    assert verdict.reason.startswith("verification failed")
    assert fragment in verdict.reason
    assert "second line" not in verdict.reason  # one line per reason


def test_working_backends_pass() -> None:
    for backend in (Good(), ReferenceBackend()):
        verdict = verify_backend(backend, CPU)
        assert verdict.ok and verdict.reason.startswith("verified: relative error"), verdict.reason


def test_a_gate_that_declines_the_problem_is_not_verified_but_kept() -> None:
    verdict = verify_backend(Gated(), CPU)
    assert verdict.ok and verdict.reason.startswith("not verified") and "K % 512" in verdict.reason


class FnuzConverting(_Base):
    """Like AITER on gfx942: converts the e4m3fn checkpoint to e4m3fnuz at load, then quantizes in fnuz."""

    name = "fnuz"

    def weight_dtype(self, caps: Capabilities) -> torch.dtype:
        return torch.float8_e4m3fnuz

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        fnuz = (weight.to(torch.float32) / 2).to(torch.float8_e4m3fnuz)  # same values, scales doubled
        return super().prepare(fnuz, weight_scale * 2, block_size, caps)


def test_a_backend_computing_in_its_native_fp8_format_passes() -> None:
    mi300 = MATRIX["mi300x"][0]
    verdict = verify_backend(FnuzConverting(), mi300, "cpu")
    assert verdict.ok and "weight float8_e4m3fn" in verdict.reason, verdict.reason
    assert verify_backend(ReferenceBackend(), mi300, "cpu").ok


def test_expected_output_is_independent_and_right() -> None:
    """The fp64 yardstick against a direct float64 computation for exactly representable data."""
    w = torch.tensor([[1.0, -2.0], [0.5, 4.0]]).to(torch.float8_e4m3fn)
    s = torch.tensor([[2.0]])
    x = torch.tensor([[448.0, 224.0]])  # amax 448: the activation scale is exactly 1
    ref = expected_output(x, w, s, (128, 128))
    assert torch.equal(ref, torch.tensor([[448.0 * 2 - 224.0 * 4, 448.0 * 1 + 224.0 * 8]], dtype=torch.float64))


def test_device_for() -> None:
    assert device_for(CPU).type == "cpu"
    assert device_for(MATRIX["mi300x"][0]).type == "cuda"
    assert device_for(MATRIX["arc-b580-torch2.13"][0]).type == "xpu"


def _plugin(*backends: Backend, before: str = "reference") -> object:
    class Plugin:
        @hookimpl
        def fp8select_backends(self) -> list[object]:
            return [Placement(b, before=before) for b in backends]

    return Plugin()


def test_resolve_rejects_a_failing_choice_and_takes_the_next() -> None:
    with capture_logs() as logs:
        selection = resolve(CPU, plugins=[_plugin(Raises(), Scaled(), Good())], verify=True)
    assert selection.backend.name == "good"
    assert [b.name for b in selection.chain] == ["good", "reference"]
    verdicts = {c.name: c for c in selection.verdicts}
    assert not verdicts["raises"].accepted and "raised RuntimeError" in verdicts["raises"].reason
    assert not verdicts["scaled"].accepted and "wrong result" in verdicts["scaled"].reason
    failed = [e for e in logs if e["event"] == "fp8select.verify_failed"]
    assert [e["backend"] for e in failed] == ["raises", "scaled"]
    assert all(e["log_level"] == "warning" and e["reason"] for e in failed)
    resolved = [e for e in logs if e["event"] == "fp8select.resolved"]
    assert len(resolved) == 1 and resolved[0]["backend"] == "good" and resolved[0]["verified"] is True
    assert "verification failed: raised RuntimeError" in selection.explain()


def test_a_failing_fallback_leaves_the_chain() -> None:
    selection = resolve(CPU, plugins=[_plugin(Good(), Raises())], verify=True)
    assert selection.backend.name == "good"
    assert [b.name for b in selection.chain] == ["good", "reference"]


def test_explicit_choice_that_fails_verification_raises() -> None:
    with pytest.raises(BackendRejectedError) as info:
        resolve(CPU, backend="scaled", plugins=[_plugin(Scaled())], verify=True)
    assert info.value.name == "scaled" and "wrong result" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_every_backend_failing_verification_raises_no_backend() -> None:
    with pytest.raises(NoBackendError, match="failed verification"):
        resolve(CPU, plugins=[_plugin(Raises())], disable=["reference"], verify=True)


def test_verification_is_off_for_passed_snapshots_by_default() -> None:
    assert resolve(CPU, plugins=[_plugin(Raises())]).backend.name == "raises"
    assert resolve(CPU, plugins=[_plugin(Raises())], verify=False).backend.name == "raises"


def test_verification_is_on_by_default_for_this_processs_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's device is a GPU (faked: detection finds an H200 whose 'device' is the CPU); a
    snapshot of another machine is not verified by default, and its notes say so."""
    import fp8select.resolver
    import fp8select.verify_chain

    h200 = MATRIX["h200-torch2.11"][0]
    monkeypatch.setattr(fp8select.resolver, "detect_capabilities", lambda: h200)
    monkeypatch.setattr(fp8select.verify_chain, "device_for", lambda caps: torch.device("cpu"))
    with capture_logs() as logs:
        selection = resolve(plugins=False)  # settled: verified before it returns
    # cuda-scaled-mm cannot run block-wise on a CPU (torch raises), so verification rejects it
    # and the next backend that computes correctly here is taken.
    verdict = next(c for c in selection.verdicts if c.name == "cuda-scaled-mm")
    assert not verdict.accepted and verdict.reason.startswith("verification failed: raised")
    assert selection.backend.name != "cuda-scaled-mm"
    assert any(e["event"] == "fp8select.verify_failed" and e["backend"] == "cuda-scaled-mm" for e in logs)
    # ...and verify=False keeps the declared choice
    assert resolve(plugins=False, verify=False).backend.name == "cuda-scaled-mm"
    other = resolve(MATRIX["h100-torch2.10"][0], plugins=False)
    assert any(n.startswith("not verified: the snapshot's device is not this process's") for n in other.notes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_verify_with_a_snapshot_of_another_machine_is_a_clear_error() -> None:
    with pytest.raises(InvalidInputError, match="verify: expected the snapshot's device cuda"):
        resolve(MATRIX["h200-torch2.11"][0], plugins=False, verify=True)


def test_verify_argument_type() -> None:
    with pytest.raises(InvalidDtypeError, match="verify: expected True, False or None, found 'yes'"):
        resolve(CPU, plugins=False, verify="yes")  # type: ignore[arg-type]


def _interpreted_triton() -> None:
    """Make sure the Triton kernels are built for the interpreter (another test may have imported them)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET was set to something else before this module was imported")
    rebuild()


def test_triton_under_the_interpreter_verifies() -> None:
    _interpreted_triton()
    caps = replace_caps(CPU, packages={"triton": "3.9.0"}, env={"TRITON_INTERPRET": "1"})
    selection = resolve(caps, backend="triton", plugins=False, verify=True)
    assert selection.backend.name == "triton"
    assert any(n.startswith("verification of triton: verified") for n in selection.notes)


# --- functional probe for the uncertain XPU block-wise gate ---------------------------------------

XPU_211 = MATRIX["arc-b580-torch2.11"][0]


def _fake_xpu_scaled_mm(correct: bool) -> Any:
    """A stand-in for F.scaled_mm that reads the XPU layouts (scale_b [K/128, N/128] contiguous)."""
    def fake(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, recipe_a: Any, scale_b: torch.Tensor,
             recipe_b: Any, *, bias: Any = None, output_dtype: torch.dtype) -> torch.Tensor:
        if not correct:
            raise ValueError("Invalid scaling configuration.")
        k, n = b.shape
        a64 = a.to(torch.float64) * scale_a.to(torch.float64).repeat_interleave(128, 1)[:, :k]
        s = scale_b.to(torch.float64).repeat_interleave(128, 0)[:k].repeat_interleave(128, 1)[:, :n]
        return (a64 @ (b.to(torch.float64) * s)).to(output_dtype)

    return fake


@pytest.fixture
def fresh_probe_cache() -> Any:
    import fp8select.verify

    fp8select.verify._xpu_blockwise_works.cache_clear()
    yield
    fp8select.verify._xpu_blockwise_works.cache_clear()


@pytest.mark.parametrize("works", [True, False])
def test_functional_probe_decides_the_xpu_gate(monkeypatch: pytest.MonkeyPatch, fresh_probe_cache: Any, works: bool) -> None:
    import fp8select.backends.scaled_mm as scaled_mm

    monkeypatch.setattr(scaled_mm, "_scaled_mm", lambda: _fake_xpu_scaled_mm(works))
    probed = run_functional_probes(XPU_211, device="cpu")
    assert probed.functional == {XPU_BLOCKWISE_KEY: works}
    assert probed.to_dict()["functional"] == {XPU_BLOCKWISE_KEY: works}  # it travels with the snapshot JSON
    verdict = XpuScaledMMBackend().check(probed)
    assert verdict.ok is works
    assert "a call tried on the device, instead of torch>=2.13" in verdict.reason
    # without a functional result the version guess decides, and says there was none
    plain = XpuScaledMMBackend().check(XPU_211)
    assert not plain.ok and "2.11.0" in plain.reason and "no functional result" in plain.reason


def test_a_failed_functional_probe_overrides_a_passing_version(fresh_probe_cache: Any) -> None:
    xpu213 = MATRIX["arc-b580-torch2.13"][0]
    assert XpuScaledMMBackend().check(xpu213).ok
    failed = replace_caps(xpu213, functional={XPU_BLOCKWISE_KEY: False})
    verdict = XpuScaledMMBackend().check(failed)
    assert not verdict.ok and "found failed" in verdict.reason
    assert resolve(failed, plugins=False).backend.name == "triton"


def test_functional_probes_leave_other_snapshots_alone(fresh_probe_cache: Any) -> None:
    assert run_functional_probes(CPU) is CPU
    recorded = replace_caps(XPU_211, functional={XPU_BLOCKWISE_KEY: True})
    assert run_functional_probes(recorded) is recorded  # a replayed result is never re-probed
    no_api = replace_caps(XPU_211, has_scaled_mm=False, scaling_types=())
    assert run_functional_probes(no_api).functional == {XPU_BLOCKWISE_KEY: False}


def test_functional_probe_runs_once_per_process(monkeypatch: pytest.MonkeyPatch, fresh_probe_cache: Any) -> None:
    import fp8select.backends.scaled_mm as scaled_mm

    calls: list[int] = []
    fake = _fake_xpu_scaled_mm(True)

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return fake(*args, **kwargs)

    monkeypatch.setattr(scaled_mm, "_scaled_mm", lambda: counting)
    for _ in range(3):
        assert run_functional_probes(XPU_211, device="cpu").functional[XPU_BLOCKWISE_KEY]
    assert len(calls) == 1


def test_a_pass_is_remembered_per_versions_and_verify_true_checks_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import fp8select.resolver as resolver_module
    from fp8select import verify as verify_module
    from fp8select import verify_chain as chain_module
    from fp8select.verify_chain import verify_chain

    caps = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",))
    runs: list[str] = []
    real = verify_module.verify_backend

    def counting(backend: Any, *args: Any, **kwargs: Any) -> Any:
        runs.append(backend.name)
        return real(backend, *args, **kwargs)

    monkeypatch.setattr(chain_module, "verify_backend", counting)
    first = resolve(caps, plugins=False, verify=True)
    assert runs == ["reference"] and "verified: relative error" in first.notes[-1]
    assert verify_module.remembered(caps)  # written to the cache directory
    runs.clear()
    again = verify_chain(first, None, "auto", resolver_module.get_logger())
    assert runs == [] and "verified before with these versions" in again.notes[-1]
    newer = replace_caps(caps, torch_version="2.14.0+cpu")
    verify_chain(replace(first, capabilities=newer), None, "auto", resolver_module.get_logger())
    assert runs == ["reference"], "another torch must be verified again"
    runs.clear()
    resolve(caps, plugins=False, verify=True)
    assert runs == ["reference"], "verify=True always runs the check"
