"""Importing fp8select has no side effects; the docs table matches the declarations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_docs_backends_table_matches_declarations() -> None:
    text = (Path(__file__).parent.parent / "docs" / "backends.md").read_text(encoding="utf-8")
    assert _docs.generated_section() in text, "docs/backends.md is stale: run python -c 'import fp8select._docs as d; d.write()'"
