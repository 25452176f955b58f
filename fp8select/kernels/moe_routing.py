"""Token routing for grouped (MoE) GEMMs, in torch, without a host synchronisation.

A MoE call routes each token to ``k`` experts (``topk_ids`` ``[M, k]``); each (token, j) pair is a
*slot*, numbered ``t * k + j``. Grouped GEMMs want the slots grouped by expert:

* **blocks** (fp8select's Triton kernels, DeepGEMM's contiguous layout): the slots sorted by expert,
  each expert's run padded to a multiple of ``block_m`` rows, so that every block of ``block_m`` rows
  belongs to one expert (``block_expert``, -1 for a block no expert uses);
* **masked** (DeepGEMM's masked layout, DeepEP's low-latency dispatch): ``[E, max_m]`` rows, expert
  ``e``'s slots in its first ``counts[e]`` rows; at most ``min(max_m, M)`` of them (tokens naming distinct
  experts, as top-k routing does, never give one expert more than M; the slots of a repeated id beyond
  that are dropped).

An id of -1 (an expert on another rank) or any other id outside ``[0, E)`` routes its slot nowhere.
Every size here depends only on M, k, E and ``block_m``, never on the ids' values, and nothing is
read back to the host, so the routing can be captured in a CUDA graph.

On a GPU, :func:`route` is one Triton launch (:mod:`.moe_routing_kernel`) where the problem fits one
program's registers (:func:`kernel_fits`); elsewhere, beyond those sizes or without triton, about 25
small torch ops that write the same bits. At decode (a few hundred slots) those launches, not their
work, are the routing's time; at prefill they matter less and a single program would sort slower
(neither is timed on a GPU yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["KERNEL_MAX_EXPERTS", "KERNEL_MAX_SLOTS", "Routing", "block_capacity", "kernel_fits", "masked_counts",
           "masked_rows", "route", "row_experts", "row_of_slot", "skewed_routing", "token_of_row", "uniform_routing"]

KERNEL_MAX_SLOTS = 4096
"""Most slots (``M * k``) the routing kernel takes: its one program sorts them all in registers
(``tl.sort`` on a power-of-two block, 8 keys a thread at 16 warps). 4096 slots is M = 512 at k = 8,
every decode batch; beyond it (prefill) the torch ops' launches no longer dominate, and one program
would be the slower way to sort (a choice, not yet timed on a GPU)."""

KERNEL_MAX_EXPERTS = 1023
"""Most experts the routing kernel takes: it counts slots in ``next_power_of_2(E + 1)`` bins (one
for the slots routed nowhere), at most 1024, a few a thread; the largest MoE models have a few
hundred experts."""

_KERNEL_IDS = (torch.int32, torch.int64)
"""Id dtypes the kernel reads; others (rare) take the torch path."""


def block_capacity(slots: int, experts: int, block_m: int) -> int:
    """The most blocks ``slots`` slots over ``experts`` experts can fill: each block holds at least one
    slot, and each expert's padding adds at most one block (``ceil(c/b) <= c/b + 1``); none for no slots."""
    return min(slots, -(-slots // block_m) + min(experts, slots))


@dataclass(frozen=True)
class Routing:
    """Where each slot goes (device tensors; see the module docstring).

    Attributes:
        slot_ids: int32 ``[blocks * block_m]``: the slot at each padded row, ``slots`` for padding.
        block_expert: int32 ``[blocks]``: the expert of each block of rows, -1 for an unused block.
        counts: int32 ``[E]``: slots per expert.
        slot_rank: int64 ``[slots]``: each slot's position among its expert's slots (-1 when routed nowhere).
        block_m: rows per block.
        slots: ``M * k``.
        tokens: ``M``.
        slot_row: :func:`row_of_slot`, when the route computed it (the kernel does, in the same launch).
        max_m: the ``max_m`` of ``masked_row`` and ``masked_count``, when given.
        masked_row: :func:`masked_rows` at ``max_m``, when the route computed it.
        masked_count: :func:`masked_counts` at ``max_m``, when the route computed it.
        row_expert: :func:`row_experts`, when the route computed it.
    """

    slot_ids: torch.Tensor
    block_expert: torch.Tensor
    counts: torch.Tensor
    slot_rank: torch.Tensor
    block_m: int
    slots: int
    tokens: int
    slot_row: torch.Tensor | None = None
    max_m: int | None = None
    masked_row: torch.Tensor | None = None
    masked_count: torch.Tensor | None = None
    row_expert: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.slot_ids.shape[0])


def kernel_fits(slots: int, experts: int, dtype: torch.dtype) -> bool:
    """Whether the routing kernel takes ``slots`` slots over ``experts`` experts with ids of ``dtype``
    (see :data:`KERNEL_MAX_SLOTS`, :data:`KERNEL_MAX_EXPERTS`)."""
    return slots <= KERNEL_MAX_SLOTS and 0 < experts <= KERNEL_MAX_EXPERTS and dtype in _KERNEL_IDS


def route(topk_ids: torch.Tensor, experts: int, block_m: int, *, max_m: int | None = None, row_expert: bool = False,
          kernel: bool | None = None, pdl: bool = False, record: list[Any] | None = None) -> Routing:
    """Sort the slots of ``topk_ids`` ``[M, k]`` by expert into blocks of ``block_m`` rows.

    ``max_m``: the masked layout's rows per expert, for :func:`masked_rows` and :func:`masked_counts`;
    ``row_expert``: :func:`row_experts` wanted (the kernel computes them in the same launch). ``kernel``:
    None runs the Triton kernel for CUDA ids that :func:`kernel_fits` when triton imports, the torch ops
    otherwise; True runs the kernel (on any device triton runs on, the interpreter included; ValueError
    where it does not fit, ImportError without triton); False runs the torch ops. No slots (M = 0) need
    no kernel: the torch ops route them. ``pdl``: the kernel launched with programmatic dependent launch
    (:mod:`.triton_pdl`; where the caller found it runs). ``record``: the kernel's launch appended to it
    (:func:`~.triton_launch.launch`); the torch ops record nothing.
    """
    m, k = topk_ids.shape
    slots = m * k
    blocks = block_capacity(slots, experts, block_m)
    fits = kernel_fits(slots, experts, topk_ids.dtype)
    if kernel is False or slots == 0 or (kernel is None and not (fits and topk_ids.is_cuda)):
        return _route_torch(topk_ids, experts, block_m, blocks)
    if not fits:
        raise ValueError(f"the routing kernel takes 1..{KERNEL_MAX_SLOTS} slots over 1..{KERNEL_MAX_EXPERTS} experts "
                         f"with int32 or int64 ids, got {slots} slots over {experts} experts, {topk_ids.dtype}")
    try:
        from .moe_routing_kernel import route_kernel
    except ImportError:
        if kernel:
            raise
        return _route_torch(topk_ids, experts, block_m, blocks)
    slot_ids, block_expert, counts, slot_rank, slot_row, masked_row, masked_count, row_experts = route_kernel(
        topk_ids, experts, block_m, blocks, max_m, row_expert, pdl, record)
    return Routing(slot_ids, block_expert, counts, slot_rank, block_m, slots, m, slot_row, max_m, masked_row,
                   masked_count, row_experts)


def _route_torch(topk_ids: torch.Tensor, experts: int, block_m: int, blocks: int) -> Routing:
    """:func:`route` in torch ops (``blocks``: :func:`block_capacity`)."""
    m, k = topk_ids.shape
    slots = m * k
    device = topk_ids.device
    ids = topk_ids.reshape(-1).to(torch.int64)
    valid = (ids >= 0) & (ids < experts)
    key = torch.where(valid, ids, experts)  # slots routed nowhere sort last, under a sentinel expert
    counts = torch.zeros(experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:experts] + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = torch.cat([pad_end.new_zeros(1), pad_end[:-1]])
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    count_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(slots, device=device) - count_start[sorted_key]
    capacity = blocks * block_m
    dest_start = torch.cat([pad_start, pad_start.new_full((1,), capacity)])  # the sentinel lands past the end
    dest = torch.where(sorted_key < experts, dest_start[sorted_key] + rank, capacity)
    slot_ids = torch.full((capacity + 1,), slots, dtype=torch.int32, device=device)
    slot_ids.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(blocks, device=device, dtype=torch.int64) * block_m
    block_expert = torch.searchsorted(pad_end, starts, right=True)
    block_expert = torch.where(block_expert < experts, block_expert, -1).to(torch.int32)
    slot_rank = torch.empty(slots, dtype=torch.int64, device=device)
    slot_rank.scatter_(0, order, torch.where(sorted_key < experts, rank, -1))
    return Routing(slot_ids[:capacity], block_expert, counts[:experts].to(torch.int32), slot_rank, block_m, slots, m)


def row_of_slot(routing: Routing) -> torch.Tensor:
    """int64 ``[slots]``: the padded row each slot sits at (0 for a slot routed nowhere: never read)."""
    if routing.slot_row is not None:
        return routing.slot_row
    rows = torch.zeros(routing.slots + 1, dtype=torch.int64, device=routing.slot_ids.device)
    rows.scatter_(0, routing.slot_ids.to(torch.int64),
                  torch.arange(routing.rows, dtype=torch.int64, device=rows.device))
    return rows[: routing.slots]


def token_of_row(routing: Routing, top_k: int, tokens: int) -> torch.Tensor:
    """int64 ``[rows]``: the token whose activation each sorted row reads (its slot ``// top_k``); a row
    holding no slot (padding, or a slot routed nowhere) reads the last token, whose results there are
    never read back."""
    return (routing.slot_ids.to(torch.int64) // top_k).clamp(max=tokens - 1)


def masked_rows(routing: Routing, experts: int, max_m: int) -> torch.Tensor:
    """int64 ``[slots]``: each slot's row ``e * max_m + rank`` in a masked ``[E, max_m]`` layout, or
    ``E * max_m`` (one past the end) for a slot routed nowhere or beyond its expert's first ``min(max_m, M)``."""
    if routing.masked_row is not None and routing.max_m == max_m and routing.counts.shape[0] == experts:
        return routing.masked_row
    ids = routing.slot_rank  # rank within its expert
    expert = _slot_expert(routing)
    ok = (ids >= 0) & (ids < min(max_m, routing.tokens))
    return torch.where(ok, expert * max_m + ids, experts * max_m)


def masked_counts(routing: Routing, max_m: int) -> torch.Tensor:
    """int32 ``[E]``: the rows each expert uses in a masked ``[E, max_m]`` layout (its slots, at most
    ``min(max_m, M)``)."""
    if routing.masked_count is not None and routing.max_m == max_m:
        return routing.masked_count
    return routing.counts.clamp(max=min(max_m, routing.tokens))


def row_experts(routing: Routing) -> torch.Tensor:
    """int32 ``[rows]``: the expert of each padded row (its block's), -1 in a block no expert uses: DeepGEMM's
    contiguous ``grouped_layout``."""
    if routing.row_expert is not None:
        return routing.row_expert
    return routing.block_expert.repeat_interleave(routing.block_m)


def _slot_expert(routing: Routing) -> torch.Tensor:
    """int64 ``[slots]``: each slot's expert (0 where routed nowhere), from the padded rows."""
    expert = torch.zeros(routing.slots + 1, dtype=torch.int64, device=routing.slot_ids.device)
    expert.scatter_(0, routing.slot_ids.to(torch.int64), row_experts(routing).to(torch.int64).clamp(min=0))
    return expert[: routing.slots]


def uniform_routing(m: int, k: int, e: int, device: torch.device | str,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_weights fp32 [M, k], topk_ids int32 [M, k])``: each token's ``k`` experts distinct and drawn
    uniformly (the top-k of uniform noise), weights a softmax of random logits over them. With fewer experts
    than ``k`` (a rank's local experts under expert parallelism), every one of them and -1 for the rest."""
    noise = torch.rand(m, e, generator=generator, device=device)
    ids = _widened(noise.topk(min(k, e), dim=1).indices.to(torch.int32), k, -1)
    weights = torch.softmax(torch.randn(m, k, generator=generator, device=device), dim=1)
    return weights, ids


def _widened(t: torch.Tensor, k: int, fill: float) -> torch.Tensor:
    """``t`` ``[M, j]`` widened to ``k`` columns of ``fill``: a token's slots on experts of other ranks (id -1)."""
    return t if t.shape[1] == k else torch.cat([t, t.new_full((t.shape[0], k - t.shape[1]), fill)], dim=1)


SKEW = 8.0
"""How far :func:`skewed_routing` lowers the last expert's logit below the first's."""


def skewed_routing(m: int, k: int, e: int, device: torch.device | str,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_weights fp32 [M, k], topk_ids int32 [M, k])`` of a load-imbalanced batch: random logits with
    expert ``j``'s lowered by ``SKEW * j / E``, each token's ``k`` distinct experts and their weights the top-k
    of their softmax. The first experts draw most tokens (at M 64, k 8 of 32 experts: about 18 experts read,
    the busiest with nearly every token). With fewer experts than ``k``, every one of them and -1 for the rest."""
    logits = torch.randn(m, e, generator=generator, device=device)
    logits -= torch.arange(e, device=device, dtype=torch.float32) * (SKEW / e)
    weights, ids = torch.softmax(logits, dim=1).topk(min(k, e), dim=1)
    return _widened(weights.float(), k, 0.0), _widened(ids.to(torch.int32), k, -1)
