"""Third-party backends through a real entry point of a test distribution on sys.path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from matrix import MATRIX

from fp8select import Backend, resolve
from fp8select.plugins import Placement, PluginWarning, hookimpl
from fp8select.probes import DeviceKind

CPU = MATRIX["cpu-only"][0]


def _install_distribution(root: Path, name: str, module_source: str, entry: str) -> None:
    """Write ``module`` and a ``NAME-1.0.dist-info`` with an ``fp8select`` entry point under ``root``."""
    (root / f"{name}.py").write_text(textwrap.dedent(module_source))
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[fp8select]\n{name} = {entry}\n")


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
    _install_distribution(plugin_path, "fp8select_test_good", GOOD, "fp8select_test_good")
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
    _install_distribution(plugin_path, "fp8select_test_bad", source, "fp8select_test_bad")
    _install_distribution(plugin_path, "fp8select_test_good", GOOD, "fp8select_test_good")
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
