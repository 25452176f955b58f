"""The MoE experts op and the grouped GEMMs in pure torch: the semantics every backend computes.

The experts op, for every token ``t`` and each of its ``k`` experts ``e = topk_ids[t, j]``:

1. quantize ``x[t]`` per 1x``bk`` group (:func:`~.quant.quantize_per_token_group`, as the dense layers do);
2. ``h = dequant(x_q[t]) @ dequant(w13[e]).T`` in fp32 (``[2I]``: gate rows first, then up rows);
3. ``a = silu(h[:I]) * h[I:]`` in fp32, quantized per 1x``bk`` group again;
4. ``o = dequant(a_q) @ dequant(w2[e]).T`` in fp32 (``[H]``);
5. ``y[t] += topk_weights[t, j] * o``, summed in fp32 and cast to ``x``'s dtype at the end.

An id of -1 (expert parallelism: the expert lives on another rank) contributes nothing.
:func:`experts_reference` computes each token's rows independently of the others (batch-invariant by
construction): both products exact per fp8 block in float64 (:func:`.exact.block_scaled_product`, then
rounded to fp32 as step 2 and 4 say), the activation and its quantization per row, and the ``k``
weighted outputs summed in the order ``j = 0..k-1`` by element-wise operations. Slow (a Python loop over
the experts used, with a host synchronisation to find them): the yardstick, not a path for CUDA graphs.
"""

from __future__ import annotations

import torch

from .exact import block_scaled_product
from .quant import quantize_per_token_group

__all__ = ["dequantize_blocks", "experts_reference", "grouped_gemm_reference", "ids_flags_torch", "quantize_slots_torch",
           "silu_mul_quant_torch", "weighted_sum_torch"]


def dequantize_blocks(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp8 ``weight`` ``[..., N, K]`` times its block scales ``[..., ceil(N/bn), ceil(K/bk)]``, in fp32."""
    n, k = weight.shape[-2:]
    bn, bk = block
    expanded = scale.to(torch.float32).repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
    return weight.to(torch.float32) * expanded


def _dequantize_rows(x_q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    k = x_q.shape[-1]
    return x_q.to(torch.float32) * scale.to(torch.float32).repeat_interleave(group, dim=-1)[..., :k]


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                      w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      block: tuple[int, int]) -> torch.Tensor:
    """The experts op (module docstring) on checked inputs; ``[M, H]`` in ``x``'s dtype."""
    m, hidden = x.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    group = block[1]
    k = topk_ids.shape[1]
    if m == 0:
        return torch.zeros((m, hidden), dtype=x.dtype, device=x.device)
    x_q, x_s = quantize_per_token_group(x, group, dtype=w13.dtype)
    ids = topk_ids.to(torch.int64)
    routed = (ids >= 0) & (ids < experts)
    out = torch.zeros((m, k, hidden), dtype=torch.float32, device=x.device)  # each slot's expert output
    for e in torch.unique(ids[routed]).tolist():
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        h = block_scaled_product(x_q[token], x_s[token], w13[e], w13_scale[e], block).to(torch.float32)
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        act_q, act_s = quantize_per_token_group(act, group, dtype=w2.dtype)
        out[token, slot] = block_scaled_product(act_q, act_s, w2[e], w2_scale[e], block).to(torch.float32)
    weights = topk_weights.to(torch.float32)
    y = torch.zeros((m, hidden), dtype=torch.float32, device=x.device)
    for j in range(k):  # in slot order, element-wise: no reduction whose order depends on M
        y = y + torch.where(routed[:, j:j + 1], out[:, j] * weights[:, j:j + 1], 0.0)
    return y.to(x.dtype)


def grouped_gemm_reference(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                           expert_of_row: torch.Tensor, block: tuple[int, int], out_dtype: torch.dtype) -> torch.Tensor:
    """``out[r] = dequant(a[r]) @ dequant(w[expert_of_row[r]]).T`` for rows ``[R, K]``; a row whose expert
    is outside ``[0, E)`` (padding) is zero."""
    rows = a.shape[0]
    n = w.shape[1]
    out = torch.zeros((rows, n), dtype=torch.float32, device=a.device)
    experts = w.shape[0]
    ids = expert_of_row.to(torch.int64)
    for e in torch.unique(ids[(ids >= 0) & (ids < experts)]).tolist():
        (row,) = torch.nonzero(ids == e, as_tuple=True)
        out[row] = _dequantize_rows(a[row], a_scale[row], block[1]) @ dequantize_blocks(w[e], w_scale[e], block).t()
    return out.to(out_dtype)


def silu_mul_quant_torch(h: torch.Tensor, dtype: torch.dtype, counts: torch.Tensor | None = None,
                         group_rows: int = 0, most: int | None = None, *, slot_ids: torch.Tensor | None = None,
                         slots: int = 0, scale: torch.Tensor | None = None,
                         record: object = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(h[:, :I]) * h[:, I:]`` of ``[R, 2I]`` in fp32, quantized per 1x128 group: row-major scales, or
    written into ``scale`` (``[R, G]`` or ``[R / group_rows, group_rows, G]``, any strides) and returned. The
    arguments the Triton version takes to skip unused rows (``counts``, ``group_rows``, ``most``, ``slot_ids``,
    ``slots``) are accepted and every row computed: unused rows are unspecified either way; ``record`` too (torch
    ops record nothing)."""
    inter = h.shape[1] // 2
    hf = h.to(torch.float32)
    q, s = quantize_per_token_group(torch.nn.functional.silu(hf[:, :inter]) * hf[:, inter:], 128, dtype=dtype)
    if scale is None:
        return q, s
    scale.copy_(s.view(scale.shape))
    return q, scale


def quantize_slots_torch(x: torch.Tensor, rows: torch.Tensor, top_k: int, q: torch.Tensor, scale: torch.Tensor,
                         slot_ids: torch.Tensor | None = None, *, record: object = None) -> None:
    """:func:`fp8select.kernels.moe_triton.quantize_slots` in torch ops: each slot's token of ``x`` quantized per
    1x128 group into row ``rows[slot]`` of ``q`` ``[L, H]`` and of ``scale`` (``[L, G]`` or ``[B, L / B, G]``);
    slots whose row is ``L`` or more skipped, and with ``slot_ids`` those it does not hold at that row. ``record``:
    accepted, as the Triton version takes it; torch ops record nothing."""
    x_q, x_s = quantize_per_token_group(x, 128, dtype=q.dtype)
    limit = q.shape[0]
    ok = rows < limit
    if slot_ids is not None:
        slot = torch.arange(rows.shape[0], device=rows.device)
        ok &= slot_ids.to(torch.int64)[rows.clamp(0, max(limit - 1, 0))] == slot
    used = torch.nonzero(ok).flatten()
    dest, token = rows[used].to(torch.int64), used // top_k
    q.view(torch.uint8)[dest] = x_q.view(torch.uint8)[token]
    if scale.dim() == 3:
        per_block = scale.shape[1]
        scale[dest // per_block, dest % per_block] = x_s[token]
    else:
        scale[dest] = x_s[token]


def weighted_sum_torch(out: torch.Tensor, row_map: torch.Tensor | None, topk_ids: torch.Tensor,
                       topk_weights: torch.Tensor, experts: int, dtype: torch.dtype, *,
                       record: object = None) -> torch.Tensor:
    """``y[t] = sum_j topk_weights[t, j] * out[row(t * k + j)]`` over ids in ``[0, experts)``, in fp32; a slot
    mapped past ``out``'s last row is skipped. ``record``: as :func:`quantize_slots_torch`'s."""
    m, k = topk_ids.shape
    rows = torch.arange(m * k, device=out.device) if row_map is None else row_map
    gathered = out.index_select(0, rows.clamp(0, max(out.shape[0] - 1, 0))).reshape(m, k, -1).to(torch.float32)
    valid = ((topk_ids >= 0) & (topk_ids < experts) & (rows < out.shape[0]).view(m, k)).unsqueeze(-1)
    return (torch.where(valid, gathered, 0.0) * topk_weights.to(torch.float32).unsqueeze(-1)).sum(1).to(dtype)


def ids_flags_torch(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """:func:`fp8select.kernels.moe_triton.ids_flags` in torch ops, ``[1, 2]`` int32: whether an id of ``ids``
    ``[M, k]`` is outside ``[0, experts)`` and not -1, and whether a row repeats an id other than -1."""
    bad = ((ids < -1) | (ids >= experts)).any()
    if ids.shape[1] > 1:
        ordered = torch.sort(ids, dim=1).values
        twice = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, :-1] >= 0)).any()
    else:
        twice = torch.zeros_like(bad)
    return torch.stack([bad, twice]).to(torch.int32).view(1, 2)
