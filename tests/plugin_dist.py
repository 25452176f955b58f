"""Installed-looking plugin distributions for tests: a module and a ``dist-info`` with an entry point."""

from __future__ import annotations

import textwrap
from pathlib import Path


def install_distribution(root: Path, name: str, module_source: str, entry: str | None = None) -> None:
    """Write ``NAME.py`` and a ``NAME-1.0.dist-info`` with an ``fp8select`` entry point under ``root``
    (a directory on ``sys.path``), so that ``importlib.metadata`` finds it like an installed plugin."""
    (root / f"{name}.py").write_text(textwrap.dedent(module_source))
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[fp8select]\n{name} = {entry or name}\n")
