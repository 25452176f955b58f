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
