"""The layer API through ``reference`` on CPU, against the independent fp64 reference."""

from __future__ import annotations

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err
from matrix import MATRIX
from threads import slowed, two_threads

from fp8select import InvalidDtypeError, InvalidInputError, UnsupportedProblemError, resolve

CPU = MATRIX["cpu-only"][0]


@pytest.fixture(scope="module")
def selection():  # type: ignore[no-untyped-def]
    return resolve(CPU, plugins=False)


@pytest.mark.parametrize("block", [(128, 128), (1, 128)])
@pytest.mark.parametrize("n, k", [(256, 384), (200, 320), (130, 136)])
@pytest.mark.parametrize("lead", [(1,), (5,), (2, 3), (2, 2, 3)])
def test_prepare_and_call_shapes(selection, block, n, k, lead) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(n, k, block, seed=n + k)
    layer = selection.prepare(w, s, block)
    x = torch.randn(*lead, k, dtype=torch.bfloat16)
    out = layer(x)
    assert out.shape == (*lead, n) and out.dtype == torch.bfloat16
    assert rel_err(out, expected(x, w, s, block)) < 1e-2


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16, torch.float32])
def test_activation_dtypes_and_bias(selection, act) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(256, 256, seed=3)
    bias = torch.randn(256, dtype=act)
    x = torch.randn(7, 256, dtype=act)
    out = selection.prepare(w, s)(x, bias=bias)
    assert out.dtype == act
    assert rel_err(out, expected(x, w, s, (128, 128), bias)) < 1e-2


def test_out_dtype_overrides(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(128, 256, seed=4)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    out = selection.prepare(w, s, out_dtype=torch.float32)(x)
    assert out.dtype == torch.float32
    assert rel_err(out, expected(x, w, s, (128, 128))) < 1e-2


def test_non_contiguous_input(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(256, 384, seed=5)
    base = torch.randn(384, 9, dtype=torch.bfloat16)
    x = base.t()  # [9, 384], strides (1, 9)
    assert not x.is_contiguous()
    out = selection.prepare(w, s)(x)
    assert rel_err(out, expected(x.contiguous(), w, s, (128, 128))) < 1e-2
    sliced = torch.randn(6, 800, dtype=torch.bfloat16)[:, 100:484]
    assert rel_err(selection.prepare(w, s)(sliced), expected(sliced.contiguous(), w, s, (128, 128))) < 1e-2


def test_empty_batch_returns_empty(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(256, 384, seed=6)
    out = selection.prepare(w, s)(torch.empty(0, 384, dtype=torch.bfloat16))
    assert out.shape == (0, 256) and out.dtype == torch.bfloat16
    assert selection.prepare(w, s)(torch.empty(2, 0, 384, dtype=torch.float16)).shape == (2, 0, 256)


def test_pre_quantized_input_needs_out_dtype(selection) -> None:  # type: ignore[no-untyped-def]
    from fp64_reference import quantize_groups

    w, s = random_problem(256, 384, seed=7)
    x = torch.randn(2, 5, 384)
    q, xs = quantize_groups(x.reshape(-1, 384))
    q, xs = q.reshape(2, 5, 384).contiguous(), xs.to(torch.float32).reshape(2, 5, 3)
    with pytest.raises(InvalidDtypeError, match="out_dtype"):
        selection.prepare(w, s)(q, input_scale=xs)
    layer = selection.prepare(w, s, out_dtype=torch.bfloat16)
    out = layer(q, input_scale=xs)
    assert out.shape == (2, 5, 256) and out.dtype == torch.bfloat16
    assert rel_err(out, expected(q, w, s, (128, 128), input_scale=xs)) < 1e-2
    with pytest.raises(InvalidInputError, match="input_scale"):
        layer(q)
    with pytest.raises(InvalidDtypeError, match="out_dtype"):
        selection.linear(q, w, [128, 128], s, input_scale=xs)
    out = selection.linear(q, w, [128, 128], s, input_scale=xs, out_dtype=torch.float16)
    assert out.dtype == torch.float16


def test_linear_drop_in_signature(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(256, 256, seed=8)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    bias = torch.randn(256, dtype=torch.bfloat16)
    out = selection.linear(x, w, [128, 128], s, None, bias)
    assert rel_err(out, expected(x, w, s, (128, 128), bias)) < 1e-2


def test_mxfp8_block_is_rejected_naming_supported(selection) -> None:  # type: ignore[no-untyped-def]
    w = torch.randn(64, 128).to(torch.float8_e4m3fn)
    s = torch.ones(64, 4)
    with pytest.raises(UnsupportedProblemError) as info:
        selection.prepare(w, s, [1, 32])
    assert isinstance(info.value, ValueError)
    assert "[128, 128]" in str(info.value) and "[1, 32]" in str(info.value)


def test_layer_reports_its_plan(selection) -> None:  # type: ignore[no-untyped-def]
    w, s = random_problem(256, 256, seed=9)
    layer = selection.prepare(w, s)
    assert layer.backends == ("reference",) and layer.backend_for(7).name == "reference"
    assert "reference" in repr(layer) and "rule" in layer.describe()


def test_triton_on_gfx942_converts_the_weight_to_fnuz_once() -> None:
    from fp8select.backends.triton import TritonBackend

    caps = MATRIX["mi300x"][0]
    w, s = random_problem(256, 384)
    pw = TritonBackend().prepare(w, s, (128, 128), caps)
    assert pw.weight.dtype == torch.float8_e4m3fnuz and pw.weight_nk is pw.weight
    assert torch.equal(pw.scale, s * 2) and torch.equal(pw.scale_nk, pw.scale)
    # same values: fnuz bits mean half, scales doubled
    from fp64_reference import dequant_weight

    assert torch.equal(dequant_weight(pw.weight, pw.scale, (128, 128)), dequant_weight(w, s, (128, 128)))
    assert TritonBackend().prepare(w, s, (128, 128), MATRIX["mi355x"][0]).weight is w


def test_backend_for_takes_a_number_of_rows(selection) -> None:  # type: ignore[no-untyped-def]
    layer = selection.prepare(*random_problem(128, 256, seed=11))
    assert layer.backend_for(0).name == layer.backend_for(1).name == "reference"
    for bad in (-3, -1, 2.0, True, "4"):
        with pytest.raises(InvalidInputError, match="m: expected a number of rows"):
            layer.backend_for(bad)


def test_a_prepared_layer_refuses_pickling_with_what_to_pickle_instead(selection) -> None:  # type: ignore[no-untyped-def]
    import copy
    import io
    import pickle

    from fp8select import NotPicklableError

    layer = selection.prepare(*random_problem(128, 256, seed=12))
    for dump in (pickle.dumps, lambda obj: torch.save(obj, io.BytesIO()), copy.deepcopy):
        with pytest.raises(NotPicklableError, match="BlockFp8Linear module") as info:
            dump(layer)
        assert isinstance(info.value, TypeError)
    twin = copy.copy(layer)  # a shallow copy shares the prepared weights and still runs
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    assert torch.equal(twin(x), layer(x))


def test_nn_is_an_attribute_of_the_package() -> None:
    import subprocess
    import sys

    code = ("import sys, fp8select; assert 'fp8select.nn' not in sys.modules; "
            "assert fp8select.nn.BlockFp8Linear.__name__ == 'BlockFp8Linear'; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_concurrent_first_calls_of_a_new_dtype_wait_for_its_plan(selection, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Two threads making a layer's first fp16 call: the second waits for the first's plan and its runs (it used to
    find the plan published before them: a bare KeyError)."""
    from fp8select.layer import Fp8Linear

    w, s = random_problem(128, 256, seed=13)
    layer = selection.prepare(w, s)
    monkeypatch.setattr(Fp8Linear, "_bind", slowed(Fp8Linear._bind))
    x = torch.randn(3, 256, dtype=torch.float16)
    outs, errors = two_threads(lambda: layer(x))
    assert errors == [] and len(outs) == 2 and torch.equal(outs[0], outs[1])
    assert rel_err(outs[0], expected(x, w, s, (128, 128))) < 1e-2
