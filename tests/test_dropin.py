"""The drop-in ``Selection.linear``: one prepared layer per weight, never stale, freed with the weight."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err
from matrix import MATRIX

from fp8select import InvalidDtypeError, InvalidInputError, Selection, resolve

CPU = MATRIX["cpu-only"][0]
N, K = 256, 384


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> tuple[Selection, list[Any]]:
    """A CPU selection whose prepare() calls are recorded (the layers they made)."""
    prepared: list[Any] = []
    prepare = Selection.prepare

    def recording(self: Selection, *args: Any, **kwargs: Any) -> Any:
        layer = prepare(self, *args, **kwargs)
        prepared.append(layer)
        return layer

    monkeypatch.setattr(Selection, "prepare", recording)
    return resolve(CPU, plugins=False), prepared


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_the_same_weight_is_prepared_once(counted: tuple[Selection, list[Any]], out_dtype: torch.dtype | None) -> None:
    sel, prepared = counted
    w, s = random_problem(N, K, seed=1)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    first = sel.linear(x, w, [128, 128], s, out_dtype=out_dtype)
    for _ in range(3):
        assert torch.equal(sel.linear(x, w, [128, 128], s, out_dtype=out_dtype), first)
    assert len(prepared) == 1 and len(sel._memo.layers) == 1
    assert rel_err(first, expected(x, w, s, (128, 128))) < 1e-2


@pytest.mark.parametrize("change", ["weight in place", "scale in place", "weight re-pointed", "another weight",
                                    "another scale", "block size", "output dtype"])
def test_a_changed_weight_or_call_is_prepared_again(counted: tuple[Selection, list[Any]], change: str) -> None:
    sel, prepared = counted
    w, s = random_problem(N, K, seed=2)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    sel.linear(x, w, (128, 128), s)
    block: tuple[int, int] = (128, 128)
    out_dtype = None
    if change == "weight in place":
        w.copy_(random_problem(N, K, seed=3)[0])
    elif change == "scale in place":
        s.mul_(2)
    elif change == "weight re-pointed":
        w.data = random_problem(N, K, seed=4)[0]
    elif change == "another weight":
        w = w.clone()
    elif change == "another scale":
        s = s * 2
    elif change == "block size":
        w, s = w, random_problem(N, K, (1, 128), seed=5)[1]
        block = (1, 128)
    else:
        out_dtype = torch.float32
    out = sel.linear(x, w, block, s, out_dtype=out_dtype)
    assert len(prepared) == 2
    assert out.dtype == (out_dtype or torch.bfloat16)
    assert rel_err(out, expected(x, w, s, block)) < 1e-2  # the new weight's product, not the stale one's


def test_the_same_tensors_under_another_block_size_are_checked_again(counted: tuple[Selection, list[Any]]) -> None:
    sel, prepared = counted
    w, s = random_problem(N, K, seed=8)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    sel.linear(x, w, (128, 128), s)
    with pytest.raises(InvalidInputError, match="weight_scale: expected shape"):  # [2, 2] for 128 x 256 blocks
        sel.linear(x, w, (128, 256), s)
    assert len(prepared) == 1


def test_the_layer_is_freed_with_the_weight(counted: tuple[Selection, list[Any]]) -> None:
    sel, prepared = counted
    w, s = random_problem(N, K, seed=6)
    sel.linear(torch.randn(2, K, dtype=torch.bfloat16), w, [128, 128], s)
    layer = weakref.ref(prepared.pop())
    storage = weakref.ref(w.untyped_storage())
    assert len(sel._memo.layers) == 1
    del w
    gc.collect()
    assert len(sel._memo.layers) == 0 and layer() is None and storage() is None


def test_bad_arguments_keep_their_typed_errors() -> None:
    sel = resolve(CPU, plugins=False)
    w, s = random_problem(N, K, seed=7)
    x = torch.randn(2, K, dtype=torch.bfloat16)
    with pytest.raises(InvalidDtypeError, match=r"weight: expected a torch\.Tensor, found list"):
        sel.linear(x, w.tolist(), [128, 128], s)  # type: ignore[arg-type]
    with pytest.raises(InvalidDtypeError, match=r"weight_scale: expected a torch\.Tensor, found list"):
        sel.linear(x, w, [128, 128], s.tolist())  # type: ignore[arg-type]
    with pytest.raises(InvalidDtypeError, match="block_size"):
        sel.linear(x, w, "128x128", s)  # type: ignore[arg-type]
    sel.linear(x, w, [128, 128], s)
    with pytest.raises(InvalidInputError, match="input"):
        sel.linear(torch.randn(2, K + 1, dtype=torch.bfloat16), w, [128, 128], s)  # the kept layer checks the call
    with pytest.raises(InvalidDtypeError, match="block_size"):
        sel.linear(x, w, torch.tensor([128, 128]), s)  # type: ignore[arg-type]


def test_copies_of_a_selection_keep_their_own_layers() -> None:
    from dataclasses import replace

    sel = resolve(CPU, plugins=False)
    w, s = random_problem(N, K, seed=8)
    sel.linear(torch.randn(2, K, dtype=torch.bfloat16), w, [128, 128], s)
    assert len(replace(sel, max_weight_copies=0)._memo.layers) == 0 and len(sel._memo.layers) == 1


def test_every_copy_of_a_selection_starts_with_no_layers() -> None:
    import copy
    import pickle

    sel = resolve(CPU, plugins=False)
    w, s = random_problem(N, K, seed=9)
    sel.linear(torch.randn(2, K, dtype=torch.bfloat16), w, [128, 128], s)
    for twin in (copy.copy(sel), copy.deepcopy(sel), pickle.loads(pickle.dumps(sel))):
        assert len(twin._memo.layers) == 0 and twin.to_dict() == sel.to_dict()
    assert len(sel._memo.layers) == 1


def test_inference_tensors_are_served_too(counted: tuple[Selection, list[Any]]) -> None:
    """Weights made under ``torch.inference_mode()`` (no version counter) are prepared once and served, in and out of it."""
    sel, prepared = counted
    with torch.inference_mode():
        w, s = random_problem(N, K, seed=10)
        w, s = w.clone(), s.clone()
        assert w.is_inference()
        x = torch.randn(3, K, dtype=torch.bfloat16)
        first = sel.linear(x, w, [128, 128], s)
        assert torch.equal(sel.linear(x, w, [128, 128], s), first)
    assert torch.equal(sel.linear(x, w, [128, 128], s), first)
    assert len(prepared) == 1
    assert rel_err(first, expected(x, w, s, (128, 128))) < 1e-2


def test_forget_prepared_serves_a_weight_written_through_data(counted: tuple[Selection, list[Any]]) -> None:
    """A write through ``.data`` leaves no trace (the version is ``.data``'s own); after ``forget_prepared()`` the next
    call prepares the weight again and computes with the new values."""
    sel, prepared = counted
    w, s = random_problem(N, K, seed=11)
    param, scale = torch.nn.Parameter(w.clone(), requires_grad=False), torch.nn.Parameter(s.clone(), requires_grad=False)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    sel.linear(x, param, [128, 128], scale)
    new_w, new_s = random_problem(N, K, seed=12)
    param.data.copy_(new_w)
    scale.data.copy_(new_s)
    sel.forget_prepared()
    assert len(sel._memo.layers) == 0
    assert rel_err(sel.linear(x, param, [128, 128], scale), expected(x, new_w, new_s, (128, 128))) < 1e-2
    assert len(prepared) == 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_drop_in_compiles_fullgraph_and_prepares_each_weight_once(counted: tuple[Selection, list[Any]],
                                                                      backend: str) -> None:
    """``sel.linear`` in a forward compiled with ``fullgraph=True`` (as engines compile theirs): one opaque node whose
    real implementation is the eager call, so each weight is still prepared once, at its first call."""
    sel, prepared = counted
    w, s = random_problem(N, K, seed=13)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(w, requires_grad=False)
            self.weight_scale_inv = torch.nn.Parameter(s, requires_grad=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sel.linear(x, self.weight, [128, 128], self.weight_scale_inv, out_dtype=torch.float32) * 2

    torch._dynamo.reset()
    model = Model()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    for m in (7, 33, 1):
        x = torch.randn(m, K, dtype=torch.bfloat16)
        out = compiled(x)
        assert out.dtype == torch.float32 and torch.equal(out, model(x))
    assert len(prepared) == 1
    assert rel_err(out / 2, expected(x, w, s, (128, 128))) < 1e-2
