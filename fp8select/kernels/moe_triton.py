"""fp8select's Triton MoE experts op and grouped GEMM: launches of :mod:`.moe_triton_kernels`.

One experts call is: route (:func:`.moe_routing.route`, torch, no host synchronisation), quantize
the activation (unless the gate-up kernel does it in its K loop), the gate-up GEMM with its fused
``silu(gate) * up`` and 1x128 quantization, the down GEMM writing each slot's row, and the
weighted sum over each token's ``k`` rows. With a split configuration (``GATE_UP_N`` below 128,
:mod:`.moe_config`) the gate-up GEMM writes ``silu(gate) * up`` in fp32 and the down GEMM quantizes
it per 1x128 group as it loads it: as many launches, a ``[rows, I]`` fp32 buffer in place of the fp8
one and its scales. Sizes depend on M only, so a call captures into a CUDA graph. Inputs are
checked by the caller (:mod:`fp8select.moe`); these functions check nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton

from .moe_config import MoeTritonConfig
from .moe_routing import Routing, route
from .quant import DEFAULT_EPS, ROW_MAJOR
from .triton_quant import TritonQuantizer, fp8_constexprs, hw_rne

__all__ = ["TritonExperts", "grouped_gemm_rows", "silu_mul_quant", "weighted_sum"]

_SUM_BLOCK_H = 1024


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class TritonExperts:
    """The experts op on one layer's weights (``w13`` ``[E, 2I, H]``, ``w2`` ``[E, H, I]`` fp8 with
    contiguous fp32 block scales), bound once: ``experts(x, topk_weights, topk_ids, config)``."""

    def __init__(self, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
        from . import moe_triton_kernels as kernels

        self._kernels = kernels
        self.w13, self.w13_scale = w13.contiguous(), w13_scale.contiguous()
        self.w2, self.w2_scale = w2.contiguous(), w2_scale.contiguous()
        self.experts, two_i, self.hidden = w13.shape
        self.inter = two_i // 2
        self.device = w13.device
        self._constexprs = {**fp8_constexprs(w13.dtype), "HW_RNE": hw_rne(kernels._gate_up_kernel, self.device, w13.dtype)}
        self._quantizer: TritonQuantizer | None = None  # the activation's, [M, H]
        self._inter_quantizer: TritonQuantizer | None = None  # a split gate-up's fp32 product's, [rows, I]

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 config: MoeTritonConfig) -> torch.Tensor:
        k = topk_ids.shape[1]
        routing = route(topk_ids, self.experts, config.BLOCK_M)
        q, q_scale = self.gate_up(x, routing, k, config)
        if q_scale is None and not config.QUANT_IN_KERNEL:  # split: the quantization kernel between the GEMMs
            if self._inter_quantizer is None:
                self._inter_quantizer = TritonQuantizer(self.inter, dtype=self.w2.dtype, layout=ROW_MAJOR,
                                                        device=self.device)
            q, q_scale = self._inter_quantizer(q)
        out = torch.empty((routing.slots, self.hidden), dtype=x.dtype, device=self.device)
        _down(self._kernels, q, q if q_scale is None else q_scale, self.w2, self.w2_scale, routing, out,
              a_by_slot=False, config=config, a_quant=self._constexprs if q_scale is None else None)
        return weighted_sum(out, None, topk_ids, topk_weights, self.experts, x.dtype)

    def gate_up(self, x: torch.Tensor, routing: Routing, top_k: int,
                config: MoeTritonConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``silu(gate) * up`` ``[rows, I]`` at the sorted rows: in fp8 with its row-major scales, or
        with a split configuration in fp32 with None (quantized next: :mod:`.moe_config`). The sorted
        layout's padding rows are left unset; nothing reads them."""
        inter, groups = self.inter, _ceil_div(self.inter, 128)
        if config.split:
            q = torch.empty((routing.rows, inter), dtype=torch.float32, device=self.device)
            q_scale = None
        else:
            q = torch.empty((routing.rows, inter), dtype=self.w2.dtype, device=self.device)
            q_scale = torch.empty((routing.rows, groups), dtype=torch.float32, device=self.device)
        blocks = routing.rows // config.BLOCK_M
        if blocks == 0:
            return q, q_scale
        out_scale = q if q_scale is None else q_scale  # (split: not read)
        if config.QUANT_IN_KERNEL:
            a, a_scale = x, out_scale  # (the scale pointer is not read)
        else:
            if self._quantizer is None:
                self._quantizer = TritonQuantizer(self.hidden, dtype=self.w13.dtype, layout=ROW_MAJOR, device=self.device)
            a, a_scale = self._quantizer(x)
        self._kernels._gate_up_kernel[(blocks * _ceil_div(inter, config.GATE_UP_N),)](
            a, a_scale, self.w13, self.w13_scale, routing.slot_ids, routing.block_expert, q, out_scale,
            routing.slots, blocks, self.hidden, inter,
            a.stride(0), a_scale.stride(0), self.w13.stride(0), self.w13.stride(1), self.w13_scale.stride(0),
            self.w13_scale.stride(1), q.stride(0), out_scale.stride(0), DEFAULT_EPS,
            TOP_K=top_k, QUANT_IN_KERNEL=bool(config.QUANT_IN_KERNEL), BLOCK_M=config.BLOCK_M, GROUP_M=config.GROUP_M,
            GATE_UP_N=config.GATE_UP_N, num_warps=config.num_warps, num_stages=config.num_stages, **self._constexprs)
        return q, q_scale


def _down(kernels: object, a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
          routing: Routing, out: torch.Tensor, *, a_by_slot: bool, config: MoeTritonConfig,
          a_quant: Mapping[str, Any] | None = None) -> None:
    """The down kernel on ``a``: fp8 with scales ``a_scale``, or (``a_quant``: the fp8 constexprs of
    ``w``'s type) fp32 quantized per 1x128 group in the kernel, ``a_scale`` not read."""
    blocks = routing.rows // config.BLOCK_M
    n, kdim = w.shape[1], w.shape[2]
    if blocks == 0:
        return
    kernels._grouped_down_kernel[(blocks * _ceil_div(n, config.BLOCK_N),)](  # type: ignore[attr-defined]
        a, a_scale, w, w_scale, routing.slot_ids, routing.block_expert, out,
        routing.slots, blocks, n, kdim,
        a.stride(0), a_scale.stride(0), a_scale.stride(1), w.stride(0), w.stride(1), w_scale.stride(0),
        w_scale.stride(1), out.stride(0), DEFAULT_EPS,
        A_BY_SLOT=a_by_slot, BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, GROUP_M=config.GROUP_M,
        num_warps=config.num_warps, num_stages=config.num_stages, **({} if a_quant is None else {"A_QUANT": True, **a_quant}))


def grouped_gemm_rows(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                      expert_of_row: torch.Tensor, out: torch.Tensor, config: MoeTritonConfig) -> torch.Tensor:
    """``out[r] = dequant(a[r]) @ dequant(w[expert_of_row[r]]).T`` for the rows whose expert is in
    ``[0, E)``; other rows of ``out`` are left as they are. ``a`` ``[R, K]`` fp8 (K-contiguous) with
    fp32 scales ``[R, ceil(K/128)]`` (any strides), ``w`` ``[E, N, K]`` with contiguous block scales."""
    from . import moe_triton_kernels as kernels

    routing = route(expert_of_row.reshape(-1, 1), w.shape[0], config.BLOCK_M)
    _down(kernels, a, a_scale, w.contiguous(), w_scale.contiguous(), routing, out, a_by_slot=True, config=config)
    return out


def weighted_sum(out: torch.Tensor, row_map: torch.Tensor | None, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 experts: int, dtype: torch.dtype) -> torch.Tensor:
    """``y[t] = sum_j topk_weights[t, j] * out[row(t * k + j)]`` over ids in ``[0, experts)``, in fp32,
    as ``dtype``; ``row`` is the slot itself, or ``row_map[slot]`` when given."""
    from . import moe_triton_kernels as kernels

    m, k = topk_ids.shape
    hidden = out.shape[1]
    y = torch.empty((m, hidden), dtype=dtype, device=out.device)
    if m == 0:
        return y
    block_h = min(_SUM_BLOCK_H, triton.next_power_of_2(hidden))
    kernels._weighted_sum_kernel[(m, _ceil_div(hidden, block_h))](
        out, out if row_map is None else row_map, topk_ids.contiguous(), topk_weights.contiguous(), y, hidden, experts,
        out.stride(0), y.stride(0), TOP_K=k, HAS_MAP=row_map is not None, BLOCK_H=block_h, num_warps=4)
    return y


SILU_BLOCK_R = 16
"""Rows per program of the silu*up quantization."""


def silu_mul_quant(h: torch.Tensor, dtype: torch.dtype, counts: torch.Tensor | None = None,
                   group_rows: int = 0, most: int | None = None, *, slot_ids: torch.Tensor | None = None,
                   slots: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(h[:, :I]) * h[:, I:]`` of a ``[R, 2I]`` GEMM output, quantized per 1x128 group:
    ``(q [R, I] in dtype, row-major fp32 scales [R, ceil(I/128)])``. With ``counts`` (int32 ``[G]``) the
    rows are G groups of ``group_rows`` (a multiple of :data:`SILU_BLOCK_R`: a masked layout) and only
    each group's first ``counts[g]`` rows (rounded up to the program's rows) are computed; the others
    are left unset. ``most``: a bound on every count the caller knows (a masked layout's tokens: no
    expert holds more), so that programs are launched for that many rows of each group only (the
    sizes stay a function of the call's shapes: a CUDA graph captures them). With ``slot_ids`` (a
    sorted layout's, :class:`.moe_routing.Routing`) the rows whose entry is ``slots`` or more are
    padding: skipped, left unset."""
    from . import moe_triton_kernels as kernels

    rows, inter = h.shape[0], h.shape[1] // 2
    groups = _ceil_div(inter, 128)
    q = torch.empty((rows, inter), dtype=dtype, device=h.device)
    scale = torch.empty((rows, groups), dtype=torch.float32, device=h.device)
    if rows == 0:
        return q, scale
    if counts is not None and (group_rows <= 0 or group_rows % SILU_BLOCK_R or rows % group_rows):
        raise ValueError(f"group_rows must be a positive multiple of {SILU_BLOCK_R} dividing {rows}, got {group_rows}")
    if counts is None:
        group_blocks, programs = 1, _ceil_div(rows, SILU_BLOCK_R)
    else:
        group_blocks = _ceil_div(group_rows if most is None else max(min(most, group_rows), 1), SILU_BLOCK_R)
        programs = rows // group_rows * group_blocks
    kernels._silu_mul_quant_kernel[(programs, groups)](
        h, q, scale, scale if counts is None else counts, scale if slot_ids is None else slot_ids, rows, inter,
        h.stride(0), q.stride(0), scale.stride(0), max(group_rows, 1), group_blocks, slots, DEFAULT_EPS,
        BLOCK_R=SILU_BLOCK_R, HAS_COUNTS=counts is not None, HAS_SLOTS=slot_ids is not None,
        HW_RNE=hw_rne(kernels._silu_mul_quant_kernel, h.device, dtype), **fp8_constexprs(dtype), num_warps=4)
    return q, scale
