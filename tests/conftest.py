"""Every test runs with its own home and cache directories, so nothing reads or writes the user's; GPU tests
plan from the tables (``FP8SELECT_TUNE=off``) unless they ask for load-time measurement.

GPU tests need compiled Triton kernels; the CPU test modules that run Triton's interpreter set
``TRITON_INTERPRET=1`` for their whole process, so on a GPU machine a GPU test that shares a
process with them is skipped with the command that runs it, instead of failing inside the
interpreter.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

GPU_ALONE = ("TRITON_INTERPRET=1 in this process (a CPU interpreter test module set it): run the GPU tests in a "
             "process of their own, python -m pytest -m gpu tests/test_kernels_gpu.py tests/test_gpu.py "
             "tests/test_gpu_vendors.py tests/test_verify_chain.py tests/test_triton_launch_gpu.py, then "
             "tests/test_compile_gpu.py "
             "tests/test_transformers_gpu.py tests/test_moe_gpu.py")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None or os.environ.get("TRITON_INTERPRET") != "1":
        return
    import torch

    if torch.cuda.is_available():
        pytest.skip(GPU_ALONE)


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> None:
    """Every test starts from a global torch generator state of its own (seeded from its id): a test that draws
    unseeded data draws the same data whatever ran before it. One whose tolerance such data could cross passed or
    failed with what earlier tests had drawn (a DeepGEMM fake test's error moved from 1.5e-3 to 5.2e-3)."""
    import torch

    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _private_home(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    if request.node.get_closest_marker("gpu") is not None:  # plans from the tables; a test that measures at load says so
        monkeypatch.setenv("FP8SELECT_TUNE", "off")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("FP8SELECT_CACHE_DIR", raising=False)
    monkeypatch.delenv("FP8SELECT_TUNING_TABLE", raising=False)
    yield home
