"""``aiter`` for MoE: AITER's fused MoE with DeepSeek block scales on MI300 (gfx942) / MI350 (gfx950).

API followed (docs/vendor-apis.md, "AITER fused MoE"; ROCm/aiter ``aiter/fused_moe.py`` at the v0.1.5 tag and
on main, ``csrc/include/aiter_enum.h``, ``aiter/ops/shuffle.py``, ``op_tests/test_moe_2stage.py``; SGLang's
``Fp8MoEMethod`` and DeepEP path call it this way for DeepSeek-V3 block FP8 on ROCm):

* ``aiter.fused_moe.fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None,
  activation=ActivationType.Silu, quant_type=QuantType.per_128x128, doweight_stage1=False, w1_scale,
  w2_scale, a1_scale=None, a2_scale=None, ..., dtype=None)`` computes the whole experts op: it quantizes
  ``hidden_states`` (bf16 ``[M, H]``) per 1x128 group itself (``per_128x128`` is remapped to ``per_1x128``,
  ``quant_remap``), runs the gate-up GEMM, ``silu(gate) * up`` into a buffer of the output dtype,
  requantizes it, runs the down GEMM and sums each token's experts with ``topk_weight``; it returns a new
  ``[M, H]`` tensor of ``dtype`` (bf16/fp16; default ``hidden_states``' dtype).
* ``w1`` ``[E, 2I, H]`` (gate rows, then up rows: ``isG1U1``) and ``w2`` ``[E, H, I]`` in ``aiter.dtypes.fp8``
  (e4m3fnuz on gfx942, e4m3fn on gfx950), pre-shuffled with ``aiter.ops.shuffle.shuffle_weight(w, (16, 16))``
  (which marks them ``is_shuffled``, read by AITER's kernel selection); ``w1_scale`` / ``w2_scale`` the
  checkpoint's fp32 ``[E, 2I/128, H/128]`` / ``[E, H/128, I/128]`` as they are (AITER's own test passes its
  fp32 block scales unshuffled: ``shuffle_scale`` returns fp32 scales unchanged).
* ``topk_weight`` fp32 and ``topk_ids`` int32 ``[M, k]`` (vLLM converts both before every call: "All AITER
  Fused MoE kernels are expecting the following datatypes").
* ``expert_mask``: int32 over the global experts; AITER sorts only the slots whose expert is marked 1 and
  maps global to local ids by the mask's running sum.

-1 ids (handled around the call): AITER does not accept -1 (SGLang's DeepEP path says so). As SGLang does,
every id outside ``[0, E)`` becomes ``E`` and ``expert_mask`` is int32 ``[E + 1]``, ones then a 0 (made once
at :meth:`AiterMoe.prepare`): those slots are sorted nowhere and contribute nothing. The mask is passed on
every call (no host read to see whether a call needs it); its effect on AITER's kernel choice (``is_ep``)
is not measured. NaN/inf rows: AITER's quantizer's behaviour is not verified, so the output row of a token
whose activation is not finite is set to NaN afterwards (:func:`~fp8select.backends.moe.nan_where_nonfinite`).

Numerics: AITER writes ``silu(gate) * up`` to a buffer of the output dtype (bf16) before requantizing it
(``fused_moe_2stages``' ``a2``), one bf16 rounding the semantics do not have; its activation quantizer
uses e4m3fnuz's maximum (240) on gfx942.

Load-time work (:meth:`AiterMoe.prepare`): on gfx942 the e4m3fn checkpoint becomes e4m3fnuz (same bits but
0x80, scales doubled: what SGLang's ``normalize_e4m3fn_to_e4m3fnuz`` does, the dense ``aiter`` backend's
conversion), then both weights are shuffled by AITER's own ``shuffle_weight`` (a copy each; the checkpoint
is not kept).

Gates: opt-in with ``FP8SELECT_USE_AITER=1`` (the dense backend's flag), ROCm gfx942/gfx950 (the arches of
AITER's block-scale MoE kernel tables), ``amd-aiter`` >= 0.1.5 (the versions read: 0.1.5 through main; 0.1.3
ran ``per_128x128`` on another path), ``aiter`` exposing ``fused_moe``; bf16 activations (AITER's block-scale
kernel tables list bf16 only); H and I multiples of 128 (AITER's own reference views the weights by 128;
SGLang requires I % 128); tested on CPU against a strict fake only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fp8select.backends._vendor import EntryPoint, require
from fp8select.backends.moe import MoeBackend, MoeLaunch, MoeWeights, nan_where_nonfinite
from fp8select.capabilities import Capabilities
from fp8select.kernels.vendor_layouts import e4m3fn_to_e4m3fnuz
from fp8select.probes import DeviceKind, EnvFlag, GfxArch, Package, PackageSymbols, Probe

__all__ = ["AITER_FLAG", "FUSED_MOE", "AiterExperts", "AiterMoe"]

AITER_FLAG = "FP8SELECT_USE_AITER"
MODULE = "aiter"
FUSED_MOE = ("fused_moe",)
SHUFFLE_LAYOUT = (16, 16)
MIN_VERSION = ">=0.1.5"


@dataclass(frozen=True)
class AiterExperts:
    """One layer in AITER's layout, made once at prepare: the shuffled weights (e4m3fnuz on gfx942) with
    their scales, the ``[E + 1]`` expert mask and the entry point with its two enum members."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    expert_mask: torch.Tensor
    fused_moe: EntryPoint
    quant_type: Any
    activation: Any


class AiterMoe(MoeBackend):
    name = "aiter"
    summary = (f"AITER fused_moe (QuantType.per_128x128, (16, 16)-shuffled weights) on gfx942 (e4m3fnuz) / gfx950; "
               f"opt-in with {AITER_FLAG}=1")
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("rocm",)),
        GfxArch(("gfx942", "gfx950")),
        Package(MODULE, MIN_VERSION, why="fused_moe with QuantType.per_128x128 as read"),
        EnvFlag(AITER_FLAG),
        PackageSymbols(MODULE, FUSED_MOE, "AITER's fused MoE"),
    )
    layouts = ("fused",)
    activation_dtypes = (torch.bfloat16,)
    packages = (MODULE,)
    aligned_k_why = "AITER's block-scale MoE reads its weights in 128x128 blocks"

    def prepare(self, weights: MoeWeights, caps: Capabilities) -> Any:
        """Entry points; e4m3fnuz on gfx942; AITER's (16, 16) shuffle of both weights; the expert mask."""
        fused = require(f"{MODULE}.fused_moe", FUSED_MOE, "AITER's fused MoE")
        shuffle = require(f"{MODULE}.ops.shuffle", ("shuffle_weight",), "AITER's weight pre-shuffle")
        quant_type: Any = require(MODULE, ("QuantType",), "AITER's enums").fn
        activation: Any = require(MODULE, ("ActivationType",), "AITER's enums").fn
        w = weights.contiguous()
        w13, s13, w2, s2 = w.w13, w.w13_scale, w.w2, w.w2_scale
        if caps.gfx_arch == "gfx942":
            w13, s13 = e4m3fn_to_e4m3fnuz(w13, s13)
            w2, s2 = e4m3fn_to_e4m3fnuz(w2, s2)
        experts = w13.shape[0]
        mask = torch.ones(experts + 1, dtype=torch.int32, device=w13.device)
        mask[experts] = 0  # the sentinel expert every id outside [0, E) is mapped to
        return AiterExperts(shuffle.fn(w13, layout=SHUFFLE_LAYOUT), s13.contiguous(),
                            shuffle.fn(w2, layout=SHUFFLE_LAYOUT), s2.contiguous(), mask, fused,
                            quant_type.per_128x128, activation.Silu)

    def bind(self, prepared: Any, layout: str, config: Any, caps: Capabilities) -> MoeLaunch:
        p: AiterExperts = prepared
        experts = p.w13.shape[0]
        fused_moe = p.fused_moe.fn

        def launch(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
            ids = topk_ids.to(torch.int32)
            ids = torch.where((ids >= 0) & (ids < experts), ids, experts)  # -1 (and unchecked strays): masked out
            y = fused_moe(x, p.w13, p.w2, topk_weights.to(torch.float32), ids, expert_mask=p.expert_mask,
                          activation=p.activation, quant_type=p.quant_type, doweight_stage1=False,
                          w1_scale=p.w13_scale, w2_scale=p.w2_scale, dtype=x.dtype)
            return nan_where_nonfinite(y, x, topk_ids, experts)

        return launch
