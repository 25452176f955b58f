"""Backend names as users type them: one canonical spelling per backend, aliases as data.

Engines and their users spell backends their own way (SGLang's ``--fp8-gemm-backend
deep_gemm``, ``FP8SELECT_BACKEND=" Triton "``). Every place that reads a backend name
(``resolve(backend=, disable=, order=)``, ``FP8SELECT_BACKEND``, ``FP8SELECT_DISABLE`` and the
CLI flags) goes through :func:`canonical`: surrounding whitespace and case are ignored and an
alias from :data:`ALIASES` becomes the backend's own name. :data:`AUTO` as an explicit choice
means "no explicit choice". This module imports nothing of fp8select's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

AUTO = "auto"
"""As ``backend=`` / ``FP8SELECT_BACKEND`` / ``--backend``: no explicit choice (the same as unset)."""

ALIASES: Mapping[str, str] = MappingProxyType({
    # SGLang's --fp8-gemm-backend / vLLM spellings, and the package names users know the kernels by
    "deep_gemm": "deepgemm",
    "deep-gemm": "deepgemm",
    "flashinfer_trtllm": "flashinfer",
    "flashinfer-trtllm": "flashinfer",
    "sgl_kernel": "cutlass",
    "sgl-kernel": "cutlass",
    "torch_npu": "npu",
    "ascend": "npu",
    # underscores for the hyphens of fp8select's own names
    "xpu_scaled_mm": "xpu-scaled-mm",
    "cuda_scaled_mm": "cuda-scaled-mm",
})
"""Other spellings (lowercase) -> the backend name fp8select uses. Keys are never backend names."""

RESERVED = frozenset({AUTO, *ALIASES})
"""Spellings a (plugin) backend may not take as its name: they already mean something else."""


def canonical(name: str) -> str:
    """``" Deep_GEMM "`` -> ``"deepgemm"``: stripped, lowercased, aliases resolved.

    A name that is neither a backend nor an alias comes back stripped and lowercased, so the
    error that follows names it in the form every valid name has.
    """
    key = name.strip().lower()
    return ALIASES.get(key, key)


def parse_names(value: str | Iterable[str]) -> tuple[str, ...]:
    """``"a, B"`` or ``["a", " b "]`` -> ``("a", "b")``: canonical names, blanks dropped, each once.

    A name given twice (or under two spellings, ``deep_gemm`` and ``deepgemm``) counts once,
    at its first position: a priority order or a disabled set holds each backend at most once.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    names = (canonical(s) for s in items if isinstance(s, str) and s.strip())
    return tuple(dict.fromkeys(names))


def explicit_choice(value: str | None) -> str | None:
    """An explicit choice as typed -> its canonical name, or None when blank or ``auto``."""
    if value is None:
        return None
    name = canonical(value)
    return None if name in ("", AUTO) else name
