"""What the vendor adapters share: entry-point lookup at first use, per-problem gates, activations.

A vendor package is imported only when a layer is prepared (``supports`` for a load-time
problem, ``prepare``), never when fp8select is imported or a backend is resolved. The
snapshot may already say which entry points the package exposes (``package_symbols``,
probed without importing it); when it does not, :func:`lookup` finds out at first use and a
missing entry point becomes a rejected verdict, so the layer goes to its next backend instead
of failing in the forward pass.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp8select.capabilities import Capabilities
from fp8select.errors import Fp8SelectError
from fp8select.guard import call_foreign
from fp8select.kernels.quant import ScaleLayout
from fp8select.kernels.vendor_layouts import to_mn_major
from fp8select.problem import Problem, dtype_name
from fp8select.verdict import Verdict


class VendorUnavailableError(Fp8SelectError, RuntimeError):
    """A vendor entry point an adapter needs is missing (or its package fails to import)."""


@dataclass(frozen=True)
class EntryPoint:
    """A vendor function found at first use: the callable and the name it was found under."""

    fn: Callable[..., Any]
    name: str
    module: str


def lookup(module: str, names: Sequence[str], why: str = "") -> EntryPoint | Verdict:
    """Import ``module`` and return the first of ``names`` it has, or a rejection saying what was found.

    Any exception of the import is a finding, not a crash: a vendor extension built for
    another torch or CUDA raises ``ImportError``, ``OSError`` or ``RuntimeError`` alike.
    """
    wanted = " or ".join(f"{module}.{n}" for n in names) + (f" ({why})" if why else "")
    imported = call_foreign(importlib.import_module, module)  # SystemExit at import included: never the host's exit
    if imported.error is not None:
        return Verdict.reject(f"requires {wanted}, found import {module} failed: {imported.error}")
    mod = imported.value
    for name in names:
        fn = getattr(mod, name, None)
        if callable(fn):
            return EntryPoint(fn, name, module)
    top = importlib.import_module(module.split(".")[0])
    version = getattr(top, "__version__", "of unknown version")
    return Verdict.reject(f"requires {wanted}, found {module.split('.')[0]} {version} without it")


def require(module: str, names: Sequence[str], why: str = "") -> EntryPoint:
    """:func:`lookup`, raising :class:`VendorUnavailableError` with the reason when it is missing."""
    found = lookup(module, names, why)
    if isinstance(found, Verdict):
        raise VendorUnavailableError(found.reason)
    return found


def entry_points_gate(problem: Problem, verdict: Verdict, caps: Capabilities, module: str,
                      *entry_points: Sequence[str], why: str = "") -> Verdict:
    """``verdict``, or at load time (``problem.m is None``) the :func:`lookup` rejection of the
    first of ``entry_points`` (each a tuple of alternative names) that ``module`` lacks.

    Where the snapshot recorded the package's entry points (``package_symbols``, read from its
    source without importing it) and every one needed is there, the package is not imported
    here: only a backend the plan uses is prepared, and its ``prepare`` imports it (a failure
    there leaves the backend out of the layer, with its reason). A vendor the plan does not use
    costs no import (FlashInfer's takes seconds)."""
    if problem.m is None:
        recorded = caps.package_symbols.get(module.split(".")[0])
        if recorded is not None and all(any(n in recorded for n in names) for names in entry_points):
            return verdict
        for names in entry_points:
            found = lookup(module, names, why)
            if isinstance(found, Verdict):
                return found
    return verdict


def e4m3fn_gate(verdict: Verdict, problem: Problem, caps: Capabilities, module: str, *entry_points: Sequence[str],
                why: str = "") -> Verdict:
    """The gate of a kernel taking e4m3fn weights and pre-quantized inputs: ``verdict`` (the
    shared gate's) when it rejects, then :func:`dtypes_ok`, then :func:`entry_points_gate`."""
    if not verdict.ok:
        return verdict
    rejected = dtypes_ok(problem, (torch.float8_e4m3fn,), (torch.float8_e4m3fn,))
    if rejected is not None:
        return rejected
    return entry_points_gate(problem, verdict, caps, module, *entry_points, why=why)


def multiple_of(problem: Problem, *, n: int = 1, k: int = 1, why: str = "") -> Verdict | None:
    """A rejection when N or K is not a multiple of ``n`` / ``k`` (``why`` explains the gate), else None."""
    note = f" ({why})" if why else ""
    if problem.n % n:
        return Verdict.reject(f"requires N % {n} == 0{note}, found N={problem.n}")
    if problem.k % k:
        return Verdict.reject(f"requires K % {k} == 0{note}, found K={problem.k}")
    return None


def dtypes_ok(problem: Problem, weights: Sequence[torch.dtype], prequantized: Sequence[torch.dtype]) -> Verdict | None:
    """A rejection when the weight's fp8 dtype, or a pre-quantized input's, is not one the kernel takes."""
    if problem.weight_dtype not in weights:
        allowed = "/".join(dtype_name(d) for d in weights)
        return Verdict.reject(f"requires weight {allowed}, found {dtype_name(problem.weight_dtype)}")
    if problem.pre_quantized and problem.act_dtype not in prequantized:
        if not prequantized:
            return Verdict.reject(f"requires unquantized activations, found pre-quantized {dtype_name(problem.act_dtype)}")
        allowed = "/".join(dtype_name(d) for d in prequantized)
        return Verdict.reject(f"requires pre-quantized activations {allowed}, found {dtype_name(problem.act_dtype)}")
    return None


def quantize_activation(x: torch.Tensor, dtype: torch.dtype, layout: ScaleLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 1x128 quantization with the scale written in ``layout`` (Triton on GPUs, torch elsewhere):
    :func:`bind_quantizer`'s quantizer, bound for this call only."""
    return bind_quantizer(x.shape[1], dtype, layout, x.device)(x)


Quantizer = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""``quantize(x, rows=None) -> (x_q, scale)``: a layer's activation quantizer, bound once."""


def bind_quantizer(k: int, dtype: torch.dtype, layout: ScaleLayout, device: torch.device) -> Quantizer:
    """The per-token 1x128 quantizer of one layer's activations (width ``k``, on ``device``), bound
    once: Triton's on GPUs (:class:`~fp8select.kernels.triton_quant.TritonQuantizer`), torch's
    elsewhere. ``rows`` (at least M) gives outputs of that many rows for a GEMM that pads M."""
    if device.type in ("cuda", "xpu"):
        try:
            from fp8select.kernels.triton_quant import TritonQuantizer
        except ImportError:
            pass
        else:
            return TritonQuantizer(k, dtype=dtype, layout=layout, device=device)

    def quantize(x: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        from fp8select.kernels.quant import quantize_per_token_group

        if rows is not None and rows != x.shape[0]:
            x = torch.cat([x, x.new_zeros((rows - x.shape[0], x.shape[1]))])
        return quantize_per_token_group(x, 128, dtype=dtype, layout=layout)

    return quantize


def quantized_input(x: torch.Tensor, input_scale: torch.Tensor | None, dtype: torch.dtype,
                    layout: ScaleLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` quantized to ``dtype`` with its scale in ``layout``, or, when the caller quantized
    it already (``input_scale`` given), ``x`` packed (a row-strided view is copied: sgl-kernel
    checks only ``stride(1) == 1`` and FlashInfer's groupwise kernels take a row-major ``a``)
    with that scale relaid out in ``layout``."""
    if input_scale is None:
        return quantize_activation(x, dtype, layout)
    return x.contiguous(), relayout_scale(input_scale, layout)


def relayout_scale(scale: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """A caller's activation scale [M, G] in ``layout`` (M-major with ``m_align`` padding, or row-major).

    Returned as is when it already is in that layout; UE8M0 rounding is not applied (a
    caller's scales are its own).
    """
    m, _ = scale.shape
    if not layout.mn_major:
        return scale.contiguous()
    return to_mn_major(scale, layout.padded_rows(m))


def pad_rows(x: torch.Tensor, scale: torch.Tensor | None, multiple: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` (and its scale) with rows appended up to a multiple of ``multiple`` (zeros; scale 1)."""
    m = x.shape[0]
    rows = -(-m // multiple) * multiple
    if rows == m:
        return x, scale
    padded = x.new_zeros((rows, x.shape[1]))
    padded[:m] = x
    if scale is None:
        return padded, None
    padded_scale = scale.new_ones((rows, scale.shape[1]))
    padded_scale[:m] = scale
    return padded, padded_scale


def add_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``out + bias`` in place, for kernels whose API has no bias argument."""
    if bias is None:
        return out
    return out.add_(bias.to(out.dtype))
