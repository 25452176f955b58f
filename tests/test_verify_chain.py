"""Verification in the background: resolve() returns at once, every read of a verified field waits."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from typing import Any

import pytest
import torch
from matrix import MATRIX
from structlog.testing import capture_logs

import fp8select.resolver
import fp8select.verify_chain
from fp8select import Backend, Capabilities, NoBackendError, PreparedWeight, resolve
from fp8select.backends.reference import ReferenceBackend
from fp8select.bench import random_weight
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
    """resolve() sees a detected H200 whose device, for verification, is this CPU."""
    monkeypatch.setattr(fp8select.resolver, "detect_capabilities", lambda: H200)
    monkeypatch.setattr(fp8select.verify_chain, "device_for", lambda caps: torch.device("cpu"))


def test_resolve_returns_while_the_chain_is_verified_and_reads_wait(detected_gpu: None) -> None:
    held = Held()
    with capture_logs() as logs:
        selection = resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS)
        assert selection.verifying, "resolve() returned before the verification finished"
        reader_saw: list[str] = []
        reader = threading.Thread(target=lambda: reader_saw.append(selection.backend.name))
        reader.start()
        reader.join(timeout=0.3)
        assert reader.is_alive() and not reader_saw, "a read of the backend must wait for the verification"
        held.release.set()
        reader.join(timeout=30)
        assert reader_saw == ["held"]
        assert not selection.verifying
    assert held.threads == ["fp8select-verify"]
    assert [b.name for b in selection.chain] == ["held", "reference"]
    assert any(n.startswith("verification of held: verified") for n in selection.notes)
    resolved = next(e for e in logs if e["event"] == "fp8select.resolved")
    assert resolved["verified"] == "in background"
    verified = next(e for e in logs if e["event"] == "fp8select.verified")
    assert verified["backend"] == "held" and verified["chain"] == ["held", "reference"] and verified["seconds"] >= 0


def test_a_backend_failing_in_the_background_is_never_seen_as_chosen(detected_gpu: None) -> None:
    wrong = HeldWrong()
    wrong.release.set()
    selection = resolve(plugins=[_plugin(wrong)], disable=ONLY_PLUGINS)
    assert selection.backend.name == "reference"  # the first read already sees the verified chain
    assert [b.name for b in selection.chain] == ["reference"]
    verdict = next(c for c in selection.verdicts if c.name == "held-wrong")
    assert not verdict.accepted and "wrong result" in verdict.reason
    w, s = random_weight(256, 384, "cpu")
    layer = selection.prepare(w, s)
    assert layer.backends == ("reference",)


def test_prepare_and_explain_wait_too(detected_gpu: None) -> None:
    held = Held()
    selection = resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS)
    threading.Timer(0.2, held.release.set).start()
    w, s = random_weight(256, 384, "cpu")
    layer = selection.prepare(w, s)  # waits, then plans over the verified chain
    assert held.release.is_set() and not selection.verifying
    assert "held" in layer.main_plan.backends
    assert "verification of held: verified" in selection.explain()


def test_every_backend_failing_in_the_background_raises_at_the_first_read(detected_gpu: None) -> None:
    wrong = HeldWrong()
    wrong.release.set()
    selection = resolve(plugins=[_plugin(wrong)], disable=[*ONLY_PLUGINS, "reference"])
    with pytest.raises(NoBackendError, match="every accepted backend failed verification"):
        selection.wait()
    with pytest.raises(NoBackendError):
        selection.chain  # noqa: B018 - every later read raises the same


def test_replace_on_a_pending_selection_copies_the_verified_values(detected_gpu: None) -> None:
    held = Held()
    selection = resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS)
    threading.Timer(0.1, held.release.set).start()
    copy = replace(selection, max_weight_copies=None)
    assert copy.pending is None and [b.name for b in copy.chain] == ["held", "reference"]
    assert copy.max_weight_copies is None and selection.max_weight_copies == 1


def test_an_explicit_choice_and_a_remembered_chain_are_verified_before_returning(detected_gpu: None) -> None:
    held = Held()
    held.release.set()
    explicit = resolve(backend="held", plugins=[_plugin(held)], disable=ONLY_PLUGINS)
    assert explicit.pending is None and explicit.backend.name == "held"
    first = resolve(plugins=False, disable=ONLY_PLUGINS).wait()  # reference only: a built-in, remembered
    assert first.backend.name == "reference"
    again = resolve(plugins=False, disable=ONLY_PLUGINS)
    assert again.pending is None, "a chain verified before with these versions needs no thread"
    assert "verified before with these versions" in again.notes[-1]


def test_verify_true_and_false_never_use_the_thread(detected_gpu: None) -> None:
    held = Held()
    held.release.set()
    assert resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS, verify=True).pending is None
    assert resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS, verify=False).pending is None
    assert held.threads == ["MainThread"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_the_verification(detected_gpu: None) -> None:
    held = Held()
    selection = resolve(plugins=[_plugin(held)], disable=ONLY_PLUGINS)
    threading.Timer(0.2, held.release.set).start()
    pid = os.fork()
    if pid == 0:  # the child has no verification thread: its selection must already be settled
        ok = not selection.verifying and selection.pending is not None and selection.pending.done()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert selection.backend.name == "held"


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
        selection = resolve(plugins=[_plugin(recording)], disable=["deepgemm", "flashinfer", "cutlass"])
        assert selection.pending is not None, "a detected GPU with nothing remembered verifies in the background"
        assert selection.wait().backend is not None
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


class Stateless(Held):
    """Held, with its event on the class: a deep copy of the selection copies the backend too."""

    name = "stateless"
    release = threading.Event()

    def __init__(self) -> None:
        pass

    def run(self, prepared: PreparedWeight, x: torch.Tensor, **kwargs: Any) -> Any:
        assert type(self).release.wait(timeout=30)
        return ReferenceBackend().run(prepared, x, **kwargs)


def test_a_pending_selection_can_be_deep_copied(detected_gpu: None) -> None:
    import copy

    Stateless.release.clear()
    selection = resolve(plugins=[_plugin(Stateless())], disable=ONLY_PLUGINS)
    assert selection.verifying
    twin = copy.deepcopy(selection)  # e.g. a model holding it, copied while the verification runs
    Stateless.release.set()
    assert [b.name for b in twin.chain] == [b.name for b in selection.chain] == ["stateless", "reference"]
