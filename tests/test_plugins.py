"""Third-party backends through a real entry point of a test distribution on sys.path."""

from __future__ import annotations

import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from matrix import MATRIX
from plugin_dist import install_distribution

from fp8select import Backend, InvalidInputError, Problem, Verdict, resolve
from fp8select.guard import safe_verdict
from fp8select.plugins import DEFAULT_TIMEOUT_S, ENV_TIMEOUT, Placement, PluginWarning, hookimpl, plugin_timeout
from fp8select.probes import DeviceKind

CPU = MATRIX["cpu-only"][0]


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("fp8select_test_")]:
        del sys.modules[mod]


GOOD = """
from fp8select import Backend, Placement, hookimpl
from fp8select.probes import DeviceKind

class CpuFast(Backend):
    name = "cpu-fast"
    summary = "a test plugin backend"
    requires = (DeviceKind(("cpu",)),)

@hookimpl
def fp8select_backends():
    return [Placement(CpuFast, before="triton")]
"""


def test_entry_point_plugin_is_placed_and_chosen(plugin_path: Path) -> None:
    install_distribution(plugin_path, "fp8select_test_good", GOOD, "fp8select_test_good")
    selection = resolve(CPU)
    names = [c.name for c in selection.verdicts]
    assert names.index("cpu-fast") == names.index("triton") - 1
    assert selection.backend.name == "cpu-fast"
    assert next(c for c in selection.verdicts if c.name == "cpu-fast").origin == "plugin:fp8select_test_good"


@pytest.mark.parametrize("source, fragment", [
    ("raise ImportError('no such vendor library')", "failed to load"),
    ("from fp8select import hookimpl\n@hookimpl\ndef fp8select_backends():\n    raise RuntimeError('boom')", "raised RuntimeError"),
    ("from fp8select import hookimpl\n@hookimpl\ndef fp8select_backends():\n    return [42]", "not a Backend"),
    ("from fp8select import Backend, hookimpl\nclass R(Backend):\n    name = 'reference'\n"
     "@hookimpl\ndef fp8select_backends():\n    return [R]", "already taken"),
    ("from fp8select import hookimpl\n@hookimpl\ndef fp8select_backends(unexpected):\n    return []", "not a valid plugin"),
])
def test_broken_plugins_are_reported_and_ignored(plugin_path: Path, source: str, fragment: str) -> None:
    install_distribution(plugin_path, "fp8select_test_bad", source, "fp8select_test_bad")
    install_distribution(plugin_path, "fp8select_test_good", GOOD, "fp8select_test_good")
    with pytest.warns(PluginWarning, match=fragment):
        selection = resolve(CPU)
    failure = next(c for c in selection.verdicts if c.name == "plugin:fp8select_test_bad")
    assert not failure.accepted and fragment in failure.reason
    assert selection.backend.name == "cpu-fast"


def test_plugin_objects_can_be_passed_directly() -> None:
    class Early(Backend):
        name = "early"
        requires = (DeviceKind(("cpu",)),)

    class Plugin:
        @hookimpl
        def fp8select_backends(self) -> list[object]:
            return [Placement(Early(), after="npu")]

    selection = resolve(CPU, plugins=[Plugin()])
    names = [c.name for c in selection.verdicts]
    assert names[names.index("npu") + 1] == "early"
    assert selection.backend.name == "early"
    assert resolve(CPU, plugins=False).backend.name == "reference"


class _RaisingGate(Backend):
    name = "raising-gate"

    def check(self, caps: object) -> object:  # type: ignore[override]
        raise RuntimeError("probe exploded")


class _NonsenseGate(Backend):
    name = "nonsense-gate"

    def check(self, caps: object) -> object:  # type: ignore[override]
        return "yes"


def _plugin_of(*backends: object) -> object:
    class Plugin:
        @hookimpl
        def fp8select_backends(self) -> list[object]:
            return list(backends)

    return Plugin()


@pytest.mark.parametrize("backend, fragment", [
    (_RaisingGate, "its device-level check raised RuntimeError: probe exploded"),
    (_NonsenseGate, "its device-level check returned 'yes', expected a Verdict"),
])
def test_a_plugin_gate_that_misbehaves_is_rejected_not_fatal(backend: type[Backend], fragment: str) -> None:
    selection = resolve(CPU, plugins=[_plugin_of(backend)])
    verdict = next(c for c in selection.verdicts if c.name == backend.name)
    assert not verdict.accepted and verdict.reason == fragment
    assert selection.backend.name == "reference"


@pytest.mark.parametrize("bad_name", ["Fast", "a,b", "has space", "-dash-first", 7])
def test_plugin_backend_names_must_be_usable_in_lists(bad_name: object) -> None:
    class Named(Backend):
        requires = (DeviceKind(("cpu",)),)

    Named.name = bad_name  # type: ignore[assignment]
    with pytest.warns(PluginWarning, match="is not valid: expected lowercase letters"):
        selection = resolve(CPU, plugins=[_plugin_of(Named)])
    assert selection.backend.name == "reference"
    assert any(c.name.startswith("plugin:") and "is not valid" in c.reason for c in selection.verdicts)


# --- foreign code: gates through safe_verdict, time limits, placements ----------------------------------

def _raises(problem: object, caps: object) -> object:
    raise RuntimeError("supports boom")


@pytest.mark.parametrize("gate, fragment", [
    (_raises, "its problem-level gate raised RuntimeError: supports boom"),
    (lambda problem, caps: sys.exit(5), "its problem-level gate raised SystemExit: exit status 5"),
    (lambda problem, caps: "yes", "its problem-level gate returned 'yes', expected a Verdict"),
    (lambda problem, caps: None, "its problem-level gate returned None, expected a Verdict"),
])
def test_safe_verdict_turns_a_misbehaving_gate_into_a_rejection(gate: object, fragment: str) -> None:
    verdict = safe_verdict(gate, Problem(256, 384), CPU, what="problem-level gate")  # type: ignore[arg-type]
    assert isinstance(verdict, Verdict) and not verdict.ok and verdict.reason == fragment


def test_safe_verdict_keeps_verdicts_and_lets_an_interrupt_through() -> None:
    assert safe_verdict(lambda: Verdict.accept("fine")) == Verdict.accept("fine")

    class Duck:
        ok, reason = False, "duck-typed"

    assert safe_verdict(lambda: Duck()) == Verdict.reject("duck-typed")

    def interrupted() -> Verdict:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        safe_verdict(interrupted)


def test_a_slow_import_is_abandoned_then_used_once_it_finished(plugin_path: Path) -> None:
    slow = "import time\ntime.sleep(0.6)\n" + GOOD.replace('"cpu-fast"', '"cpu-slow"')
    install_distribution(plugin_path, "fp8select_test_slow", slow, "fp8select_test_slow")
    caps = replace(CPU, env={"FP8SELECT_PLUGIN_TIMEOUT_S": "0.1"})
    with pytest.warns(PluginWarning, match="did not finish importing within 0.1 s"):
        first = resolve(caps)
    assert first.backend.name == "reference"
    importing = [t for t in threading.enumerate() if t.name == "fp8select-plugin-import-fp8select_test_slow"]
    assert len(importing) == 1
    importing[0].join(10)  # the abandoned import goes on in its thread and finishes
    assert not importing[0].is_alive()
    assert resolve(caps).backend.name == "cpu-slow"  # no second wait, no warning: the finished import is used


@pytest.mark.parametrize("raw, expected", [("", DEFAULT_TIMEOUT_S), (" 2.5 ", 2.5), ("inf", None), ("1e-3", 0.001)])
def test_plugin_timeout_from_the_environment(raw: str, expected: float | None) -> None:
    assert plugin_timeout({ENV_TIMEOUT: raw}) == expected


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "soon", "1s"])
def test_bad_plugin_timeout_is_a_typed_error(raw: str) -> None:
    with pytest.raises(InvalidInputError, match=f"{ENV_TIMEOUT}: expected a positive number of seconds"):
        plugin_timeout({ENV_TIMEOUT: raw})


def test_a_placement_naming_no_backend_warns_and_uses_the_default_place() -> None:
    class Typo(Backend):
        name = "typo-placed"
        requires = (DeviceKind(("cpu",)),)

    with pytest.warns(PluginWarning, match="placed before 'tritn', which is not in the order; placed before 'reference'"):
        selection = resolve(CPU, plugins=[_plugin_of(Placement(Typo, before="Tritn"))])
    names = [c.name for c in selection.verdicts]
    assert names.index("typo-placed") == names.index("reference") - 1


def test_placements_take_names_in_any_spelling() -> None:
    class Early(Backend):
        name = "early-dg"
        requires = (DeviceKind(("cpu",)),)

    selection = resolve(CPU, plugins=[_plugin_of(Placement(Early, after=" XPU_Scaled_MM "))])
    names = [c.name for c in selection.verdicts]
    assert names[names.index("xpu-scaled-mm") + 1] == "early-dg"


def test_verification_survives_a_backend_that_exits() -> None:
    from fp8select.verify import verify_backend

    class Exits(Backend):
        name = "exits-in-run"
        requires = (DeviceKind(("cpu",)),)

        def run(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            raise SystemExit("vendor library gave up")

    verdict = verify_backend(Exits(), CPU, "cpu")
    assert not verdict.ok and "raised SystemExit" in verdict.reason
