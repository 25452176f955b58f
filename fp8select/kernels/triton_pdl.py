"""Programmatic dependent launch (PDL) for fp8select's Triton kernels on Hopper and later.

A kernel launched with PDL may be scheduled while the kernel before it in the stream is still
finishing: its programs become resident and wait in :func:`pdl_enter` (``griddepcontrol.wait``)
until the previous kernel's memory is visible, so the launch and the ramp-up of one kernel
overlap the tail of the one before it (about a microsecond per kernel boundary, a large share
of a decode GEMM of a few microseconds). Every fp8select kernel waits before it touches memory
at all (weights included: the previous kernel may be the one that wrote them), then lets its
own dependents launch. A kernel launched without PDL, or followed by one, behaves as before.

Used where it was measured to help (H200, runs 13, 14 and 16): launches of at most
:data:`PDL_MAX_M` tokens (at M 128-512 the tuned times were 3-5% slower), where it exists (NVIDIA,
compute capability 9.0 or more, compiled kernels). A GEMM behind the quantization kernel only for
weights of at most :data:`PDL_MAX_WEIGHT` elements (2-10% faster at 16-38M elements, 2-8% slower
at 117-264M); a GEMM that quantizes in the kernel (one launch per op) at every weight size (run
16: 2-7% faster at 16-38M elements, and up to 4% faster, never slower by more than the noise, at
117-264M). ``FP8SELECT_TRITON_PDL=0`` (read once per process, at the first launch) turns it off.

The gain measured replays one op back to back, so each op's first kernel overlaps the previous
op's last; in a model that holds where the kernel before also lets its dependents launch early
(fp8select's own kernels do); within one op (quantizer, GEMM, split-K sum) it always does.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

__all__ = ["ENV_PDL", "PDL_MAX_M", "PDL_MAX_WEIGHT", "pdl_enter", "pdl_launch", "pdl_possible", "prefetch_l2", "use_pdl"]

ENV_PDL = "FP8SELECT_TRITON_PDL"

PDL_MAX_M = 16
"""Largest M launched with PDL (decode; see the module docstring)."""

PDL_MAX_WEIGHT = 1 << 26
"""Largest weight (N x K elements) whose GEMM behind the quantization kernel is launched with PDL
(see the module docstring)."""


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a kernel: wait for the previous kernel, then let the next one launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines holding ``ptrs`` (``prefetch.global.L2``: a hint, no data comes back).
    Safe before :func:`pdl_enter`'s wait even on memory the previous kernel may still write: L2 is where
    every SM's accesses meet, so the loads after the wait read what that kernel wrote."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


def pdl_launch(pdl: bool) -> dict[str, bool]:
    """The keyword arguments of a direct ``kernel[grid](...)`` launch with PDL (``pdl``), none without: the
    kernel's ``PDL`` (its :func:`pdl_enter` waits) and Triton's ``launch_pdl`` go together, since a kernel
    launched early that does not wait reads what the previous one has not written yet."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


def use_pdl(kernel: object, device: torch.device, m: int, weight_elements: int = 0) -> bool:
    """Whether ``kernel`` launched on ``device`` for ``m`` tokens uses PDL (the kernel's ``PDL`` and
    Triton's ``launch_pdl``). ``weight_elements``: the weight of a GEMM that runs behind the
    quantization kernel; 0 for the quantizer and for GEMMs that quantize in the kernel."""
    return m <= PDL_MAX_M and pdl_possible(kernel, device, weight_elements)


def pdl_possible(kernel: object, device: torch.device, weight_elements: int = 0) -> bool:
    """:func:`use_pdl` for launches of at most :data:`PDL_MAX_M` tokens: what does not depend on M, for
    a launch bound once and then asked per call only whether its M is small enough."""
    if weight_elements > PDL_MAX_WEIGHT:
        return False
    if device.type != "cuda" or type(kernel).__name__ == "InterpretedFunction":
        return False
    return _device_has_pdl(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _device_has_pdl(index: int) -> bool:
    if os.environ.get(ENV_PDL, "1").strip() == "0" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9 and _triton_launches_pdl()


def _triton_launches_pdl() -> bool:
    """Whether this Triton has the ``launch_pdl`` option (3.4 and later)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
