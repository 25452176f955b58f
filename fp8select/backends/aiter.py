"""``aiter``: AMD AITER ``gemm_a8w8_blockscale`` (CK kernels) on MI300 (gfx942) / MI350 (gfx950).

API followed (docs/vendor-apis.md, "AITER"; ROCm/aiter aiter/ops/gemm_op_a8w8.py at commit
0006ebde, aiter/ops/shuffle.py at 0122c481; PyPI ``amd-aiter``):
``aiter.gemm_a8w8_blockscale(XQ, WQ, x_scale, w_scale, dtype=torch.bfloat16)`` with XQ [M, K]
and WQ [N, K] in ``aiter.dtypes.fp8``, ``x_scale`` fp32 [M, K/128] row-major and ``w_scale``
fp32 [N/128, K/128] row-major (the checkpoint layouts), as vLLM and SGLang call it; optionally
``aiter.gemm_a8w8_blockscale_bpreshuffle(XQ, shuffle_weight(WQ, (16, 16)), x_scale, w_scale,
dtype=...)`` with ``x_scale`` M-major (strides (1, M)). Both return a new [M, N] tensor; no
bias argument, so it is added afterwards.

Load-time work (:meth:`AiterBackend.prepare`):

* gfx942 computes in ``float8_e4m3fnuz``: an e4m3fn checkpoint is converted (same bits, 0x80
  -> 0, scales doubled); the fallback shares the converted weight and scales (``scale_nk``).
* the pre-shuffled weight layout, used only when opted in with ``FP8SELECT_AITER_PRESHUFFLE=1``
  on gfx950 with HIP >= 7.2 (SGLang's condition: hipcc 7.0 miscompiles that kernel, SGLang
  #23319) and N % 16 == 0, K % 32 == 0.

Gates: opt-in with ``FP8SELECT_USE_AITER=1`` (as engines gate AITER); gfx942/gfx950 (CK
prebuilt blockscale kernels). The CK kernels' shape limits are unverified, so N and K must be
multiples of 128. On gfx950 with HIP < 7.2 the non-preshuffled kernel gave NaN in SGLang from
a per-shape M on (M >= 4096 for (N, K) = (2560, 4096)): such calls go to the fallback.
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch

from fp8select.backends._vendor import (
    EntryPoint,
    add_bias,
    entry_points_gate,
    quantize_activation,
    relayout_scale,
    require,
)
from fp8select.backends.base import CHECKPOINT_LAYOUT, FNUZ_LAYOUT, Backend, BLOCK_128x128, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.kernels.quant import M_MAJOR, ROW_MAJOR, ScaleLayout
from fp8select.kernels.vendor_layouts import e4m3fn_to_e4m3fnuz, shuffle_weight_16x16
from fp8select.probes import DeviceKind, EnvFlag, GfxArch, Package, Probe
from fp8select.probes.core import PackageSymbols
from fp8select.problem import Problem, dtype_name
from fp8select.verdict import Verdict

AITER_FLAG = "FP8SELECT_USE_AITER"
PRESHUFFLE_FLAG = "FP8SELECT_AITER_PRESHUFFLE"
MODULE = "aiter"
GEMM = "gemm_a8w8_blockscale"
GEMM_PRESHUFFLED = "gemm_a8w8_blockscale_bpreshuffle"
PRESHUFFLE_MIN_HIP = (7, 2)
GFX950_NAN_MIN_M = 4096  # SGLang: NaN from the non-preshuffled CK kernel at M >= 4096 on (2560, 4096), HIP < 7.2
_TRUE = ("1", "true", "yes", "on")


def _hip(caps: Capabilities) -> tuple[int, int] | None:
    """(major, minor) of the HIP build, read leniently (``6.4.43482-0f2d60242`` is 6.4)."""
    found = re.match(r"(\d+)\.(\d+)", caps.hip_version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def _hip_at_least(caps: Capabilities, version: tuple[int, int]) -> bool:
    hip = _hip(caps)
    return hip is not None and hip >= version


def use_preshuffle(caps: Capabilities, n: int, k: int) -> bool:
    """Whether a layer of this shape uses the pre-shuffled weight path on this machine (opt-in)."""
    flag = caps.env.get(PRESHUFFLE_FLAG, "").strip().lower() in _TRUE
    exposed = GEMM_PRESHUFFLED in caps.package_symbols.get(MODULE, (GEMM_PRESHUFFLED,))
    return (flag and exposed and caps.gfx_arch == "gfx950" and _hip_at_least(caps, PRESHUFFLE_MIN_HIP)
            and n % 16 == 0 and k % 32 == 0)


class AiterBackend(Backend):
    name = "aiter"
    summary = f"AITER gemm_a8w8_blockscale on gfx942 (e4m3fnuz) / gfx950; opt-in with {AITER_FLAG}=1"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("rocm",)),
        GfxArch(("gfx942", "gfx950")),
        Package(MODULE),
        EnvFlag(AITER_FLAG),
        PackageSymbols(MODULE, (GEMM,)),
    )
    block_sizes = (BLOCK_128x128,)
    n_multiple = 128
    k_multiple = 128
    packages = (MODULE,)

    # Activation-scale layouts (class attributes so a test can substitute a wrong one).
    activation_scale_layout: ClassVar[ScaleLayout] = ROW_MAJOR
    preshuffle_scale_layout: ClassVar[ScaleLayout] = M_MAJOR
    normalise_fnuz: ClassVar[bool] = True

    def weight_dtype(self, caps: Capabilities) -> torch.dtype:
        return torch.float8_e4m3fnuz if caps.gfx_arch == "gfx942" else torch.float8_e4m3fn

    def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
        """fp8 dtypes per arch; on gfx950 with HIP < 7.2 non-preshuffled calls below M=4096; the entry point."""
        verdict = super().supports(problem, caps)
        if not verdict.ok:
            return verdict
        native = self.weight_dtype(caps)
        # gfx942 takes an e4m3fn checkpoint (converted at load) and e4m3fn inputs (converted per call).
        accepted = (torch.float8_e4m3fn, torch.float8_e4m3fnuz) if native == torch.float8_e4m3fnuz else (native,)
        if problem.weight_dtype not in accepted or (problem.pre_quantized and problem.act_dtype not in accepted):
            found = problem.act_dtype if problem.weight_dtype in accepted else problem.weight_dtype
            return Verdict.reject(f"requires fp8 {'/'.join(dtype_name(d) for d in accepted)} on {caps.gfx_arch}, "
                                  f"found {dtype_name(found)}")
        preshuffle = use_preshuffle(caps, problem.n, problem.k)
        if (problem.m is not None and problem.m >= GFX950_NAN_MIN_M and caps.gfx_arch == "gfx950" and not preshuffle
                and not _hip_at_least(caps, PRESHUFFLE_MIN_HIP)):
            return Verdict.reject(f"requires M < {GFX950_NAN_MIN_M} for the non-preshuffled CK kernel on gfx950 with "
                                  f"HIP < 7.2 (NaN seen by SGLang; per-shape threshold unverified), found M={problem.m}, "
                                  f"HIP {caps.hip_version}")
        return entry_points_gate(problem, verdict, caps, MODULE, (GEMM_PRESHUFFLED if preshuffle else GEMM,))

    def weight_layout(self, caps: Capabilities, problem: Problem) -> str:
        """The pre-shuffled copy when opted in; an e4m3fnuz copy of an e4m3fn checkpoint on gfx942
        (shared with Triton's); else the checkpoint."""
        if use_preshuffle(caps, problem.n, problem.k):
            return "aiter-preshuffled"
        if self.normalise_fnuz and self.weight_dtype(caps) == torch.float8_e4m3fnuz and problem.weight_dtype == torch.float8_e4m3fn:
            return FNUZ_LAYOUT
        return CHECKPOINT_LAYOUT

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """fnuz on gfx942 (scales doubled); the (16, 16) pre-shuffle when opted in; scales row-major."""
        n, k = weight.shape
        preshuffle = use_preshuffle(caps, n, k)
        gemm = require(MODULE, (GEMM_PRESHUFFLED if preshuffle else GEMM,))
        w, scale = weight.contiguous(), weight_scale.contiguous()
        shared: torch.Tensor | None = w
        if self.normalise_fnuz and self.weight_dtype(caps) == torch.float8_e4m3fnuz and w.dtype == torch.float8_e4m3fn:
            w, scale = e4m3fn_to_e4m3fnuz(w, scale)
            shared = w  # the fallback (Triton needs fnuz on gfx942 too) shares it, with scale_nk
        scale_nk = scale if scale is not weight_scale else None
        if preshuffle:
            w = shuffle_weight_16x16(w)
            shared, scale_nk = None, None
        return PreparedWeight(self.name, w, scale, block_pair(block_size), n, k, shared,
                              extra={"gemm": gemm, "preshuffled": preshuffle}, scale_nk=scale_nk)

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        gemm: EntryPoint = prepared.extra["gemm"]
        layout = self.preshuffle_scale_layout if prepared.extra["preshuffled"] else self.activation_scale_layout
        fp8 = prepared.weight.dtype
        if input_scale is None:
            x_q, x_s = quantize_activation(x, fp8, layout)
        else:
            x_q, x_s = x, input_scale
            if x_q.dtype != fp8:  # a caller's e4m3fn activations on gfx942
                x_q, x_s = e4m3fn_to_e4m3fnuz(x_q, x_s)
            x_s = relayout_scale(x_s, layout)
        out = gemm.fn(x_q, prepared.weight, x_s, prepared.scale, dtype=out_dtype)
        return add_bias(out, bias)
