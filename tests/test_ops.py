"""fp8select.ops: the custom op, its fake, and the registry of live layers (eager, no compilation)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err
from matrix import MATRIX

from fp8select import InvalidInputError, ops, resolve

CPU = MATRIX["cpu-only"][0]


@pytest.fixture(scope="module")
def selection():  # type: ignore[no-untyped-def]
    return resolve(CPU, plugins=False)


def test_importing_fp8select_registers_no_op() -> None:
    code = ("import torch, fp8select\n"
            "assert not hasattr(torch.ops.fp8select, 'linear')\n"
            "from fp8select import ops\n"
            "assert not hasattr(torch.ops.fp8select, 'linear')\n"
            "sel = fp8select.resolve(fp8select.Capabilities(torch_version='2.13.0', float8_dtypes=('float8_e4m3fn',)), plugins=False)\n"
            "sel.prepare(torch.ones(128, 128).to(torch.float8_e4m3fn), torch.ones(1, 1))\n"
            "assert hasattr(torch.ops.fp8select, 'linear')\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_op_runs_the_layer_and_matches_eager(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(256, 384, seed=1)
    layer = selection.prepare(w, s)
    handle = ops.register(layer)
    assert ops.register(layer) == handle  # idempotent
    x = torch.randn(2, 3, 384, dtype=torch.bfloat16)
    bias = torch.randn(256, dtype=torch.bfloat16)
    out = torch.ops.fp8select.linear(x, bias, None, handle, 256, ops.OUT_DTYPES.index(torch.bfloat16))
    assert out.shape == (2, 3, 256) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert torch.equal(out, layer(x, bias))
    assert rel_err(out, expected(x, w, s, (128, 128), bias)) < 1e-2


def test_fake_gives_shape_and_dtype_without_running(selection) -> None:  # type: ignore[no-untyped-def]
    from torch._subclasses.fake_tensor import FakeTensorMode

    w, s = random_problem(128, 256, seed=2)
    layer = selection.prepare(w, s, out_dtype=torch.float32)
    with FakeTensorMode():
        x = torch.empty(4, 5, 256, dtype=torch.bfloat16)
        out = torch.ops.fp8select.linear(x, None, None, ops.register(layer), 128, ops.OUT_DTYPES.index(torch.float32))
        assert out.shape == (4, 5, 128) and out.dtype == torch.float32


def test_registry_holds_layers_weakly_and_rejects_stale_handles(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(128, 128, seed=3)
    layer = selection.prepare(w, s)
    handle = ops.register(layer)
    before = ops.live_layers()
    del layer
    gc.collect()
    assert ops.live_layers() == before - 1
    with pytest.raises(InvalidInputError, match="freed"):
        torch.ops.fp8select.linear(torch.randn(1, 128, dtype=torch.bfloat16), None, None, handle, 128, ops.OUT_DTYPES.index(torch.bfloat16))


def test_handles_are_unique_and_a_copy_gets_its_own(selection) -> None:  # type: ignore[no-untyped-def]
    import copy

    w, s = random_problem(128, 128, seed=4)
    a, b = selection.prepare(w, s), selection.prepare(w, s)
    assert ops.register(a) != ops.register(b)
    c = copy.copy(a)  # carries a's handle attribute
    assert ops.register(c) not in (ops.register(a), ops.register(b))


def test_outputs_never_require_grad(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(128, 256, seed=5)
    layer = selection.prepare(w, s)
    x = torch.randn(3, 256, requires_grad=True)
    bias = torch.randn(128, requires_grad=True)
    out = layer(x, bias)
    assert not out.requires_grad
    assert rel_err(out, expected(x, w, s, (128, 128), bias)) < 1e-2
