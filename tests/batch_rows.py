"""A check the batch-invariance tests share: a probe row's output is the same bits alone and at any
position of a batch of any M."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def assert_rows_batch_invariant(layer: Callable[[torch.Tensor], torch.Tensor], k: int, ms: Sequence[int],
                                seed: int) -> None:
    """``layer(batch)[position]`` equals ``layer(probe alone)`` bitwise, the probe at the first, middle and
    last position of batches of every M in ``ms`` (the other rows random)."""
    rows = torch.randn(max(ms), k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    probe = torch.randn(k, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)

    def row_at(m: int, position: int) -> torch.Tensor:
        batch = rows[:m].clone()
        batch[position] = probe
        return layer(batch)[position]

    _assert_same_row(layer(probe[None])[0], row_at, ms)


def _assert_same_row(alone: torch.Tensor, row_at: Callable[[int, int], torch.Tensor], ms: Sequence[int]) -> None:
    """``row_at(m, position)``, the probe's output with the probe at ``position`` of a batch of ``m``, is
    ``alone`` bitwise at the first, middle and last position of every M in ``ms``."""
    for m in ms:
        for position in dict.fromkeys((0, m // 2, m - 1)):
            assert torch.equal(row_at(m, position), alone), (m, position)


def assert_moe_rows_batch_invariant(moe: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                                    hidden: int, experts: int, top_k: int, ms: Sequence[int], seed: int) -> None:
    """The same for a MoE experts op ``moe(x, topk_weights, topk_ids)``: a probe token with its own experts
    and weights (one id -1) gives the same bits alone and at any position among tokens routed at random."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(max(ms), hidden, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(max(ms))]).to(torch.int32)
    weights = torch.softmax(torch.randn(max(ms), top_k, generator=g), dim=-1)
    probe = torch.randn(hidden, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    probe_ids = torch.randperm(experts, generator=torch.Generator().manual_seed(9))[:top_k].to(torch.int32)
    probe_ids[-1] = -1  # an expert on another rank
    probe_weights = torch.softmax(torch.randn(top_k, generator=torch.Generator().manual_seed(10)), dim=-1)

    def row_at(m: int, position: int) -> torch.Tensor:
        x, w, i = rows[:m].clone(), weights[:m].clone(), ids[:m].clone()
        x[position], w[position], i[position] = probe, probe_weights, probe_ids
        return moe(x, w, i)[position]

    _assert_same_row(moe(probe[None], probe_weights[None], probe_ids[None])[0], row_at, ms)
