"""``npu`` for MoE: Ascend ``torch_npu.npu_grouped_matmul`` in its FP8 per-block ("G-B") mode on A5 (arch35).

API followed (docs/vendor-apis.md, "Ascend grouped MoE"): the G-B mode is documented for the Ascend 910_95
(A5) at the aclnn level only (cann ops-transformer ``aclnnGroupedMatmulV4.md``: x and weight
FLOAT8_E4M3FN, ``scaleOptional`` FLOAT32 ``(g, ceil(N/128), ceil(K/128))`` for a transposed weight,
``perTokenScaleOptional`` FLOAT32 ``(M, ceil(K/128))``, block sizes gsM = 1, gsN = gsK = 128, no bias, out
BF16/FP16/FP32, M grouping (``groupType`` 0) with x, weight and out single tensors, ``splitItem`` 2/3,
``groupListType`` 0/1, at most 1024 groups); the torch_npu binding is op-plugin's
``GroupedMatmulKernelNpuOpApi.cpp`` (its 26.0.0 branch sends e4m3fn inputs to ``aclnnGroupedMatmulV4``;
``group_type`` must be passed; the output is ``[M, weight.size(-1)]``):

* ``torch_npu.npu_grouped_matmul([a], [w.transpose(1, 2)], scale=[w_scale], per_token_scale=[a_scale],
  group_list=counts, split_item=3, group_type=0, group_list_type=1, act_type=0,
  output_dtype=torch.float32)[0]``: ``a`` fp8 ``[R, K]`` whose rows are grouped by expert, ``counts`` int64
  ``[E]`` rows per expert (their sum may be below R: rows past it are not written), the checkpoint's
  ``[E, N, K]`` weight as its transposed view (``[E, K, N]``, strides ``(N*K, 1, K)``) with its
  ``[E, N/128, K/128]`` scale as it is;
* activations: ``npu_dynamic_block_quant(x, dst_type=torch.float8_e4m3fn, row_block_size=1,
  col_block_size=128)`` (the dense ``npu`` backend's quantizer: ``amax / 448``).

What runs around the two grouped GEMMs (fp8select's, torch ops on the device): the routing (the ``M * k``
slots sorted by expert, ids outside ``[0, E)`` last and counted nowhere, so -1 contributes nothing), the
row gathers, ``silu(gate) * up`` of the fp32 gate-up output and its 1x128 quantization (the semantics
exactly: fp32 gate and up), and the weighted sum in fp32, which skips unrouted slots without reading
their (unwritten) rows. NaN/inf rows: set to NaN afterwards, the device quantizer's handling being
unverified (:func:`~fp8select.backends.moe.nan_where_nonfinite`). ``npu_moe_init_routing_v2`` /
``npu_moe_finalize_routing`` (fused routing) are not used: their product lists name A2/A3 only.

Gates, conservative where unverified: an A5 device (the dense backend's probe), ``torch_npu``, an opt-in
flag ``FP8SELECT_USE_NPU_MOE=1`` (the FP8 G-B grouped mode is in no torch_npu API page, and which torch_npu
release carries op-plugin's routing of it is not verified), both ops found when a layer is prepared
(registered at import: the snapshot cannot list them), H and I multiples of 128 (tails of the G-B mode
unverified), at most 1024 experts, bf16/fp16 activations (the quantizer's inputs). The fp32 output of
the grouped GEMM is the aclnn table's; passing it as ``output_dtype=torch.float32`` follows MindSpeed's
calls of torch_npu (a torch dtype; the 26.x schema types the argument ``int?``). Tested on CPU against a
strict fake only.
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
    gather_rows,
    helpers,
    nan_where_nonfinite,
)
from fp8select.backends.npu import AscendArch35
from fp8select.capabilities import Capabilities
from fp8select.kernels.moe_routing import route, row_of_slot, token_of_row
from fp8select.probes import DeviceKind, EnvFlag, Package, Probe
from fp8select.verdict import Verdict

__all__ = ["MAX_GROUPS", "NPU_MOE_FLAG", "NpuExperts", "NpuMoe"]

NPU_MOE_FLAG = "FP8SELECT_USE_NPU_MOE"
MODULE = "torch_npu"
QUANT = ("npu_dynamic_block_quant",)
GROUPED_MM = ("npu_grouped_matmul",)
MAX_GROUPS = 1024
"""``group_list``'s first dimension is at most 1024 (aclnnGroupedMatmulV4, M grouping, single tensors)."""
WHY = "FP8 per-block grouped MoE, Ascend 950"


@dataclass(frozen=True)
class NpuExperts:
    """The checkpoint's tensors as the grouped GEMM takes them (transposed views, no copy) and the entry points."""

    weights: MoeWeights
    b13: tuple[torch.Tensor, torch.Tensor]
    b2: tuple[torch.Tensor, torch.Tensor]
    quant: EntryPoint
    grouped_mm: EntryPoint


class NpuMoe(MoeBackend):
    name = "npu"
    summary = (f"torch_npu npu_grouped_matmul (FP8 per-block G-B mode) + npu_dynamic_block_quant on Ascend A5; "
               f"opt-in with {NPU_MOE_FLAG}=1")
    requires: ClassVar[tuple[Probe, ...]] = (DeviceKind(("npu",)), Package(MODULE), AscendArch35(), EnvFlag(NPU_MOE_FLAG))
    layouts = ("grouped",)
    packages = (MODULE,)
    aligned_k_why = "tails of the grouped G-B mode unverified"

    def supports(self, problem: MoeProblem, caps: Capabilities, layout: str) -> Verdict:
        """The shared gate and at most :data:`MAX_GROUPS` experts."""
        verdict = super().supports(problem, caps, layout)
        if verdict.ok and problem.experts > MAX_GROUPS:
            return Verdict.reject(f"requires E <= {MAX_GROUPS} (group_list of the grouped GEMM), found E={problem.experts}")
        return verdict

    def prepare(self, weights: MoeWeights, caps: Capabilities) -> Any:
        """Both ops, and each weight as its ``transpose(1, 2)`` view with its scale as it is."""
        quant = require(MODULE, QUANT, WHY)
        grouped_mm = require(MODULE, GROUPED_MM, WHY)
        w = weights.contiguous()
        return NpuExperts(w, (w.w13.transpose(1, 2), w.w13_scale), (w.w2.transpose(1, 2), w.w2_scale), quant, grouped_mm)

    def bind(self, prepared: Any, layout: str, config: Any, caps: Capabilities) -> MoeLaunch:
        p: NpuExperts = prepared
        experts = p.weights.w13.shape[0]
        fp8 = p.weights.w13.dtype
        quant, grouped_mm = p.quant.fn, p.grouped_mm.fn
        _, silu_mul_quant, weighted_sum, _ = helpers(p.weights.w13.device)

        def gemm(a: torch.Tensor, a_scale: torch.Tensor, b: tuple[torch.Tensor, torch.Tensor],
                 counts: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = grouped_mm([a], [b[0]], scale=[b[1]], per_token_scale=[a_scale], group_list=counts,
                                           split_item=3, group_type=0, group_list_type=1, act_type=0,
                                           output_dtype=torch.float32)[0]
            return out

        def launch(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
            m, k = topk_ids.shape
            routing = route(topk_ids, experts, 1)  # one row per slot: the routed ones by expert, the others last
            token = token_of_row(routing, k, m)  # unrouted rows: past every group
            counts = routing.counts.to(torch.int64)
            x_q, x_s = quant(x, dst_type=fp8, row_block_size=1, col_block_size=128)
            h = gemm(gather_rows(x_q, token), x_s.index_select(0, token).contiguous(), p.b13, counts)
            q, q_s = silu_mul_quant(h, fp8)
            o = gemm(q, q_s, p.b2, counts)
            y = weighted_sum(o, row_of_slot(routing), topk_ids, topk_weights, experts, x.dtype)
            return nan_where_nonfinite(y, x, topk_ids, experts)

        return launch
