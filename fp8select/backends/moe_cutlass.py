"""``cutlass`` for MoE: sgl-kernel's CUTLASS pointer-array grouped GEMM (``fp8_blockwise_scaled_grouped_mm``), sm90.

API followed (docs/vendor-apis.md, "sgl-kernel CUTLASS grouped"; sglang-kernel 0.4.4, whose
``sm90/common_ops.abi3.so`` registers both schemas below and holds every host-check message the fake
reproduces; the checks themselves from sgl-project/sglang ``sgl-kernel/csrc/moe/fp8_blockwise_moe_kernel.cu``,
``cutlass_moe_helper.cu`` and ``prepare_moe_input.cu``; SGLang calls them in ``cutlass_fused_experts_fp8``):

* ``prepare_moe_input(topk_ids, expert_offsets, problem_sizes1, problem_sizes2, input_permutation,
  output_permutation, num_experts, n, k, blockscale_offsets=None)`` (the Python wrapper's order):
  ``topk_ids`` int32 ``[M, k]``; per expert the number of slots routed to it, ``problem_sizes1[e] =
  (count, 2n, k)`` and ``problem_sizes2[e] = (count, k, n)`` (``n`` = I, ``k`` = H), ``expert_offsets``
  ``[E + 1]`` their running sum, ``input_permutation[row]`` the token of each grouped row and
  ``output_permutation[slot]`` the grouped row of each slot. Ids outside ``[0, E)`` (-1) are counted
  nowhere and their entries are left unwritten: rows past the last expert's in ``input_permutation``
  and the slots' entries in ``output_permutation``. Rows within an expert come in no fixed order.
* ``fp8_blockwise_scaled_grouped_mm(output, a_ptrs, b_ptrs, out_ptrs, a_scales_ptrs, b_scales_ptrs, a,
  b, scales_a, scales_b, stride_a, stride_b, stride_c, layout_sfa, layout_sfb, problem_sizes,
  expert_offsets, workspace)``: ``output[off_e : off_e + m_e] = a[...] @ b[e]`` for each expert, ``a``
  fp8 ``[R, K]`` row-major with fp32 scales ``[R, K/128]`` row-major, ``b`` the checkpoint's
  ``[E, N, K]`` as its ``transpose(1, 2)`` view (column-major B), its scales ``[E, N/128, K/128]`` the
  same way, ``output`` bf16 ``[R, N]``; ``stride_*`` int64 ``[E]`` (K, K, N), ``expert_offsets`` the
  first E of prepare's ``E + 1``; the five pointer arrays (int64 ``[E]``) and the two scale-layout
  arrays (int32 ``[E, 5]``) are scratch the call fills on the device. Rows of ``output`` outside every
  expert are not written.

Why this form and not ``es_fp8_blockwise_scaled_grouped_mm`` (the "expert specialization" variant, the
same host checks on problem sizes and dtypes): the pointer-array form takes its scratch from the
caller, so it is allocated once per layer here, where ``es_`` allocates ten small tensors on every call
(``es_fp8_blockwise.cu``), and it is the form SGLang runs by default. SGLang's own benchmark turns ``es_``
on for the down projection on H200s; timing it is for the GPU session.

What runs around the two GEMMs (fp8select's): one launch quantizing each slot's token into the slot's row
(``quantize_slots`` over the output permutation), ``silu(gate) * up`` with its 1x128 quantization and the
weighted sum. -1 ids: prepare leaves their output permutation entries unwritten, so they are filled with the
row count before it; the quantizing launch skips those slots (the rows past the routed ones stay unset and
no expert's GEMM reads them), and the weighted sum skips the slots whose id is outside ``[0, E)`` without
reading their rows. On a GPU a route's calls under one M, k and dtypes are replayed from the third on
(:class:`~fp8select.backends.moe.Replayed`): fp8select's launches from their recorded arguments, the fill,
``prepare_moe_input`` and the two GEMMs called again on views of one workspace.

Gates: sm90 (the kernel has sm100 launchers too, with other scale layouts: not verified), CUDA >= 12.3
(CUTLASS's sm90 pointer-array kernels need modifiable TMA descriptors), sglang-kernel >= 0.4.4 (the
version checked; before sgl-project/sglang#8564, 2025-07, the pointer offsets were 32-bit and overflowed
with many large experts), H and I multiples of 128 (the kernel offsets scale pointers by ``k / 128`` and
``k * n / 128 / 128``), at most 1024 experts (its pointer set-up runs one thread block of E threads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fp8select.backends._vendor import EntryPoint, require
from fp8select.backends.moe import (
    MoeBackend,
    MoeLaunch,
    MoeProblem,
    MoeWeights,
    helpers,
    replayed,
)
from fp8select.capabilities import Capabilities
from fp8select.probes import ComputeCapability, DeviceKind, Package, PackageSymbols, Probe, ToolkitVersion
from fp8select.verdict import Verdict

__all__ = ["GROUPED_MM", "MAX_EXPERTS", "PREPARE", "CutlassMoe", "CutlassScratch"]

MODULE = "sgl_kernel"
GROUPED_MM = ("fp8_blockwise_scaled_grouped_mm",)
PREPARE = ("prepare_moe_input",)
MAX_EXPERTS = 1024
"""``get_group_gemm_starts`` is launched as one block of ``num_experts`` threads (``cutlass_moe_helper.cu``)."""
WORKSPACE_BYTES = 1 << 20
"""CUTLASS's workspace; the kernel does not check its size. SGLang allocates 90,000 bytes per layer, its tests
1 MiB; this takes the larger."""
LAYOUT_INTS = 5
"""int32 per expert of ``layout_sfa`` / ``layout_sfb`` (one CUTLASS scale layout each, as SGLang allocates)."""


@dataclass(frozen=True)
class CutlassScratch:
    """One layer's device tensors, made once at prepare: the weights' column-major views, the stride arrays,
    and the scratch the two calls fill (pointer arrays, scale layouts, problem sizes, offsets, workspace).
    The scratch is shared by every call of the layer, as SGLang shares it: calls on one stream."""

    weights: MoeWeights
    b13: tuple[torch.Tensor, torch.Tensor]
    b2: tuple[torch.Tensor, torch.Tensor]
    strides13: tuple[torch.Tensor, torch.Tensor]
    strides2: tuple[torch.Tensor, torch.Tensor]
    pointers: tuple[torch.Tensor, ...]
    layouts: tuple[torch.Tensor, torch.Tensor]
    problem_sizes: tuple[torch.Tensor, torch.Tensor]
    expert_offsets: torch.Tensor
    workspace: torch.Tensor
    grouped_mm: EntryPoint
    prepare_input: EntryPoint


class CutlassMoe(MoeBackend):
    name = "cutlass"
    summary = "sgl-kernel CUTLASS fp8_blockwise_scaled_grouped_mm (pointer-array grouped GEMM) + prepare_moe_input, sm90"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        ComputeCapability(allowed=((9, 0),)),
        ToolkitVersion("cuda", ">=12.3", "CUTLASS sm90 pointer-array grouped GEMM"),
        Package(MODULE, ">=0.4.4", why="the grouped GEMM's API and checks as verified"),
        PackageSymbols(MODULE, GROUPED_MM, "sgl-kernel's CUTLASS grouped GEMM"),
        PackageSymbols(MODULE, PREPARE, "sgl-kernel's MoE routing for it"),
    )
    layouts = ("offsets",)
    packages = (MODULE,)
    aligned_k_why = "the kernel offsets scale pointers by K/128 and N/128"

    def supports(self, problem: MoeProblem, caps: Capabilities, layout: str) -> Verdict:
        """The shared gate, H and I multiples of 128 and at most :data:`MAX_EXPERTS` experts."""
        verdict = super().supports(problem, caps, layout)
        if not verdict.ok:
            return verdict
        if problem.experts > MAX_EXPERTS:
            return Verdict.reject(f"requires E <= {MAX_EXPERTS} (one thread block of E threads sets the pointers "
                                  f"up), found E={problem.experts}")
        return verdict

    def prepare(self, weights: MoeWeights, caps: Capabilities) -> Any:
        """Entry points, the weights' ``transpose(1, 2)`` views (column-major B, no copy) and the scratch."""
        grouped_mm = require(MODULE, GROUPED_MM)
        prepare_input = require(MODULE, PREPARE)
        w = weights.contiguous()
        e, two_i, hidden = w.w13.shape
        device = w.w13.device

        def full(n: int) -> torch.Tensor:
            return torch.full((e,), n, dtype=torch.int64, device=device)

        def ints(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int32, device=device)

        return CutlassScratch(
            w, (w.w13.transpose(1, 2), w.w13_scale.transpose(1, 2)), (w.w2.transpose(1, 2), w.w2_scale.transpose(1, 2)),
            (full(hidden), full(two_i)), (full(two_i // 2), full(hidden)),
            tuple(torch.zeros(e, dtype=torch.int64, device=device) for _ in range(5)),
            (ints(e, LAYOUT_INTS), ints(e, LAYOUT_INTS)), (ints(e, 3), ints(e, 3)), ints(e + 1),
            torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device), grouped_mm, prepare_input)

    def bind(self, prepared: Any, layout: str, config: Any, caps: Capabilities) -> MoeLaunch:
        s: CutlassScratch = prepared
        w = s.weights
        e, two_i, hidden = w.w13.shape
        device = w.w13.device
        quantize_slots, silu_mul_quant, weighted_sum, vendor_call = helpers(device)
        groups = -(-hidden // 128)
        grouped_mm, prepare_input = s.grouped_mm.fn, s.prepare_input.fn
        offsets = s.expert_offsets[:e]
        ps1, ps2 = s.problem_sizes

        def gemm(b: tuple[torch.Tensor, torch.Tensor], strides: tuple[torch.Tensor, torch.Tensor],
                 sizes: torch.Tensor) -> Any:
            """The grouped GEMM on weights ``b`` as a vendor step: ``step(out, a, a_scale)``."""
            return lambda out, a, a_s: grouped_mm(out, *s.pointers, a, b[0], a_s, b[1], strides[0], strides[0],
                                                  strides[1], *s.layouts, sizes, offsets, s.workspace)

        gemm13, gemm2 = gemm(s.b13, s.strides13, ps1), gemm(s.b2, s.strides2, ps2)

        def prepare(topk_ids: torch.Tensor, rows: torch.Tensor) -> None:
            """Routing into ``rows`` (int32 ``[2, M * k]``: each grouped row's token, each slot's grouped row); a slot
            routed nowhere keeps row ``M * k``, which quantize_slots skips (one fill for both, a launch fewer)."""
            rows.fill_(rows.shape[1])
            prepare_input(topk_ids.to(torch.int32).contiguous(), s.expert_offsets, ps1, ps2, rows[0], rows[1], e,
                          two_i // 2, hidden)

        def launch(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, record: Any) -> torch.Tensor:
            m, k = topk_ids.shape
            rows = torch.empty((2, m * k), dtype=torch.int32, device=device)
            vendor_call(record, prepare, topk_ids, rows)
            row_of_slot = rows[1]
            a = torch.empty((m * k, hidden), dtype=w.w13.dtype, device=device)
            a_s = torch.empty((m * k, groups), dtype=torch.float32, device=device)
            quantize_slots(x, row_of_slot, k, a, a_s, record=record)  # each slot's token into its row: one launch
            d1 = torch.empty((m * k, two_i), dtype=torch.bfloat16, device=device)
            vendor_call(record, gemm13, d1, a, a_s)
            q, q_s = silu_mul_quant(d1, w.w2.dtype, record=record)
            d2 = torch.empty((m * k, hidden), dtype=torch.bfloat16, device=device)
            vendor_call(record, gemm2, d2, q, q_s)
            # row_of_slot is int32: the weighted sum reads the map as it is
            return weighted_sum(d2, row_of_slot, topk_ids, topk_weights, e, x.dtype, record=record)

        return replayed(launch, hidden, device)
