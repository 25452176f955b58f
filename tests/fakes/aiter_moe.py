"""The fused MoE of the fake ``aiter`` (part of tests/fakes/aiter.py): ``aiter.fused_moe.fused_moe`` with DeepSeek
block scales, and the ``QuantType`` / ``ActivationType`` enums it takes.

API followed (docs/vendor-apis.md, "AITER fused MoE"): ROCm/aiter ``aiter/fused_moe.py`` at the v0.1.5 tag (the
signature below, the oldest the ``aiter`` MoE backend accepts; main keeps these parameters in this order and
adds more after ``dtype``) and on main ``e4048607``; ``csrc/include/aiter_enum.h`` (the enum values);
``op_tests/test_moe_2stage.py`` (a per_128x128 call: weights shuffled with ``shuffle_weight(w, (16, 16))``, fp32
block scales ``[E, N/128, K/128]`` passed as they are); SGLang's callers (-1 ids mapped to a masked-out expert,
``expert_mask`` int32 ``[E + 1]``); vLLM's ``rocm_aiter_fused_experts`` (fp32 ``topk_weights``, int32 ``topk_ids``).

Reproduced as AITER raises them (``assert`` -> ``AssertionError``; an int for an enum -> ``AttributeError`` on
``.value``): the weight-shape assert, the output-dtype assert. Raised as ``RuntimeError`` where the check lives in
AITER's kernels or is not public (marked stricter than the vendor where AITER would instead compute something
else): ``hidden_states`` a contiguous bf16/fp16 ``[M, H]``; both weights ``aiter.dtypes.fp8`` of the emulated
arch, contiguous, ``[E, 2I, H]`` / ``[E, H, I]`` and carrying ``is_shuffled`` (stricter: AITER reads the flag to
pick kernels, and an unshuffled weight cannot be told from its values; the fake computes with the shuffled
reading, so a weight shuffled by anything else gives wrong numbers, as it would on hardware); the scales fp32
contiguous checkpoint shapes; ``topk_weight`` fp32 and ``topk_ids`` int32 ``[M, k]``, contiguous; an id
outside ``[0, E)`` without a mask, or outside the mask, raises (AITER does not accept -1, SGLang says); a mask
whose ones are not exactly E (stricter); H and I multiples of 128; ``a1_scale`` / ``a2_scale`` None (static
activation scales not emulated); only ``per_128x128`` / ``per_1x128`` with ``Silu`` and ``doweight_stage1=False``
on gfx942/gfx950 (fake limitation).

Numerics: the activation quantized per 1x128 with ``amax / max(aiter.dtypes.fp8)`` (240 for e4m3fnuz), both
GEMMs exact in float64 on the unshuffled weights, ``silu(gate) * up`` rounded to the output dtype (the 2-stage
path's ``a2`` buffer) and requantized, the weighted sum in float64, one cast to ``dtype``. A token whose slots are
all masked out gets zeros (AITER's sorting zero-fills ``moe_buf``, which stage 2 accumulates into).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

QuantType = enum.IntEnum("QuantType", [("No", 0), ("per_Tensor", 1), ("per_Token", 2), ("per_1x32", 3), ("per_1x128", 4),
                                       ("per_128x128", 5), ("per_256x128", 6), ("per_1024x128", 7)])
ActivationType = enum.IntEnum("ActivationType", [("No", -1), ("Silu", 0), ("Gelu", 1), ("Swiglu", 2)])
_QUANT_REMAP = {QuantType.per_128x128: QuantType.per_1x128}
_ARCHES = ("gfx942", "gfx950")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _quantize_rows(v: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 1x128 group: float64 scale ``amax / max(fp8)`` and the fp8 values (a zero group: scale 1)."""
    rows, cols = v.shape
    groups = v.reshape(rows, cols // 128, 128)
    scale = groups.abs().amax(-1) / torch.finfo(fp8).max
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (groups / scale.unsqueeze(-1)).to(fp8).reshape(rows, cols)
    return q, scale


def _dequant_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.to(torch.float64) * scale.repeat_interleave(128, dim=1)


def _dequant_blocks(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return w.to(torch.float64) * s.to(torch.float64).repeat_interleave(128, 0).repeat_interleave(128, 1)


class FakeAiterMoe:
    """``aiter.fused_moe.fused_moe`` of one installed fake ``aiter`` (its ``gfx`` knob decides ``dtypes.fp8``)."""

    def __init__(self, owner: Any, unshuffle: Any) -> None:
        self.owner = owner
        self._unshuffle = unshuffle

    def fused_moe(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weight: torch.Tensor,
        topk_ids: torch.Tensor,
        expert_mask: torch.Tensor | None = None,
        activation: Any = ActivationType.Silu,
        quant_type: Any = QuantType.No,
        doweight_stage1: bool = False,
        w1_scale: torch.Tensor | None = None,
        w2_scale: torch.Tensor | None = None,
        a1_scale: torch.Tensor | None = None,
        a2_scale: torch.Tensor | None = None,
        block_size_M: int | None = None,
        num_local_tokens: torch.Tensor | None = None,
        moe_sorting_dispatch_policy: int = 0,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The whole experts op (module docstring); a new ``[M, H]`` tensor of ``dtype``."""
        activation, quant_type = ActivationType(activation.value), QuantType(quant_type.value)  # the wrapper's .value
        experts, model_dim, inter_dim = w2.shape
        assert w1.shape[1] in [inter_dim, inter_dim * 2], f"Invalid MoE weight: {w1.shape=} {w2.shape=}"
        dtype = hidden_states.dtype if dtype is None else dtype
        assert dtype in [torch.float16, torch.bfloat16], f"Fused_moe unsupported out dtype: {dtype}"
        quant_type = _QUANT_REMAP.get(quant_type, quant_type)
        gfx, fp8 = self.owner.gfx, self.owner.get_dtype_fp8()
        if (gfx not in _ARCHES or quant_type != QuantType.per_1x128 or activation != ActivationType.Silu
                or doweight_stage1 or w1.shape[1] != 2 * inter_dim):
            raise NotImplementedError("the fake emulates per_128x128/per_1x128, Silu, gate+up w1, doweight_stage1=False "
                                      f"on gfx942/gfx950 only (got {quant_type.name}, {activation.name}, {gfx})")
        m = self._check_inputs(hidden_states, w1, w2, w1_scale, w2_scale, a1_scale, a2_scale, fp8)
        local = self._local_ids(topk_ids, topk_weight, expert_mask, experts, m)
        x_q, x_s = _quantize_rows(hidden_states.to(torch.float64), fp8)
        x_deq = _dequant_rows(x_q, x_s)
        w13, w2u = self._unshuffle(w1), self._unshuffle(w2)
        assert w1_scale is not None and w2_scale is not None
        y = torch.zeros((m, model_dim), dtype=torch.float64)
        for e in torch.unique(local[local >= 0]).tolist():
            token, slot = torch.nonzero(local == e, as_tuple=True)
            h = x_deq[token] @ _dequant_blocks(w13[e], w1_scale[e]).T
            a = (torch.nn.functional.silu(h[:, :inter_dim]) * h[:, inter_dim:]).to(dtype).to(torch.float64)
            a_q, a_s = _quantize_rows(a, fp8)
            o = _dequant_rows(a_q, a_s) @ _dequant_blocks(w2u[e], w2_scale[e]).T
            y.index_add_(0, token, o * topk_weight[token, slot].to(torch.float64).unsqueeze(1))
        return y.to(dtype)

    @staticmethod
    def _check_inputs(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w1_scale: torch.Tensor | None,
                      w2_scale: torch.Tensor | None, a1_scale: torch.Tensor | None, a2_scale: torch.Tensor | None,
                      fp8: torch.dtype) -> int:
        experts, model_dim, inter_dim = w2.shape
        _check(x.dim() == 2 and x.shape[1] == model_dim and x.is_contiguous(),
               f"hidden_states must be a contiguous [M, {model_dim}] tensor, got {tuple(x.shape)} strides {tuple(x.stride())}")
        _check(x.dtype in (torch.bfloat16, torch.float16), f"hidden_states must be bf16/fp16 (quantized inside), got {x.dtype}")
        for name, w, shape in (("w1", w1, (experts, 2 * inter_dim, model_dim)), ("w2", w2, (experts, model_dim, inter_dim))):
            _check(w.dtype == fp8, f"{name} must be {fp8} (aiter.dtypes.fp8), got {w.dtype}"
                   + ("; normalize e4m3fn weights to e4m3fnuz (doubling the scales) at load" if fp8 == torch.float8_e4m3fnuz else ""))
            _check(tuple(w.shape) == shape and w.is_contiguous(), f"{name} must be a contiguous {list(shape)} tensor, "
                   f"got {list(w.shape)} strides {tuple(w.stride())}")
            _check(bool(getattr(w, "is_shuffled", False)), f"{name} must be pre-shuffled with "
                   "aiter.ops.shuffle.shuffle_weight(w, layout=(16, 16)) (is_shuffled not set; fake: stricter)")
        _check(model_dim % 128 == 0 and inter_dim % 128 == 0,
               f"per_1x128 needs model_dim and inter_dim multiples of 128, got {model_dim}, {inter_dim}")
        for name, s, shape in (("w1_scale", w1_scale, (experts, 2 * inter_dim // 128, model_dim // 128)),
                               ("w2_scale", w2_scale, (experts, model_dim // 128, inter_dim // 128))):
            _check(s is not None, f"{name} is required for per_1x128")
            assert s is not None
            _check(s.dtype == torch.float32 and tuple(s.shape) == shape and s.is_contiguous(),
                   f"{name} must be a contiguous float32 {list(shape)} tensor, got {s.dtype} {list(s.shape)} "
                   f"strides {tuple(s.stride())}")
        _check(a1_scale is None and a2_scale is None, "the fake emulates dynamic activation scales only (a1/a2_scale None)")
        return int(x.shape[0])

    @staticmethod
    def _local_ids(ids: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor | None, experts: int, m: int) -> torch.Tensor:
        """Each slot's local expert (-1: masked out), checking ids, weights and the mask."""
        _check(ids.dtype == torch.int32 and ids.dim() == 2 and ids.shape[0] == m and ids.is_contiguous(),
               f"topk_ids must be a contiguous int32 [M={m}, topk] tensor, got {ids.dtype} {list(ids.shape)}")
        _check(weights.dtype == torch.float32 and tuple(weights.shape) == tuple(ids.shape) and weights.is_contiguous(),
               f"topk_weight must be a contiguous float32 {list(ids.shape)} tensor, got {weights.dtype} {list(weights.shape)}")
        global_experts = experts
        local = torch.arange(experts, dtype=torch.int64)
        if mask is not None:
            _check(mask.dtype == torch.int32 and mask.dim() == 1 and mask.is_contiguous(),
                   f"expert_mask must be a contiguous 1-D int32 tensor, got {mask.dtype} {list(mask.shape)}")
            _check(bool(((mask == 0) | (mask == 1)).all()) and int(mask.sum()) == experts,
                   f"expert_mask must mark exactly the E={experts} local experts with 1 (fake: stricter), got {mask.tolist()}")
            global_experts = mask.numel()
            local = mask.to(torch.int64).cumsum(0) - 1
            local[mask == 0] = -1
        flat = ids.to(torch.int64)
        _check(bool(((flat >= 0) & (flat < global_experts)).all()),
               f"topk_ids must lie in [0, {global_experts}): AITER does not accept -1 (map it to a masked-out expert), "
               f"got {sorted(set(flat[(flat < 0) | (flat >= global_experts)].tolist()))[:4]}")
        return local[flat]
