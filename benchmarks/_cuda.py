"""The one check every GPU tool makes before it measures anything."""

from __future__ import annotations

import sys


def require_cuda(tool: str) -> None:
    """Exit with status 2 and a one-line message when no CUDA device is visible (no traceback, nothing written)."""
    import torch

    if not torch.cuda.is_available():
        print(f"{tool}: error: needs a CUDA GPU, found none (torch.cuda.is_available() is False)", file=sys.stderr)
        raise SystemExit(2)
