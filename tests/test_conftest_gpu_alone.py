"""The GPU tests' guard against sharing a process with the interpreter tests (tests/conftest.py)."""

from __future__ import annotations

import conftest
import pytest
import torch


class _Item:
    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu

    def get_closest_marker(self, name: str) -> object:
        return object() if self.gpu and name == "gpu" else None


@pytest.mark.parametrize(("gpu", "interpret", "cuda", "skips"), [
    (True, "1", True, True), (True, None, True, False), (True, "1", False, False), (False, "1", True, False)])
def test_a_gpu_test_in_an_interpreter_process_is_skipped_with_the_command(
        monkeypatch: pytest.MonkeyPatch, gpu: bool, interpret: str | None, cuda: bool, skips: bool) -> None:
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if skips:
        with pytest.raises(pytest.skip.Exception, match="process of their own"):
            conftest.pytest_runtest_setup(_Item(gpu))
    else:
        conftest.pytest_runtest_setup(_Item(gpu))
