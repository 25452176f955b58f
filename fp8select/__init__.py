"""fp8select: choose, explain and run the kernel for block-wise FP8 linear layers.

Importing this package imports no vendor package and no Triton, and initialises no
device: everything happens when :func:`resolve` (or :func:`detect_capabilities`) is called.
"""

from fp8select._version import __version__ as __version__
from fp8select.backends import DEFAULT_ORDER, Backend, PreparedWeight
from fp8select.capabilities import Capabilities
from fp8select.decision import Decision, choose
from fp8select.detect import detect_capabilities, forget_detected
from fp8select.errors import (
    BackendRejectedError,
    BatchInvariantError,
    CapabilitiesError,
    Fp8SelectError,
    InvalidDtypeError,
    InvalidInputError,
    NoBackendError,
    NotPicklableError,
    NotPreparedError,
    RankMismatchError,
    UnknownBackendError,
    UnsupportedProblemError,
)
from fp8select.kernels.weight_quant import quantize_weight
from fp8select.layer import Fp8Linear
from fp8select.plan import Plan, Route
from fp8select.plugins import Placement, hookimpl
from fp8select.problem import Problem
from fp8select.resolver import resolve
from fp8select.selection import Selection
from fp8select.verdict import Candidate, Verdict
from fp8select.warmup import WarmupReport, warmup

__all__ = [
    "DEFAULT_ORDER",
    "Backend",
    "BackendRejectedError",
    "BatchInvariantError",
    "Candidate",
    "Capabilities",
    "CapabilitiesError",
    "Decision",
    "Fp8Linear",
    "Fp8SelectError",
    "InvalidDtypeError",
    "InvalidInputError",
    "NoBackendError",
    "NotPicklableError",
    "NotPreparedError",
    "Placement",
    "Plan",
    "PreparedWeight",
    "Problem",
    "RankMismatchError",
    "Route",
    "Selection",
    "UnknownBackendError",
    "UnsupportedProblemError",
    "Verdict",
    "WarmupReport",
    "choose",
    "detect_capabilities",
    "forget_detected",
    "hookimpl",
    "quantize_weight",
    "resolve",
    "warmup",
]


def __getattr__(name: str) -> object:
    """``fp8select.nn`` on first use, so ``import fp8select`` imports no ``torch.nn`` module code of ours."""
    if name == "nn":
        import importlib

        return importlib.import_module("fp8select.nn")
    raise AttributeError(f"module 'fp8select' has no attribute {name!r}")
