"""fp8select.nn.BlockFp8Linear on CPU (reference backend): state dict, loading, moving, quantizing, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from fp64_reference import expected, rel_err
from matrix import MATRIX

from fp8select import InvalidDtypeError, InvalidInputError, resolve
from fp8select.errors import NotPreparedError
from fp8select.nn import BlockFp8Linear

CPU = MATRIX["cpu-only"][0]
H200 = MATRIX["h200-torch2.11"][0]
BLOCK = (128, 128)


@pytest.fixture(scope="module")
def selection():  # type: ignore[no-untyped-def]
    return resolve(CPU, plugins=False)


def _linear(k: int, n: int, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.normal_(0, 0.05)
    return linear


def _quantized(selection, k: int = 384, n: int = 256, bias: bool = True, seed: int = 0) -> BlockFp8Linear:  # type: ignore[no-untyped-def]
    return BlockFp8Linear.from_linear(_linear(k, n, bias, seed), selection=selection)


def test_parameters_and_state_dict_are_the_checkpoints(selection) -> None:  # type: ignore[no-untyped-def]
    module = BlockFp8Linear(300, 200, selection=selection)
    params = dict(module.named_parameters())
    assert set(module.state_dict()) == set(params) == {"weight", "weight_scale_inv", "bias"}
    assert params["weight"].dtype == torch.float8_e4m3fn and params["weight"].shape == (200, 300)
    assert params["weight_scale_inv"].dtype == torch.float32 and params["weight_scale_inv"].shape == (2, 3)
    assert not any(p.requires_grad for p in params.values())
    assert set(BlockFp8Linear(256, 128, bias=False, block_size=(1, 128)).state_dict()) == {"weight", "weight_scale_inv"}
    assert BlockFp8Linear(256, 128, bias=False, block_size=(1, 128)).weight_scale_inv.shape == (128, 2)


def test_forward_before_weights_raises_a_typed_error(selection) -> None:  # type: ignore[no-untyped-def]
    module = BlockFp8Linear(256, 128, selection=selection)
    assert module.backend is None and "not prepared" in repr(module)
    with pytest.raises(NotPreparedError, match="no weights loaded") as info:
        module(torch.randn(2, 256, dtype=torch.bfloat16))
    assert isinstance(info.value, RuntimeError)


def test_from_linear_matches_the_fp64_reference_and_the_original(selection) -> None:  # type: ignore[no-untyped-def]
    linear = _linear(384, 256, seed=1)
    module = BlockFp8Linear.from_linear(linear, selection=selection)
    assert module.backend == "any M: reference" and "plan='any M: reference'" in repr(module)
    x = torch.randn(3, 5, 384, dtype=torch.bfloat16)
    out = module(x)
    assert out.shape == (3, 5, 256) and out.dtype == torch.bfloat16
    ref = expected(x, module.weight, module.weight_scale_inv, BLOCK, module.bias)
    assert rel_err(out, ref) < 1e-2
    # Against the unquantized layer: e4m3 rounding of the weight and of the activation each
    # cost about 2.5% RMS of an element (3 mantissa bits), independently, hence ~3.5% here.
    original = x.double() @ linear.weight.detach().double().t() + linear.bias.detach().double()
    assert rel_err(out, original) < 6e-2
    assert torch.equal(linear.weight, _linear(384, 256, seed=1).weight)  # left unchanged


def test_state_dict_round_trip(selection) -> None:  # type: ignore[no-untyped-def]
    source = _quantized(selection, seed=2)
    state = source.state_dict()
    target = BlockFp8Linear(384, 256, selection=selection)
    target.load_state_dict(state)
    assert target.backend == "any M: reference"
    x = torch.randn(7, 384, dtype=torch.bfloat16)
    assert torch.equal(target(x), source(x))
    assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), state.values(), strict=True))


def test_loading_new_values_in_place_prepares_again(selection) -> None:  # type: ignore[no-untyped-def]
    module = _quantized(selection, seed=2)
    layer, weight_storage = module._layer, module.weight.data_ptr()
    other = _quantized(selection, seed=9)
    module.load_state_dict(other.state_dict())  # copied into the same storage
    assert module.weight.data_ptr() == weight_storage and module._layer is not layer
    x = torch.randn(3, 384, dtype=torch.bfloat16)
    assert torch.equal(module(x), other(x))


def test_meta_construction_then_assign_load(selection) -> None:  # type: ignore[no-untyped-def]
    source = _quantized(selection, seed=3)
    with torch.device("meta"):
        target = BlockFp8Linear(384, 256, selection=selection)
    assert target.weight.is_meta and target.backend is None
    target.load_state_dict(source.state_dict(), assign=True)
    assert not target.weight.is_meta and target.weight.dtype == torch.float8_e4m3fn
    assert isinstance(target.weight, torch.nn.Parameter) and not target.weight.requires_grad
    x = torch.randn(4, 384, dtype=torch.bfloat16)
    assert torch.equal(target(x), source(x))


def test_loading_into_meta_without_assign_stays_unprepared(selection) -> None:  # type: ignore[no-untyped-def]
    source = _quantized(selection, seed=3)
    target = BlockFp8Linear(384, 256, selection=selection, device="meta")
    with pytest.warns(UserWarning, match="meta"):
        target.load_state_dict(source.state_dict())  # torch: a no-op into meta parameters
    with pytest.raises(NotPreparedError):
        target(torch.randn(1, 384, dtype=torch.bfloat16))


def test_to_meta_then_to_empty_then_load_reprepares(selection) -> None:  # type: ignore[no-untyped-def]
    module = _quantized(selection, seed=4)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    x = torch.randn(2, 384, dtype=torch.bfloat16)
    before = module(x)
    module.to("meta")
    assert module.backend is None
    module.to_empty(device="cpu")
    assert module.backend is None  # uninitialised memory is not a checkpoint
    module.load_state_dict(state)
    assert torch.equal(module(x), before)


def test_moving_the_storage_reprepares_and_dtype_casts_keep_the_weights(selection) -> None:  # type: ignore[no-untyped-def]
    module = _quantized(selection, seed=5)
    x = torch.randn(3, 384, dtype=torch.bfloat16)
    before, layer = module(x), module._layer
    module._apply(lambda t: t.clone())  # what .to(other_device) does to each tensor
    assert module._layer is not layer and torch.equal(module(x), before)
    layer = module._layer
    weight, scale = module.weight.clone(), module.weight_scale_inv.clone()
    for cast in (lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.float(), lambda m: m.double()):
        cast(module)
        assert module.weight.dtype == torch.float8_e4m3fn and module.weight_scale_inv.dtype == torch.float32
        assert torch.equal(module.weight.float(), weight.float()) and torch.equal(module.weight_scale_inv, scale)
    assert module.bias is not None and module.bias.dtype == torch.float64
    assert module._layer is layer  # the weights did not move: nothing to prepare again
    assert rel_err(module(x), before) < 1e-2


def test_weights_on_another_device_than_the_selection_wait_for_to() -> None:
    gpu_selection = resolve(H200, plugins=False)
    module = BlockFp8Linear.from_linear(_linear(256, 128), selection=gpu_selection)
    assert module.backend is None
    with pytest.raises(NotPreparedError, match=r"weights are on cpu but the selection .* runs on cuda; move the module"):
        module(torch.randn(1, 256, dtype=torch.bfloat16))
    with pytest.raises(NotPreparedError, match="cannot prepare"):
        module.prepare()


def test_deepcopy_prepares_its_own_layer(selection) -> None:  # type: ignore[no-untyped-def]
    module = _quantized(selection, seed=6)
    clone = copy.deepcopy(module)
    assert clone._layer is not None and clone._layer is not module._layer
    x = torch.randn(2, 384, dtype=torch.bfloat16)
    assert torch.equal(clone(x), module(x))


def test_prepare_after_writing_weights_in_place(selection) -> None:  # type: ignore[no-untyped-def]
    source = _quantized(selection, seed=7)
    module = BlockFp8Linear(384, 256, selection=selection)
    with torch.no_grad():
        for name, value in source.state_dict().items():
            getattr(module, name).copy_(value)
    module.prepare()
    x = torch.randn(2, 384, dtype=torch.bfloat16)
    assert torch.equal(module(x), source(x))


def test_selection_is_resolved_lazily_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fp8select.resolver

    calls = []

    def fake_resolve():  # type: ignore[no-untyped-def]
        calls.append(1)
        return resolve(CPU, plugins=False)

    monkeypatch.setattr(fp8select.resolver, "resolve", fake_resolve)
    module = BlockFp8Linear(256, 128)
    assert module.selection is None and not calls
    source = BlockFp8Linear.from_linear(_linear(256, 128), selection=resolve(CPU, plugins=False))
    module.load_state_dict(source.state_dict())
    module.prepare()
    module.load_state_dict(source.state_dict())
    assert len(calls) == 1 and module.backend == "any M: reference"


def test_bad_checkpoint_fails_at_load(selection) -> None:  # type: ignore[no-untyped-def]
    state = _quantized(selection, seed=8).state_dict()
    state["weight_scale_inv"] = state["weight_scale_inv"].clone()
    state["weight_scale_inv"][0, 0] = float("nan")
    with pytest.raises(InvalidInputError, match="weight_scale: expected finite values"):
        BlockFp8Linear(384, 256, selection=selection).load_state_dict(state)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"in_features": 0}, InvalidInputError, "in_features: expected a positive int"),
    ({"out_features": 2.0}, InvalidDtypeError, "out_features: expected a positive int"),
    ({"block_size": (128,)}, InvalidDtypeError, "block_size"),
    ({"out_dtype": torch.int8}, InvalidDtypeError, "out_dtype"),
    ({"selection": "reference"}, InvalidDtypeError, "selection: expected an fp8select.Selection"),
])
def test_bad_arguments(kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    args = {"in_features": 256, "out_features": 128, **kwargs}
    with pytest.raises(error, match=match):
        BlockFp8Linear(args.pop("in_features"), args.pop("out_features"), **args)


def test_from_weights_checks_the_checkpoint_at_once() -> None:
    gpu_selection = resolve(H200, plugins=False)  # preparing would wait for .to("cuda"); the checks do not
    w = torch.ones(256, 384).to(torch.float8_e4m3fn)
    with pytest.raises(InvalidInputError, match=r"weight_scale: expected shape"):
        BlockFp8Linear.from_weights(w, torch.ones(2, 2), selection=gpu_selection)
    with pytest.raises(InvalidDtypeError, match="weight: expected dtype"):
        BlockFp8Linear.from_weights(w.float(), torch.ones(2, 3), selection=gpu_selection)


def test_from_linear_rejects_what_is_not_a_linear(selection) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidDtypeError, match=r"linear: expected a torch\.nn\.Linear"):
        BlockFp8Linear.from_linear(torch.nn.Conv1d(2, 2, 1), selection=selection)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="meta"):
        BlockFp8Linear.from_linear(torch.nn.Linear(256, 128, device="meta"), selection=selection)


def test_loading_an_unquantized_weight_is_a_typed_error(selection) -> None:  # type: ignore[no-untyped-def]
    """A bf16 ``weight`` in the state dict raises (copy_ cast it to fp8 unscaled: every output wrong), assign or not."""
    source = _quantized(selection, bias=False)
    bf16 = source.weight.float().bfloat16()
    for assign in (False, True):
        module = BlockFp8Linear(384, 256, bias=False, selection=selection, device="meta" if assign else None)
        with pytest.raises(InvalidDtypeError, match="weight: expected dtype float8_e4m3fn"):
            module.load_state_dict({"weight": bf16, "weight_scale_inv": source.weight_scale_inv}, assign=assign)


def test_replaced_weights_are_never_run_stale(selection) -> None:  # type: ignore[no-untyped-def]
    """Parameters replaced after loading (as engines' post-load processing does): unprepared until prepare(), which then
    runs the new weights."""
    module, other = _quantized(selection, bias=False, seed=1), _quantized(selection, bias=False, seed=2)
    x = torch.randn(3, 384, dtype=torch.bfloat16)
    module(x)
    module.weight = torch.nn.Parameter(other.weight.detach(), requires_grad=False)
    module.weight_scale_inv = torch.nn.Parameter(other.weight_scale_inv.detach(), requires_grad=False)
    with pytest.raises(NotPreparedError, match="call prepare"):
        module(x)
    module.prepare()
    assert torch.equal(module(x), other(x))
