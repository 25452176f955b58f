"""The MoE routing kernel (fp8select/kernels/moe_routing_kernel.py) under the Triton interpreter: every
field it writes, and what ``row_of_slot`` and ``masked_rows`` read from it, is the torch path's bits.

``TRITON_INTERPRET=1`` is set before triton is first imported (see tests/test_kernels_triton_gemm.py).
The interpreter runs ``tl.sort`` one compare-and-swap stage at a time (seconds at 1024 slots),
so most cases stay within the kernel's smallest block of 128 slots; each (M, k) takes four (E,
block_m) pairs, and four neighbouring (M, k) cover all sixteen.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
import torch

pytest.importorskip("triton")

import fp8select
from fp8select.kernels import moe_routing_kernel
from fp8select.kernels.moe_routing import (
    KERNEL_MAX_EXPERTS,
    KERNEL_MAX_SLOTS,
    Routing,
    block_capacity,
    kernel_fits,
    masked_counts,
    masked_rows,
    route,
    row_experts,
    row_of_slot,
    skewed_routing,
    token_of_row,
    uniform_routing,
)

if type(moe_routing_kernel._route_kernel).__name__ != "InterpretedFunction":
    importlib.reload(moe_routing_kernel)

FIELDS = ("slot_ids", "block_expert", "counts", "slot_rank")
EXPERTS = (1, 8, 32, 256)
BLOCK_M = (1, 16, 64, 128)
KINDS = ("random", "one expert", "int64 far out", "strided")


def _ids(m: int, k: int, e: int, kind: str, seed: int) -> torch.Tensor:
    """``[m, k]`` ids of one kind: uniform over ``[-2, E + 2)`` (-1 and out-of-range ids among them, some
    experts idle), every slot on one expert (with one -1), int64 ids far beyond int32, or a strided view."""
    g = torch.Generator().manual_seed(seed)
    if kind == "one expert":
        ids = torch.full((m, k), e - 1, dtype=torch.int32)
        ids.view(-1)[: min(1, m * k - 1)] = -1
        return ids
    if kind == "int64 far out":
        ids = torch.randint(-1, e, (m, k), generator=g, dtype=torch.int64)
        return torch.where(torch.rand(m, k, generator=g) < 0.2, ids + (1 << 33), ids)  # ids + 2**33: wraps to ids in int32
    ids = torch.randint(-2, e + 2, (m, 2 * k if kind == "strided" else k), generator=g, dtype=torch.int32)
    return ids[:, ::2] if kind == "strided" else ids


def _assert_same(kernel: Routing, torch_path: Routing, experts: int, max_m: int) -> None:
    for name in FIELDS:
        got, want = getattr(kernel, name), getattr(torch_path, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), f"{name}: {got.tolist()} != {want.tolist()}"
    assert (kernel.rows, kernel.slots, kernel.block_m) == (torch_path.rows, torch_path.slots, torch_path.block_m)
    assert torch.equal(row_of_slot(kernel), row_of_slot(torch_path))
    assert torch.equal(masked_rows(kernel, experts, max_m), masked_rows(torch_path, experts, max_m))
    assert torch.equal(masked_rows(kernel, experts, max_m + 1), masked_rows(torch_path, experts, max_m + 1))
    assert torch.equal(masked_counts(kernel, max_m), masked_counts(torch_path, max_m))
    assert torch.equal(masked_counts(kernel, max_m + 1), masked_counts(torch_path, max_m + 1))
    assert torch.equal(row_experts(kernel), row_experts(torch_path))


SHAPES = ((0, 8), (1, 1), (1, 8), (2, 2), (3, 8), (7, 1), (7, 2), (7, 8), (64, 1), (64, 2), (64, 8), (300, 1))


@pytest.mark.parametrize(("index", "m", "k"), [(i, m, k) for i, (m, k) in enumerate(SHAPES)])
def test_kernel_writes_the_torch_paths_bits(index: int, m: int, k: int) -> None:
    for j, experts in enumerate(EXPERTS):
        block_m, kind = BLOCK_M[(j + index) % 4], KINDS[(j + index // 4) % 4]
        ids = _ids(m, k, experts, kind, seed=100 * index + j)
        max_m = max(1, m // 2)  # some experts' slots beyond max_m
        kernel = route(ids, experts, block_m, max_m=max_m, row_expert=True, kernel=True)
        assert (kernel.slot_row is None) == (m == 0) and (kernel.masked_row is None) == (m == 0)
        assert (kernel.masked_count is None) == (m == 0) and (kernel.row_expert is None) == (m == 0)
        _assert_same(kernel, route(ids, experts, block_m, kernel=False), experts, max_m)


def test_the_kernel_at_1024_slots_and_every_slot_routed_nowhere() -> None:
    ids = _ids(300, 2, 256, "random", seed=7)
    _assert_same(route(ids, 256, 64, max_m=4, row_expert=True, kernel=True), route(ids, 256, 64, kernel=False), 256, 4)
    nowhere = torch.tensor([[-1, 8], [9, -1]], dtype=torch.int32)
    _assert_same(route(nowhere, 8, 16, max_m=2, row_expert=True, kernel=True), route(nowhere, 8, 16, kernel=False), 8, 2)


def test_a_masked_layout_keeps_at_most_m_slots_of_one_expert() -> None:
    """Repeated ids can give one expert more slots than there are tokens; a masked layout keeps its first
    ``min(max_m, M)`` (what a top-k routing can give it), however many rows ``max_m`` holds."""
    ids = torch.tensor([[3, 3, 3], [3, 3, 1], [0, 3, 3]], dtype=torch.int32)  # expert 3: 7 slots of 3 tokens
    kernel = route(ids, 4, 1, max_m=8, kernel=True)
    assert masked_counts(kernel, 8).tolist() == [1, 1, 0, 3]
    assert masked_rows(kernel, 4, 8).tolist() == [24, 25, 26, 32, 32, 8, 0, 32, 32]
    _assert_same(kernel, route(ids, 4, 1, kernel=False), 4, 8)


def test_sizes_never_depend_on_the_ids_values() -> None:
    m, k, experts, block_m = 5, 4, 16, 16
    kinds = [_ids(m, k, experts, kind, seed=3) for kind in KINDS] + [torch.full((m, k), -1, dtype=torch.int32)]
    for kernel in (True, False):
        shapes = {tuple(tuple(getattr(route(ids, experts, block_m, kernel=kernel), f).shape) for f in FIELDS)
                  for ids in kinds}
        assert len(shapes) == 1, shapes


def test_auto_runs_torch_on_cpu_and_the_kernel_refuses_what_it_does_not_fit() -> None:
    ids = _ids(3, 2, 8, "random", seed=0)
    assert route(ids, 8, 16).slot_row is None  # CPU ids: the torch ops
    with pytest.raises(ValueError, match=re.escape(f"1..{KERNEL_MAX_SLOTS} slots over 1..{KERNEL_MAX_EXPERTS} experts")):
        route(torch.zeros(KERNEL_MAX_SLOTS + 1, 1, dtype=torch.int32), 8, 16, kernel=True)
    with pytest.raises(ValueError, match=f"got 6 slots over {KERNEL_MAX_EXPERTS + 1} experts"):
        route(ids, KERNEL_MAX_EXPERTS + 1, 16, kernel=True)
    with pytest.raises(ValueError, match=re.escape("torch.int16")):
        route(ids.to(torch.int16), 8, 16, kernel=True)


def test_the_torch_path_imports_no_triton() -> None:
    code = ("import sys, torch\n"
            "from fp8select.kernels.moe_routing import route, row_of_slot\n"
            "r = route(torch.tensor([[1, 0]]), 2, 4)\n"
            "assert row_of_slot(r).tolist() == [4, 0]\n"
            "assert 'triton' not in sys.modules, 'triton imported'\n")
    root = str(Path(next(iter(fp8select.__path__))).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_block_capacity_and_what_the_kernel_fits_at_their_edges() -> None:
    assert [block_capacity(s, 8, 16) for s in (0, 1, 16, 17, 200)] == [0, 1, 9, 10, 21]
    assert block_capacity(1000, 1, 64) == 17 and block_capacity(3, 300, 1) == 3  # one expert; more experts than slots
    assert kernel_fits(KERNEL_MAX_SLOTS, KERNEL_MAX_EXPERTS, torch.int32) and kernel_fits(1, 1, torch.int64)
    assert not kernel_fits(KERNEL_MAX_SLOTS + 1, 8, torch.int32) and not kernel_fits(8, KERNEL_MAX_EXPERTS + 1, torch.int32)
    assert not kernel_fits(8, 0, torch.int32) and not kernel_fits(8, 8, torch.int16)
    empty = route(torch.zeros(0, 2, dtype=torch.int32), 4, 16)  # no slots: no rows
    assert empty.rows == 0 and empty.block_expert.numel() == 0 and empty.counts.tolist() == [0] * 4
    nowhere = route(torch.tensor([[0]]), 0, 4)  # no experts: the slot routed nowhere, its one block unused
    assert (nowhere.slot_ids.tolist(), nowhere.block_expert.tolist(), nowhere.counts.numel(), nowhere.slot_rank.tolist()) \
        == ([1] * 4, [-1], 0, [-1])


def test_token_of_row_reads_each_rows_token_and_the_last_token_elsewhere() -> None:
    """Slot ``t * k + j`` is token ``t``'s; a padding row or a slot routed nowhere reads the last token."""
    ids = torch.tensor([[1, 0], [1, -1], [2, 1], [-1, -1]], dtype=torch.int32)  # k 2: slots 0-7
    routing = route(ids, 3, 2, kernel=False)  # expert 0: slot 1; 1: slots 0, 2, 5; 2: slot 4; 8 pads
    assert routing.slot_ids.tolist() == [1, 8, 0, 2, 5, 8, 4, 8] + [8] * 6
    assert token_of_row(routing, 2, 4).tolist() == [0, 3, 0, 1, 2, 3, 2, 3] + [3] * 6
    assert token_of_row(routing, 2, 4).dtype == torch.int64


def test_what_the_kernel_computed_is_returned_as_it_is() -> None:
    """Row experts and the masked layout come from the kernel's one launch when asked for (not otherwise), are
    returned as they are for the same ``max_m``, and the launch is recorded where a record is given."""
    ids = _ids(5, 2, 8, "random", seed=4)
    plain = route(ids, 8, 16, kernel=True)
    assert plain.row_expert is None and plain.masked_row is None and plain.max_m is None
    record: list[object] = []
    full = route(ids, 8, 16, max_m=4, row_expert=True, kernel=True, record=record)
    assert len(record) == 1 and full.max_m == 4
    assert row_experts(full) is full.row_expert and torch.equal(full.row_expert, row_experts(plain))
    assert masked_rows(full, 8, 4) is full.masked_row and masked_counts(full, 4) is full.masked_count
    assert masked_rows(full, 8, 5) is not full.masked_row and masked_rows(full, 9, 4) is not full.masked_row
    assert masked_counts(full, 5) is not full.masked_count


def test_the_routings_of_the_measurements_are_reproducible_and_the_skew_is_the_documented_one() -> None:
    """uniform_routing and skewed_routing draw from the generator given; under skew, at M 64 with k 8 of 32
    experts, about 18 experts are read and the busiest holds nearly every token."""
    for draw in (uniform_routing, skewed_routing):
        first = draw(64, 8, 32, "cpu", torch.Generator().manual_seed(5))
        again = draw(64, 8, 32, "cpu", torch.Generator().manual_seed(5))
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
        assert not torch.equal(first[1], draw(64, 8, 32, "cpu", torch.Generator().manual_seed(6))[1])
    read, busiest = [], []
    for seed in range(8):
        _, ids = skewed_routing(64, 8, 32, "cpu", torch.Generator().manual_seed(seed))
        counts = torch.bincount(ids.flatten().long(), minlength=32)
        read.append(int((counts > 0).sum()))
        busiest.append(int(counts.max()))
    assert 15 <= sum(read) / len(read) <= 21 and min(busiest) >= 56


def test_the_routings_of_fewer_local_experts_than_top_k_route_the_rest_nowhere() -> None:
    """Expert parallelism leaves a rank fewer experts than ``k`` (4 of DeepSeek-V3's top-8): every local expert once
    per token and -1 (another rank's) for the rest, so measuring and warming such a layer works (topk raised)."""
    for draw in (uniform_routing, skewed_routing):
        weights, ids = draw(6, 8, 4, "cpu", torch.Generator().manual_seed(1))
        assert weights.shape == ids.shape == (6, 8) and ids.dtype == torch.int32 and weights.dtype == torch.float32
        assert torch.equal(ids[:, 4:], torch.full((6, 4), -1, dtype=torch.int32))
        assert torch.equal(ids[:, :4].sort(dim=1).values, torch.arange(4, dtype=torch.int32).expand(6, 4))
