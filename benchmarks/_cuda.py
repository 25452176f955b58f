"""The one check every GPU tool makes before it measures anything, and the header its results start with."""

from __future__ import annotations

import sys
from typing import Any


def require_cuda(tool: str) -> None:
    """Exit with status 2 and a one-line message when no CUDA device is visible (no traceback, nothing written)."""
    import torch

    if not torch.cuda.is_available():
        print(f"{tool}: error: needs a CUDA GPU, found none (torch.cuda.is_available() is False)", file=sys.stderr)
        raise SystemExit(2)


def run_head(selection: Any, command: str) -> dict[str, Any]:
    """What a kept result names of its run: the GPU, torch, Triton, the packages the selection saw and the
    command that reproduces it."""
    import torch
    import triton

    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "packages": dict(selection.capabilities.packages), "command": command}
