"""Verification in the background: resolve(..., background=True) returns a future at once; a selection is a plain value."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import pytest
import torch
from matrix import MATRIX
from structlog.testing import capture_logs

import fp8select.resolver
import fp8select.verify_chain
from fp8select import (
    Backend,
    BackendRejectedError,
    Capabilities,
    InvalidDtypeError,
    InvalidInputError,
    NoBackendError,
    PreparedWeight,
    Selection,
    resolve,
)
from fp8select.backends.reference import ReferenceBackend
from fp8select.measure.bench import random_weight
from fp8select.plugins import Placement, hookimpl
from fp8select.probes import DeviceKind

H200 = MATRIX["h200-torch2.11"][0]
ONLY_PLUGINS = ["deepgemm", "flashinfer", "cutlass", "cuda-scaled-mm", "triton"]


class Held(Backend):
    """A backend whose verification waits until the test releases it (the reference computes)."""

    name = "held"
    requires = (DeviceKind(("cuda",)),)
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    wrong = False

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[str] = []

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> Any:
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(timeout=30)
        y = ReferenceBackend().run(prepared, x, input_scale=input_scale, bias=bias, out_dtype=out_dtype, caps=caps)
        return y * 1.05 if self.wrong else y


class HeldWrong(Held):
    name = "held-wrong"
    wrong = True


def _plugin(*backends: Backend) -> object:
    class Plugin:
        @hookimpl
        def fp8select_backends(self) -> list[object]:
            return [Placement(b, before="reference") for b in backends]

    return Plugin()


@pytest.fixture
def detected_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's device is an H200 (detection faked) whose verification runs on this CPU."""
    monkeypatch.setattr(fp8select.resolver, "detect_capabilities", lambda: H200)
    monkeypatch.setattr(fp8select.verify_chain, "device_for", lambda caps: torch.device("cpu"))


def test_background_returns_a_future_while_the_chain_is_verified(detected_gpu: None) -> None:
    held = Held()
    with capture_logs() as logs:
        future = resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS, background=True)
        assert isinstance(future, Future) and not future.done(), "returned before the verification finished"
        held.release.set()
        selection = future.result(timeout=30)
    assert held.threads == ["fp8select-verify"]
    assert selection.backend.name == "held" and [b.name for b in selection.chain] == ["held", "reference"]
    assert any(n.startswith("verification of held: verified") for n in selection.notes)
    resolved = next(e for e in logs if e["event"] == "fp8select.resolved")
    assert resolved["verified"] == "in background"
    verified = next(e for e in logs if e["event"] == "fp8select.verified")
    assert verified["backend"] == "held" and verified["chain"] == ["held", "reference"] and verified["seconds"] >= 0


def test_a_selection_is_a_plain_value(detected_gpu: None) -> None:
    """Reading, printing or copying a selection never waits: only the future does."""
    held = Held()
    held.release.set()
    selection = resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS)
    assert not hasattr(selection, "pending") and not hasattr(selection, "wait")
    assert type(selection).__getattribute__ is object.__getattribute__
    assert vars(selection)["backend"] is selection.backend and "held" in repr(selection)
    assert replace(selection, max_weight_copies=None).chain == selection.chain


def test_a_backend_failing_in_the_background_is_never_chosen(detected_gpu: None) -> None:
    wrong = HeldWrong()
    wrong.release.set()
    selection = resolve(plugins=[_plugin(wrong)], disable=ONLY_PLUGINS, background=True).result(timeout=30)
    assert selection.backend.name == "reference"
    assert [b.name for b in selection.chain] == ["reference"]
    verdict = next(c for c in selection.verdicts if c.name == "held-wrong")
    assert not verdict.accepted and "wrong result" in verdict.reason
    w, s = random_weight(256, 384, "cpu")
    assert selection.prepare(w, s).backends == ("reference",)


def test_every_backend_failing_in_the_background_raises_from_the_future(detected_gpu: None) -> None:
    wrong = HeldWrong()
    wrong.release.set()
    future = resolve(plugins=[_plugin(wrong)], disable=[*ONLY_PLUGINS, "reference"], background=True)
    with pytest.raises(NoBackendError, match="every accepted backend failed verification"):
        future.result(timeout=30)


def test_an_explicit_choice_is_verified_in_the_background_too(detected_gpu: None) -> None:
    wrong = HeldWrong()
    wrong.release.set()
    future = resolve(backend="held-wrong", plugins=[_plugin(wrong)], disable=ONLY_PLUGINS, background=True)
    with pytest.raises(BackendRejectedError, match="held-wrong"):
        future.result(timeout=30)


def test_a_remembered_chain_needs_no_thread(detected_gpu: None) -> None:
    first = resolve(plugins=False, disable=ONLY_PLUGINS)  # reference only: a built-in, remembered after this
    assert first.backend.name == "reference"
    again = resolve(plugins=False, disable=ONLY_PLUGINS, background=True)
    assert again.done(), "a chain verified before with these versions needs no thread"
    assert "verified before with these versions" in again.result().notes[-1]


def test_without_background_no_thread_is_used(detected_gpu: None) -> None:
    held = Held()
    held.release.set()
    for verify in (None, True, False):
        assert isinstance(resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS, verify=verify), Selection)
    assert held.threads == ["MainThread", "MainThread"]  # verify=None and True ran it here; False did not


def test_background_with_a_group_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="background"):
        resolve(H200, plugins=False, verify=False, background=True, group="world")
    with pytest.raises(InvalidDtypeError, match="background"):
        resolve(H200, plugins=False, verify=False, background="yes")  # type: ignore[call-overload]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_the_verification(detected_gpu: None) -> None:
    held = Held()
    future = resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS, background=True)
    threading.Timer(0.2, held.release.set).start()
    pid = os.fork()
    if pid == 0:  # the child has no verification thread: the future must be settled already
        os._exit(0 if future.done() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert future.result().backend.name == "held"


class Recording(Held):
    """Records the device and stream its verification runs on (a real CUDA run, through the reference)."""

    name = "recording"

    def run(self, prepared: PreparedWeight, x: torch.Tensor, **kwargs: Any) -> Any:
        self.seen = (torch.cuda.current_device(), x.device, torch.cuda.current_stream() == torch.cuda.default_stream())
        self.release.set()
        return super().run(prepared, x, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_thread_verifies_on_the_callers_device_and_its_own_stream() -> None:
    last = torch.cuda.device_count() - 1  # on a machine with two GPUs, not the thread's default device 0
    torch.cuda.set_device(last)
    try:
        recording = Recording()
        future = resolve(plugins=[_plugin(recording)], disable=["deepgemm", "flashinfer", "cutlass"], background=True)
        assert future.result(timeout=120).backend is not None
        current, device, on_default_stream = recording.seen
        assert current == last and device == torch.device("cuda", last) and not on_default_stream
    finally:
        torch.cuda.set_device(0)


class ImportRace(Held):
    """Its first run fails as a vendor import does when another thread imports the same package."""

    name = "import-race"

    def run(self, prepared: PreparedWeight, x: torch.Tensor, **kwargs: Any) -> Any:
        self.threads.append("run")
        if len(self.threads) == 1:
            from importlib._bootstrap import _DeadlockError  # type: ignore[attr-defined]

            raise _DeadlockError("deadlock detected by _ModuleLock('vendor.module')")
        return ReferenceBackend().run(prepared, x, **kwargs)


def test_an_import_deadlock_with_another_thread_is_retried_once() -> None:
    race = ImportRace()
    selection = resolve(H200, plugins=[_plugin(race)], disable=ONLY_PLUGINS, verify=False)
    verified = fp8select.verify_chain.verify_chain(selection, None, "auto", fp8select.resolver.get_logger(),
                                                  device=torch.device("cpu"))
    assert race.threads == ["run", "run"] and verified.backend.name == "import-race"


class Vendored(Backend):
    """A backend whose vendor package is a module written by the test (``packages``)."""

    name = "vendored"
    requires = (DeviceKind(("cpu",)),)
    out_dtypes = (torch.bfloat16,)

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages  # type: ignore[misc]


def test_with_nothing_to_verify_the_future_imports_the_chains_vendors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch
                                                                        ) -> None:
    """Every pass remembered (here: verify=False): the future imports the chain's vendor packages on a side
    thread, the slow part of a warm start's prepare; a package that fails to import is logged, not raised."""
    (tmp_path / "fp8s_vendor_ok.py").write_text(
        "import threading\nTHREAD = threading.current_thread().name\n")
    (tmp_path / "fp8s_vendor_broken.py").write_text("raise RuntimeError('no device here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fp8s_vendor_ok", "fp8s_vendor_broken"):
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    vendored = Vendored(("fp8s_vendor_ok", "fp8s_vendor_broken"))
    with capture_logs() as logs:
        future = resolve(MATRIX["cpu-only"][0], plugins=[_plugin(vendored)], verify=False, background=True)
        selection = future.result(timeout=30)
    assert isinstance(selection, Selection) and "vendored" in [b.name for b in selection.chain]
    import fp8s_vendor_ok  # type: ignore[import-not-found]

    assert fp8s_vendor_ok.THREAD == "fp8select-imports"
    failed = [e for e in logs if e["event"] == "fp8select.import_failed"]
    assert [e["module"] for e in failed] == ["fp8s_vendor_broken"] and "no device here" in failed[0]["error"]
    again = resolve(MATRIX["cpu-only"][0], plugins=[_plugin(Vendored(("fp8s_vendor_ok",)))], verify=False,
                    background=True)
    assert again.done()  # everything already imported: no thread


class Warmed(Vendored):
    """A vendored backend that records where its warm-up ran, or fails it."""

    name = "warmed"

    def __init__(self, fail: bool = False) -> None:
        super().__init__(())
        self.fail = fail
        self.warmed: list[tuple[str, torch.device]] = []

    def warm_up(self, caps: Capabilities, device: torch.device) -> None:
        self.warmed.append((threading.current_thread().name, device))
        if self.fail:
            raise RuntimeError("no compiler here")


def test_with_a_device_the_future_warms_each_backend_up_there_and_a_failure_is_logged() -> None:
    """After the imports, each chain backend's warm-up runs on the side thread, on the device the chain
    would be verified on (DeepGEMM starts its JIT compiler there); a failing one is logged, not raised,
    and without a device (verify=False, another machine's snapshot) nothing is warmed."""
    ok, failing = Warmed(), Warmed(fail=True)
    selection = resolve(MATRIX["cpu-only"][0], plugins=[_plugin(ok)], verify=False)
    selection = replace(selection, chain=(*selection.chain, failing))
    cpu = torch.device("cpu")
    with capture_logs() as logs:
        future = fp8select.verify_chain.import_in_background(selection, fp8select.resolver.get_logger(), cpu)
        assert future.result(timeout=30) is selection
    assert ok.warmed == [("fp8select-imports", cpu)] and failing.warmed == [("fp8select-imports", cpu)]
    failed = [e for e in logs if e["event"] == "fp8select.warm_up_failed"]
    assert [e["backend"] for e in failed] == ["warmed"] and "no compiler here" in failed[0]["error"]
    idle = Warmed()
    assert resolve(MATRIX["cpu-only"][0], plugins=[_plugin(idle)], verify=False, background=True).result(timeout=30)
    assert idle.warmed == []


def test_load_vendors_warms_dense_backends_and_passes_moe_backends_over() -> None:
    """Load-time measurement of a MoE layer loads its routes' vendors on the GPU (``device`` given): MoE backends
    have no warm-up (on the H200 this raised AttributeError and the layer kept its rule's plan); a dense one in
    the same list still warms up."""

    class MoeLike:
        name = "moe-like"
        packages = ()

    dense = Warmed()
    device = torch.device("cpu")
    with capture_logs() as logs:
        fp8select.verify_chain.load_vendors([MoeLike(), dense], MATRIX["cpu-only"][0], device,
                                            fp8select.resolver.get_logger())
    assert dense.warmed == [(threading.current_thread().name, device)] and logs == []
