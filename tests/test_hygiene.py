"""Importing fp8select has no side effects; the docs table matches the declarations."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fp8select
from fp8select import _docs

CHECK = """
import sys, logging
before = set(sys.modules)
root_handlers = list(logging.getLogger().handlers)
import fp8select
import torch
new = set(sys.modules) - before
vendors = [m for m in new if m.split(".")[0] in ("triton", "deep_gemm", "flashinfer", "sgl_kernel", "aiter", "torch_npu")]
assert not vendors, vendors
assert not torch.cuda.is_initialized()
assert logging.getLogger().handlers == root_handlers
assert not logging.getLogger("fp8select").handlers
assert "fp8select.kernels.triton_gemm" not in sys.modules
print("clean")
"""


def test_import_has_no_side_effects() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "clean"


@pytest.mark.parametrize("name", sorted(_docs.SECTIONS))
def test_generated_docs_match_the_code(name: str) -> None:
    """The backend requirements (from the declarations) and the served shapes (from the model catalogue and
    the shipped tables) as the docs show them."""
    path = _docs.SECTIONS[name][0]
    text = (Path(__file__).parent.parent / path).read_text(encoding="utf-8")
    assert _docs.generated_section(name) in text, f"{path} is stale: run python -c 'import fp8select._docs as d; d.write()'"


# --- packaging and first contact -------------------------------------------------------------------------

ROOT = Path(__file__).parent.parent


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    data: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return data


def test_the_version_is_written_once() -> None:
    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fp8select._version.__version__"}
    written = [p for p in (ROOT / "fp8select").rglob("*.py") if "__version__ = " in p.read_text(encoding="utf-8")]
    assert [p.name for p in written] == ["_version.py"]
    assert re.search(rf"^## {re.escape(fp8select.__version__)}\b", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert "## Unreleased" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_license_and_metadata() -> None:
    project = _pyproject()
    assert project["project"]["license"] == "Apache-2.0" and project["project"]["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    requires = project["build-system"]["requires"]
    assert requires == ["setuptools>=77"], "an SPDX license string needs setuptools 77"
    assert project["project"]["urls"] and project["project"]["classifiers"]
    assert not any(c.startswith("License ::") for c in project["project"]["classifiers"])  # PEP 639: the expression only


def test_the_source_distribution_carries_what_its_tests_need() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines()
    for line in ("graft tests", "graft docs", "include README.md CHANGELOG.md LICENSE", "recursive-include benchmarks *.py"):
        assert line in manifest, line


def _quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_quick_start_is_two_cpu_only_commands_and_ci_runs_the_second() -> None:
    first, second = _quick_start()
    for command in (first, second):
        assert "\n" not in command and "torch==" in command
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in command  # the CPU wheel, not CUDA's
    assert first.endswith("python -m fp8select explain") and "numpy" in first  # no "Failed to initialize NumPy"
    assert second.endswith("python -m pytest -q")
    ci = ROOT / ".ci" / "run"
    if not ci.exists():
        pytest.skip("no .ci/run here (a source distribution carries the README, not the CI script)")
    assert ci.read_text(encoding="utf-8").splitlines()[-1] == second
