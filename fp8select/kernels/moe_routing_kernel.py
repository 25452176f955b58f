"""The Triton kernel of :func:`fp8select.kernels.moe_routing.route`: the whole routing in one launch
(imports triton; imported lazily, only when the kernel runs).

One program holds every slot in registers: each slot's key ``expert * S_BLOCK + slot`` (slots routed
nowhere under the sentinel expert ``E``, after every real one) is unique, so ``tl.sort`` gives the
stable order the torch path's ``sort(stable=True)`` gives; ``tl.histogram`` counts the slots per
expert and ``tl.cumsum`` gives each expert's first sorted position and first padded row. Each
sorted slot needs its expert's two starts: they go through a small global scratch read back after a
barrier (``tl.gather`` would keep them in registers, but triton 3.2, the oldest fp8select accepts,
lacks it). The same barrier orders the fill of every row with the padding value ``slots`` before
the slots' own rows are written over it. Block experts need no fill: a used block's expert is
written by the slot at its first row, every later block gets -1; each row's expert (DeepGEMM's contiguous
layout) is read back from them after a second barrier.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_launch import Recorded, launch
from .triton_pdl import pdl_enter, pdl_launch

__all__ = ["route_kernel"]

_Maybe = torch.Tensor | None
Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, _Maybe, _Maybe, _Maybe]
"""What :func:`route_kernel` returns."""

_FILL = 1024
"""Rows of ``slot_ids`` filled with the padding value per loop step."""


@triton.jit(do_not_specialize=["slots", "top_k", "stride_m", "stride_k", "experts", "block_m", "blocks", "max_m"])
def _route_kernel(
    ids_ptr, slot_ids_ptr, block_expert_ptr, counts_ptr, slot_rank_ptr, slot_row_ptr, masked_row_ptr,
    masked_count_ptr, row_expert_ptr, scratch_ptr,
    slots, top_k, stride_m, stride_k, experts, block_m, blocks, max_m,
    S_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr, FILL: tl.constexpr, MASKED: tl.constexpr,
    ROW_EXPERT: tl.constexpr, PDL: tl.constexpr = False,
):
    """Every output of the routing of ``slots <= S_BLOCK`` slots over ``experts < E_BLOCK`` experts
    (see :func:`route_kernel`); ``scratch_ptr``: int32 ``[2 * E_BLOCK]``, overwritten."""
    pdl_enter(PDL)
    i = tl.arange(0, S_BLOCK)
    live = i < slots
    ids = tl.load(ids_ptr + (i // top_k).to(tl.int64) * stride_m + (i % top_k).to(tl.int64) * stride_k,
                  mask=live, other=-1)
    expert = tl.where(live & (ids >= 0) & (ids < experts), ids, experts).to(tl.int32)

    e = tl.arange(0, E_BLOCK)
    counts = tl.where(e < experts, tl.histogram(expert, E_BLOCK), 0)
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = tl.cumsum(padded, 0)
    tl.store(counts_ptr + e, counts, mask=e < experts)
    keep = tl.minimum(max_m, slots // top_k)  # a masked layout's slots per expert, at most
    if MASKED:
        tl.store(masked_count_ptr + e, tl.minimum(counts, keep), mask=e < experts)
    tl.store(scratch_ptr + e, tl.cumsum(counts, 0) - counts)
    tl.store(scratch_ptr + E_BLOCK + e, pad_end - padded)
    used = tl.sum(padded, 0) // block_m
    tl.store(block_expert_ptr + i, tl.full([S_BLOCK], -1, tl.int32), mask=(i >= used) & (i < blocks))
    for start in range(0, blocks * block_m, FILL):
        rows = start + tl.arange(0, FILL)
        tl.store(slot_ids_ptr + rows, tl.full([FILL], 0, tl.int32) + slots, mask=rows < blocks * block_m)
    tl.debug_barrier()

    key = tl.sort(expert * S_BLOCK + i)
    sorted_expert = key // S_BLOCK
    slot = key % S_BLOCK
    routed = sorted_expert < experts
    rank = i - tl.load(scratch_ptr + sorted_expert)
    row = tl.load(scratch_ptr + E_BLOCK + sorted_expert) + rank
    tl.store(slot_ids_ptr + row, slot, mask=routed)
    tl.store(block_expert_ptr + row // block_m, sorted_expert, mask=routed & (rank % block_m == 0))
    tl.store(slot_rank_ptr + slot, tl.where(routed, rank, -1).to(tl.int64), mask=slot < slots)
    tl.store(slot_row_ptr + slot, tl.where(routed, row, 0).to(tl.int64), mask=slot < slots)
    if MASKED:
        masked = sorted_expert.to(tl.int64) * max_m + rank
        nowhere = experts.to(tl.int64) * max_m
        tl.store(masked_row_ptr + slot, tl.where(routed & (rank < keep), masked, nowhere), mask=slot < slots)
    if ROW_EXPERT:
        tl.debug_barrier()  # every block's expert written
        for start in range(0, blocks * block_m, FILL):
            rows = start + tl.arange(0, FILL)
            ok = rows < blocks * block_m
            tl.store(row_expert_ptr + rows, tl.load(block_expert_ptr + rows // block_m, mask=ok), mask=ok)


def route_kernel(topk_ids: torch.Tensor, experts: int, block_m: int, blocks: int, max_m: int | None,
                 row_expert: bool = False, pdl: bool = False, record: list[Recorded] | None = None) -> Outputs:
    """``(slot_ids, block_expert, counts, slot_rank, slot_row, masked_row, masked_count, row_expert)`` of
    ``topk_ids`` ``[M, k]`` (int32 or int64, any strides, ``M * k >= 1``) over ``experts`` experts in
    ``blocks`` blocks of ``block_m`` rows, as :class:`~fp8select.kernels.moe_routing.Routing` defines them,
    in one launch: ``slot_row`` is what ``row_of_slot`` computes, ``masked_row`` and ``masked_count`` what
    ``masked_rows`` and ``masked_counts`` compute at ``max_m`` (None without it), ``row_expert`` what
    ``row_experts`` computes (None unless asked). Sizes are checked by the caller (``kernel_fits``). ``pdl``:
    launched with programmatic dependent launch (:mod:`.triton_pdl`; the caller knows it runs here).
    ``record``: the launch appended to it (:func:`~.triton_launch.launch`).

    One compiled kernel serves each power of two of slots (one for 1..128) and of ``E + 1`` (one for
    E < 64): the two ends of an M bucket reach every one a bucket launches, so a warm-up compiles
    them all."""
    m, k = topk_ids.shape
    slots, device = m * k, topk_ids.device
    s_block = max(128, triton.next_power_of_2(slots))
    # A bin for the slots routed nowhere; at least one bin per lane of a warp (32 or 64): tl.histogram's
    # GPU lowering spreads the bins over a warp's lanes (recent triton pads them to that itself).
    e_block = max(64, triton.next_power_of_2(experts + 1))
    slot_ids = torch.empty(blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=device)
    counts = torch.empty(experts, dtype=torch.int32, device=device)
    slot_rank = torch.empty(slots, dtype=torch.int64, device=device)
    slot_row = torch.empty(slots, dtype=torch.int64, device=device)
    masked_row = None if max_m is None else torch.empty(slots, dtype=torch.int64, device=device)
    masked_count = None if max_m is None else torch.empty(experts, dtype=torch.int32, device=device)
    row_experts = torch.empty(blocks * block_m, dtype=torch.int32, device=device) if row_expert else None
    scratch = torch.empty(2 * e_block, dtype=torch.int32, device=device)
    launch(_route_kernel, (1,), (
        topk_ids, slot_ids, block_expert, counts, slot_rank, slot_row, _or(masked_row, slot_row),
        _or(masked_count, counts), _or(row_experts, slot_ids), scratch, slots, k, topk_ids.stride(0),
        topk_ids.stride(1), experts, block_m, blocks, 0 if max_m is None else max_m), dict(
        S_BLOCK=s_block, E_BLOCK=e_block, FILL=_FILL, MASKED=max_m is not None, ROW_EXPERT=row_expert,
        num_warps=max(4, min(16, s_block // 256)), **pdl_launch(pdl)), record)
    return slot_ids, block_expert, counts, slot_rank, slot_row, masked_row, masked_count, row_experts


def _or(t: torch.Tensor | None, unused: torch.Tensor) -> torch.Tensor:
    """``t``, or a tensor of the same dtype the kernel is passed in its place and never touches."""
    return unused if t is None else t
