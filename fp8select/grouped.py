"""Block-FP8 grouped GEMMs, public, for engines that dispatch tokens themselves (DeepEP and the like).

Two layouts, as DeepGEMM names them, each ``out = dequant(a) @ dequant(w[e]).T`` per row of expert ``e``
with fp8 ``a`` quantized per 1x128 group (fp32 scales, any strides) and ``w`` ``[E, N, K]`` float8_e4m3fn
with fp32 ``[E, ceil(N/128), ceil(K/128)]`` block scales:

* :func:`grouped_gemm_contiguous`: ``a`` ``[R, K]``, ``expert_of_row`` int32 ``[R]`` (-1: padding) ->
  ``[R, N]``. fp8select's implementations take rows in any order; DeepGEMM wants each expert's rows
  together, padded to its alignment (128), so its rows come in blocks.
* :func:`grouped_gemm_masked`: ``a`` ``[E, max_m, K]``, ``masked_m`` int32 ``[E]`` rows used per expert ->
  ``[E, max_m, N]``.

Output rows of no expert (padding, beyond ``masked_m``) are unspecified. ``backend`` is ``"triton"``,
``"reference"`` or ``"deepgemm"``; ``"auto"`` is Triton where it runs (a CUDA tensor, or
``TRITON_INTERPRET=1``), else the reference. Shapes, dtypes and devices are checked (typed errors);
the rows' expert ids are not read back (no host synchronisation).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.kernels.moe_config import MoeTritonConfig
from fp8select.problem import dtype_name

__all__ = ["GROUPED_BACKENDS", "grouped_gemm_contiguous", "grouped_gemm_masked"]

GROUPED_BACKENDS = ("auto", "triton", "reference", "deepgemm")
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CONFIG = MoeTritonConfig(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=3, QUANT_IN_KERNEL=0)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check(a: Any, a_scale: Any, w: Any, w_scale: Any, layout: Any, out_dtype: Any, backend: Any,
           a_dims: int) -> str:
    for name, t in (("a", a), ("a_scale", a_scale), ("w", w), ("w_scale", w_scale), ("layout", layout)):
        if not isinstance(t, torch.Tensor):
            raise InvalidDtypeError(f"{name}: expected a torch.Tensor, found {type(t).__name__}")
    if backend not in GROUPED_BACKENDS:
        raise InvalidInputError(f"backend: expected one of {', '.join(GROUPED_BACKENDS)}, found {backend!r}")
    if out_dtype not in _OUT_DTYPES:
        raise InvalidDtypeError(f"out_dtype: expected bfloat16/float16/float32, found {out_dtype!r}")
    for name, t in (("a", a), ("w", w)):
        if t.dtype != torch.float8_e4m3fn:
            raise InvalidDtypeError(f"{name}: expected dtype float8_e4m3fn, found {dtype_name(t.dtype)}")
    for name, t in (("a_scale", a_scale), ("w_scale", w_scale)):
        if t.dtype != torch.float32:
            raise InvalidDtypeError(f"{name}: expected dtype float32, found {dtype_name(t.dtype)}")
    if layout.dtype not in (torch.int32, torch.int64):
        raise InvalidDtypeError(f"layout: expected dtype int32/int64, found {dtype_name(layout.dtype)}")
    if w.dim() != 3:
        raise InvalidInputError(f"w: expected a 3-D [E, N, K] tensor, found shape {tuple(w.shape)}")
    e, n, k = w.shape
    if tuple(w_scale.shape) != (e, _ceil_div(n, 128), _ceil_div(k, 128)):
        raise InvalidInputError(f"w_scale: expected shape {[e, _ceil_div(n, 128), _ceil_div(k, 128)]}, "
                                f"found {list(w_scale.shape)}")
    if a.dim() != a_dims or a.shape[-1] != k:
        want = "[R, K]" if a_dims == 2 else "[E, max_m, K]"
        raise InvalidInputError(f"a: expected shape {want} with K={k} (w's), found {list(a.shape)}")
    if tuple(a_scale.shape) != (*a.shape[:-1], _ceil_div(k, 128)):
        raise InvalidInputError(f"a_scale: expected shape {[*a.shape[:-1], _ceil_div(k, 128)]}, found {list(a_scale.shape)}")
    for name, t in (("a", a), ("a_scale", a_scale), ("w_scale", w_scale), ("layout", layout)):
        if t.device != w.device:
            raise InvalidInputError(f"{name}: expected device {w.device} (w's), found {t.device}")
    if backend == "auto":
        triton_runs = w.device.type == "cuda" or (w.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
        return "triton" if triton_runs else "reference"
    return str(backend)


def _rows(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, expert_of_row: torch.Tensor,
          out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    if backend == "reference":
        from fp8select.kernels.moe_reference import grouped_gemm_reference

        return grouped_gemm_reference(a, a_scale, w, w_scale, expert_of_row, (128, 128), out_dtype)
    from fp8select.kernels.moe_triton import grouped_gemm_rows

    out = torch.empty((a.shape[0], w.shape[1]), dtype=out_dtype, device=a.device)
    return grouped_gemm_rows(a.contiguous(), a_scale, w, w_scale, expert_of_row, out, _CONFIG)


def _deep_gemm(name: str) -> Any:
    from fp8select.backends._vendor import require

    return require("deep_gemm", (name,)).fn


def grouped_gemm_contiguous(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                            expert_of_row: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                            backend: str = "auto") -> torch.Tensor:
    """``out[r] = dequant(a[r]) @ dequant(w[expert_of_row[r]]).T`` (module docstring); ``[R, N]``."""
    chosen = _check(a, a_scale, w, w_scale, expert_of_row, out_dtype, backend, 2)
    if expert_of_row.shape != (a.shape[0],):
        raise InvalidInputError(f"expert_of_row: expected shape [R={a.shape[0]}], found {list(expert_of_row.shape)}")
    if chosen != "deepgemm":
        return _rows(a, a_scale, w, w_scale, expert_of_row, out_dtype, chosen)
    if out_dtype != torch.bfloat16:
        raise InvalidDtypeError(f"out_dtype: DeepGEMM's grouped GEMMs write bfloat16, found {dtype_name(out_dtype)}")
    from fp8select.kernels.quant import ScaleLayout
    from fp8select.kernels.vendor_layouts import to_mn_major

    layout = ScaleLayout(mn_major=True, m_align=4)
    out = torch.empty((a.shape[0], w.shape[1]), dtype=out_dtype, device=a.device)
    _deep_gemm("m_grouped_fp8_gemm_nt_contiguous")(
        (a.contiguous(), to_mn_major(a_scale, layout.padded_rows(a.shape[0]))), (w, w_scale), out,
        expert_of_row.to(torch.int32).contiguous())
    return out


def grouped_gemm_masked(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                        masked_m: torch.Tensor, *, expected_m: int | None = None,
                        out_dtype: torch.dtype = torch.bfloat16, backend: str = "auto") -> torch.Tensor:
    """Expert ``e``'s first ``masked_m[e]`` rows of ``a[e]`` times ``dequant(w[e]).T``; ``[E, max_m, N]``.
    ``expected_m`` (DeepGEMM's tile hint) defaults to ``max_m``."""
    chosen = _check(a, a_scale, w, w_scale, masked_m, out_dtype, backend, 3)
    e, max_m, k = a.shape
    if e != w.shape[0] or masked_m.shape != (e,):
        raise InvalidInputError(f"a, masked_m: expected E={w.shape[0]} (w's) groups, found {e} and {list(masked_m.shape)}")
    if chosen == "deepgemm":
        if out_dtype != torch.bfloat16:
            raise InvalidDtypeError(f"out_dtype: DeepGEMM's grouped GEMMs write bfloat16, found {dtype_name(out_dtype)}")
        from fp8select.backends.moe_deepgemm import MASKED_BLOCK_M

        rows = -(-max(max_m, 1) // MASKED_BLOCK_M) * MASKED_BLOCK_M  # its kernel's rows per expert (see there)
        padded = torch.zeros((e, rows, k), dtype=torch.uint8, device=a.device).view(a.dtype)
        padded[:, :max_m].copy_(a)
        scale = torch.ones((e, a_scale.shape[2], rows), dtype=torch.float32, device=a.device).transpose(1, 2)
        scale[:, :max_m].copy_(a_scale)
        out = torch.empty((e, rows, w.shape[1]), dtype=out_dtype, device=a.device)
        _deep_gemm("m_grouped_fp8_gemm_nt_masked")((padded, scale), (w, w_scale), out,
                                                   masked_m.to(torch.int32).contiguous(), expected_m or max(max_m, 1))
        return out[:, :max_m]
    rank = torch.arange(max_m, device=a.device).expand(e, max_m)
    experts = torch.arange(e, device=a.device).unsqueeze(1).expand(e, max_m)
    expert_of_row = torch.where(rank < masked_m.to(torch.int64).unsqueeze(1), experts, -1).reshape(-1)
    out = _rows(a.reshape(e * max_m, k), a_scale.reshape(e * max_m, -1), w, w_scale, expert_of_row, out_dtype, chosen)
    return out.view(e, max_m, -1)
