"""Fake ``sgl_kernel`` (sgl-project/sglang ``sgl-kernel``) for CPU tests.

Emulates ``sgl_kernel.fp8_blockwise_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype)``,
the CUTLASS block-wise FP8 GEMM (``torch.ops.sgl_kernel.fp8_blockwise_scaled_mm``), and the MoE
entry points ``fp8_blockwise_scaled_grouped_mm`` and ``prepare_moe_input`` (tests/fakes/sgl_kernel_moe.py,
the API and sources each follows are named there). For the dense GEMM the
``TORCH_CHECK``s of ``sgl-kernel/csrc/gemm/fp8_blockwise_gemm_kernel.cu`` are reproduced
with their messages, then the product is computed in float64 and returned as a new tensor.

Checked against the real ``sglang-kernel`` 0.4.4 (distribution ``sglang-kernel``, import name
``sgl_kernel``; ``sgl_kernel/version.py`` says ``0.4.4``): ``sgl_kernel/gemm.py`` defines
``fp8_blockwise_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype)`` (positional, no
defaults), forwarding to ``torch.ops.sgl_kernel.fp8_blockwise_scaled_mm.default``, whose schema
in ``sm90/common_ops.abi3.so`` is ``fp8_blockwise_scaled_mm(Tensor mat_a, Tensor mat_b, Tensor
scales_a, Tensor scales_b, ScalarType out_dtype) -> Tensor``; every check message reproduced here
is a string of that binary ("mat_b must be a column major tensor", "scales_a must be M major",
"scales_b must be K major", "size of scales_a is not matched", "out_dtype must be Half or
BFloat16", ...), and the binary holds SM100 and SM120 launchers
(``launch_sm100_fp8_blockwise_scaled_mm``, ``launch_sm120_fp8_blockwise_scaled_mm``). The C++
source of 0.4.4 is not part of the package; the checks' order and the padding of M to 4 rows
(``pad_tensor``) and the per-call ``scales_b.contiguous()`` on SM90 are from the sgl-kernel
sources of the same function.

Knobs (on ``fake.impl``; ``set_sm_version`` / ``reset`` are also module functions):

* ``sm_version``: emulated SM (``90``, ``100``, ``120``...), default 90.
* ``supported_sms``: SMs this build dispatches, default ``(90, 100, 120)`` (0.4.4's launchers;
  SM103 unverified). 0.3.x builds dispatched ``(90, 100)`` only; pass that to emulate them.
  Others raise ``NotImplementedError`` (``TORCH_CHECK_NOT_IMPLEMENTED``).

Deliberately stricter than the library: K and N must be multiples of 128 (the library checks
``K // 128`` and ``N // 128`` scale groups, so tail blocks are undefined), and ``mat_a`` must
be packed (``stride(0) == K``): the library checks only ``stride(1) == 1``, and whether its SM90
CUTLASS call honours another row stride is not known here.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Call, dequantize_blockwise, make_vendor_module, recorded
from .sgl_kernel_moe import FakeSglKernelMoe


def _torch_check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _is_contiguous_vector(t: torch.Tensor) -> bool:
    return t.is_contiguous() and (t.dim() == 1 or (t.dim() == 2 and min(t.shape) == 1))


class FakeSglKernel:
    """State and behaviour of one installed fake ``sgl_kernel``."""

    def __init__(self, *, sm_version: int = 90, supported_sms: tuple[int, ...] = (90, 100, 120), version: str = "0.4.4") -> None:
        self.version = version
        self._initial = (int(sm_version), tuple(supported_sms))
        self.sm_version, self.supported_sms = self._initial

    def set_sm_version(self, sm_version: int) -> None:
        """Emulate another GPU (``getSMVersion()`` value, e.g. 90, 100, 120)."""
        self.sm_version = int(sm_version)

    def reset(self) -> None:
        """Restore the install-time SM version and supported set."""
        self.sm_version, self.supported_sms = self._initial

    def fp8_blockwise_scaled_mm(
        self,
        mat_a: torch.Tensor,
        mat_b: torch.Tensor,
        scales_a: torch.Tensor,
        scales_b: torch.Tensor,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``(mat_a * scales_a) @ (mat_b * scales_b)``: A [M, K] row-major, B [K, N] column-major."""
        _torch_check(mat_a.dim() == 2, "mat_a must be a 2D tensor")
        _torch_check(mat_b.dim() == 2, "mat_b must be a 2D tensor")
        _torch_check(mat_a.stride(1) == 1, "mat_a must be a row major tensor")
        _torch_check(mat_b.stride(0) == 1, "mat_b must be a column major tensor")
        _torch_check(mat_a.size(1) == mat_b.size(0), "mat_a and mat_b shapes cannot be multiplied")
        _torch_check(mat_a.size(1) * mat_a.element_size() % 16 == 0, "mat_a must be multiple of 16 bytes for memory alignment")
        _torch_check(mat_b.size(0) * mat_b.element_size() % 16 == 0, "mat_b must be multiple of 16 bytes for memory alignment")
        _torch_check(mat_a.dtype == torch.float8_e4m3fn, "mat_a must be Float8_e4m3fn")
        _torch_check(mat_b.dtype == torch.float8_e4m3fn, "mat_b must be Float8_e4m3fn")
        _torch_check(out_dtype in (torch.float16, torch.bfloat16), "out_dtype must be Half or BFloat16")
        m, k = mat_a.shape
        n = mat_b.shape[1]
        _torch_check(scales_a.dim() == 2 and scales_b.dim() == 2, "scales must be 2D tensors")
        _torch_check(m == scales_a.size(0), "size of scales_a is not matched")
        _torch_check(k // 128 == scales_a.size(1), "size of scales_a is not matched")
        _torch_check(scales_a.stride(0) == 1 or _is_contiguous_vector(scales_a), "scales_a must be M major")
        _torch_check(k // 128 == scales_b.size(0), "size of scales_b is not matched")
        _torch_check(n // 128 == scales_b.size(1), "size of scales_b is not matched")
        _torch_check(scales_b.stride(0) == 1 or _is_contiguous_vector(scales_b), "scales_b must be K major")
        _torch_check(scales_a.dtype == torch.float32, "scales_a must be Float32")
        _torch_check(scales_b.dtype == torch.float32, "scales_b must be Float32")
        _torch_check(
            mat_a.stride(0) == k or m == 1,
            f"mat_a must be packed, stride(0) == K (fake: the library checks only stride(1) == 1), got strides "
            f"{tuple(mat_a.stride())}",
        )
        element = torch.empty((), dtype=out_dtype).element_size()
        _torch_check(n * element % 16 == 0, "out must be multiple of 16 bytes for memory alignment")
        _torch_check(
            k % 128 == 0 and n % 128 == 0,
            f"K and N must be multiples of 128 (fake: the kernel checks floor(K/128), floor(N/128) scale groups, "
            f"so tail blocks are undefined upstream), got K={k}, N={n}",
        )
        if self.sm_version not in self.supported_sms:
            raise NotImplementedError(f"No implemented fp8_blockwise_scaled_mm for current compute capability: {self.sm_version}")
        a = dequantize_blockwise(mat_a, scales_a, 1, 128)
        b = dequantize_blockwise(mat_b.t(), scales_b.t(), 128, 128)
        return (a @ b.T).to(out_dtype)


def build(log: list[Call], **options: Any) -> tuple[FakeSglKernel, dict[str, Any]]:
    """Build the fake ``sgl_kernel`` package; ``options`` are ``FakeSglKernel`` keyword knobs."""
    impl = FakeSglKernel(**options)
    moe = FakeSglKernelMoe(impl)  # the MoE entry points (tests/fakes/sgl_kernel_moe.py)
    module = make_vendor_module(
        "sgl_kernel",
        {
            "__version__": impl.version,
            "fp8_blockwise_scaled_mm": recorded(log, "sgl_kernel", "fp8_blockwise_scaled_mm", impl.fp8_blockwise_scaled_mm),
            **{name: recorded(log, "sgl_kernel", name, getattr(moe, name))
               for name in ("fp8_blockwise_scaled_grouped_mm", "prepare_moe_input")},
            "set_sm_version": impl.set_sm_version,
            "reset": impl.reset,
            "FAKE": impl,
        },
        __doc__ or "",
    )
    return impl, {"sgl_kernel": module}
