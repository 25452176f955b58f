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
    alone = layer(probe[None])[0]
    for m in ms:
        for position in dict.fromkeys((0, m // 2, m - 1)):
            batch = rows[:m].clone()
            batch[position] = probe
            assert torch.equal(layer(batch)[position], alone), (m, position)
