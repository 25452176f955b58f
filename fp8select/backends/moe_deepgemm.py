"""``deepgemm`` for MoE: DeepGEMM's M-grouped FP8 GEMMs, contiguous and masked, on sm90.

API followed (FACTS.md "Grouped (MoE) block-FP8 GEMMs on the H200", DeepGEMM 2.6.1, both run there):
``m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, grouped_layout, ...)`` with ``a`` ``[R, K]``
fp8 whose rows are grouped by expert, each expert's rows padded to
``get_mk_alignment_for_contiguous_layout()`` (128), ``grouped_layout`` int32 ``[R]`` the expert of each
row (-1: a padding block, skipped), ``b`` ``[E, N, K]`` with fp32 ``[E, N/128, K/128]`` scales, ``d``
``[R, N]`` bf16; and ``m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected_m)`` with
``a`` ``[E, max_m, K]``, ``d`` ``[E, max_m, N]``, ``masked_m`` int32 ``[E]`` rows used per expert and
``expected_m`` a hint for the kernel's tiles; ``max_m`` a multiple of 128 (:data:`MASKED_BLOCK_M`).
Activation scales fp32, MN-major and TMA-aligned (per
expert for the masked form). Only ``a, b, d`` and the layout arguments are passed, positionally.

What runs around the two GEMMs (fp8select's kernels, no host synchronisation): the routing, one launch
that quantizes each slot's token straight into its row of the layout and its scale into DeepGEMM's
scale layout, ``silu(gate) * up`` of DeepGEMM's bf16 output with its 1x128 quantization (the rows holding
a slot only, its scales written in that layout too), and the weighted sum back to the tokens. ``contiguous``
suits prefill (every expert padded to 128 rows); ``masked`` decode and CUDA graphs (``[E, M]`` rows,
each token's experts distinct: top-k routing; a repeated id beyond M rows of one expert is dropped).
On a GPU a route's calls under one M, k and dtypes are replayed from the third on
(:class:`~fp8select.backends.moe.Replayed`): fp8select's launches from their recorded arguments, the two
GEMMs called again on views of one workspace.

sm100 needs UE8M0-packed scales for the grouped kernels too; not written yet, so the gate is sm90.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fp8select.backends._vendor import EntryPoint, require
from fp8select.backends.moe import (
    MoeBackend,
    MoeLaunch,
    MoeWeights,
    helpers,
    replayed,
)
from fp8select.capabilities import Capabilities
from fp8select.kernels.moe_routing import masked_counts, masked_rows, route, row_experts, row_of_slot
from fp8select.kernels.quant import ScaleLayout, empty_scale
from fp8select.probes import ComputeCapability, DeviceKind, Package, PackageSymbols, Probe, ToolkitVersion

__all__ = ["CONTIGUOUS", "MASKED", "DeepGemmMoe"]

MODULE = "deep_gemm"
CONTIGUOUS = ("m_grouped_fp8_gemm_nt_contiguous",)
MASKED = ("m_grouped_fp8_gemm_nt_masked",)
ALIGNMENT = ("get_mk_alignment_for_contiguous_layout", "get_m_alignment_for_contiguous_layout")
TMA = ScaleLayout(mn_major=True, m_align=4)
MASKED_BLOCK_M = 128
"""Rows per expert of the masked layout are a multiple of this: DeepGEMM's sm90 masked kernel tiles each
expert's rows by its block M (64 or 128) through 2-D TMA views of ``[E * max_m, K]`` and ``[E * max_m, N]``,
so a tile crossing an expert's end would read and write the next expert's rows (it does not check; on
the H200 4 rows per expert gave results 60% off)."""


@dataclass(frozen=True)
class DeepGemmExperts:
    """The checkpoint's tensors (contiguous) and the entry points, found at prepare."""

    weights: MoeWeights
    contiguous: EntryPoint
    masked: EntryPoint
    alignment: int


class DeepGemmMoe(MoeBackend):
    name = "deepgemm"
    summary = "DeepGEMM m_grouped_fp8_gemm_nt_contiguous / _masked (JIT CUDA kernels), sm90"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        ComputeCapability(allowed=((9, 0),)),
        ToolkitVersion("cuda", ">=12.3", "DeepGEMM sm90"),
        Package(MODULE),
        PackageSymbols(MODULE, CONTIGUOUS, "DeepGEMM's M-grouped contiguous GEMM"),
        PackageSymbols(MODULE, MASKED, "DeepGEMM's M-grouped masked GEMM"),
    )
    layouts = ("contiguous", "masked")
    activation_dtypes = (torch.bfloat16,)
    packages = (MODULE,)
    aligned_k_why = "the K of a grouped GEMM"

    def prepare(self, weights: MoeWeights, caps: Capabilities) -> Any:
        contiguous = require(MODULE, CONTIGUOUS)
        masked = require(MODULE, MASKED)
        alignment = int(require(MODULE, ALIGNMENT).fn())
        return DeepGemmExperts(weights.contiguous(), contiguous, masked, alignment)

    def bind(self, prepared: Any, layout: str, config: Any, caps: Capabilities) -> MoeLaunch:
        experts: DeepGemmExperts = prepared
        w = experts.weights
        e, two_i, hidden = w.w13.shape
        device, fp8 = w.w13.device, w.w13.dtype
        quantize_slots, silu_mul_quant, weighted_sum, vendor_call = helpers(device)
        contiguous13, contiguous2 = (_grouped(experts.contiguous.fn, b) for b in ((w.w13, w.w13_scale), (w.w2, w.w2_scale)))

        def contiguous(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, record: Any) -> torch.Tensor:
            k = topk_ids.shape[1]
            # on a GPU, the rows' experts too
            routing = route(topk_ids, e, experts.alignment, row_expert=True, record=record)
            slot_row = row_of_slot(routing)
            # Each slot's token quantized straight into its row; the padding rows are left unset (a GEMM's rows
            # are independent, and no padding row is read back).
            a = torch.empty((routing.rows, hidden), dtype=fp8, device=device)
            a_s = empty_scale(routing.rows, _groups(hidden), TMA, device)
            quantize_slots(x, slot_row, k, a, a_s, slot_ids=routing.slot_ids, record=record)
            layout_rows = row_experts(routing)
            d1 = torch.empty((routing.rows, two_i), dtype=torch.bfloat16, device=device)
            vendor_call(record, contiguous13, a, a_s, d1, layout_rows)
            q_s = empty_scale(routing.rows, _groups(two_i // 2), TMA, device)
            q, q_s = silu_mul_quant(d1, w.w2.dtype, slot_ids=routing.slot_ids, slots=routing.slots, scale=q_s,
                                    record=record)
            d2 = torch.empty((routing.rows, hidden), dtype=torch.bfloat16, device=device)
            vendor_call(record, contiguous2, q, q_s, d2, layout_rows)
            return weighted_sum(d2, slot_row, topk_ids, topk_weights, e, x.dtype, record=record)

        def masked(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, record: Any) -> torch.Tensor:
            m, k = topk_ids.shape
            max_m = -(-m // MASKED_BLOCK_M) * MASKED_BLOCK_M
            # on a GPU, the masked rows and counts in the same launch
            routing = route(topk_ids, e, 1, max_m=max_m, record=record)
            rows = masked_rows(routing, e, max_m)  # E * max_m: routed nowhere, or dropped
            # Rows past an expert's count are never read back (a GEMM's rows are independent): left unset,
            # not filled (E * max_m * H bytes a call: 235 MB at 256 local experts of DeepSeek-V3).
            a = torch.empty((e, max_m, hidden), dtype=fp8, device=device)
            a_s = _masked_scale(e, max_m, hidden, device)
            quantize_slots(x, rows, k, a.view(e * max_m, hidden), a_s, record=record)
            counts = masked_counts(routing, max_m)
            expected = max(1, -(-m * k // e))  # fixed by M and k: the key a replay is kept under
            d1 = torch.empty((e, max_m, two_i), dtype=torch.bfloat16, device=device)
            vendor_call(record, _grouped(experts.masked.fn, (w.w13, w.w13_scale), expected), a, a_s, d1, counts)
            q, q_s = silu_mul_quant(d1.view(e * max_m, two_i), w.w2.dtype, counts, max_m, m,  # the used rows only
                                    scale=_masked_scale(e, max_m, two_i // 2, device), record=record)
            d2 = torch.empty((e, max_m, hidden), dtype=torch.bfloat16, device=device)
            vendor_call(record, _grouped(experts.masked.fn, (w.w2, w.w2_scale), expected), q.view(e, max_m, -1), q_s,
                        d2, counts)
            return weighted_sum(d2.view(e * max_m, hidden), rows, topk_ids, topk_weights, e, x.dtype, record=record)

        return replayed(contiguous if layout == "contiguous" else masked, hidden, device)


def _grouped(fn: Any, b: tuple[torch.Tensor, torch.Tensor], *tail: int) -> Any:
    """DeepGEMM's grouped GEMM ``fn`` on the weights ``b`` (and its scales) as a vendor step: ``step(a, a_scale, d,
    layout)``, ``tail`` (the masked form's ``expected_m``) after them."""
    return lambda a, a_s, d, layout: fn((a, a_s), b, d, layout, *tail)


def _groups(k: int) -> int:
    return -(-k // 128)


def _masked_scale(experts: int, max_m: int, k: int, device: torch.device) -> torch.Tensor:
    """fp32 ``[E, max_m, ceil(K/128)]`` scales, MN-major per expert (strides ``(G * max_m, 1, max_m)``); ``max_m`` is
    a multiple of 4, so each expert's columns are TMA-aligned."""
    groups = _groups(k)
    return torch.empty_strided((experts, max_m, groups), (groups * max_m, 1, max_m), dtype=torch.float32, device=device)

