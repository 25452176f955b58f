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
    masked_counts,
    masked_rows,
    route,
    row_experts,
    row_of_slot,
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
