"""Every test runs with its own home and cache directories, so nothing reads or writes the user's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("FP8SELECT_CACHE_DIR", raising=False)
    monkeypatch.delenv("FP8SELECT_TUNING_TABLE", raising=False)
    yield home
