"""The MoE experts layer on CPU: its semantics against the fp64 reference, typed errors, compile.

Numbers come from the ``reference`` backend (pure torch) and are compared with
``tests/fp64_moe_reference.py``, written from the semantics independently of the library. The
Triton kernels have their own module (``tests/test_moe_triton.py``), DeepGEMM's adapter
``tests/test_moe_deepgemm.py``, the plans ``tests/test_moe_plan.py``.
"""

from __future__ import annotations

import contextlib
import pickle
import re

import pytest
import torch
from fp64_moe_reference import expected_moe, random_moe, random_routing, rel_err
from matrix import MATRIX
from structlog.testing import capture_logs
from threads import slowed, two_threads

from fp8select import InvalidDtypeError, InvalidInputError, NotPicklableError, NotPreparedError, UnsupportedProblemError, resolve
from fp8select.backends.moe import ReferenceMoe
from fp8select.kernels.moe_routing import block_capacity, masked_rows, route, row_of_slot
from fp8select.nn import BlockFp8MoE

CPU = MATRIX["cpu-only"][0]
E, H, INTER, K = 4, 256, 128, 2
TOL = 1e-2


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(E, H, INTER, seed=0)


@pytest.fixture(scope="module")
def moe(problem):  # type: ignore[no-untyped-def]
    return resolve(CPU, plugins=False).prepare_moe(*problem.weights(), top_k=K)


def _x(m: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(m, H, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _check(moe, problem, x, w, ids) -> torch.Tensor:  # type: ignore[no-untyped-def]
    y = moe(x, w, ids)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < TOL
    return y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_matches_the_fp64_semantics(moe, problem, dtype) -> None:  # type: ignore[no-untyped-def]
    w, ids = random_routing(9, K, E, seed=1)
    _check(moe, problem, _x(9, dtype=dtype), w, ids)


def test_minus_one_ids_contribute_nothing_and_all_minus_one_gives_zeros(moe, problem) -> None:  # type: ignore[no-untyped-def]
    w, ids = random_routing(6, K, E, seed=2)
    ids[0, 1], ids[3, 0] = -1, -1
    x = _x(6)
    y = _check(moe, problem, x, w, ids)
    assert torch.equal(moe(x[:1], w[:1, :1].contiguous(), ids[:1, :1].contiguous()), y[:1])  # the -1 slot adds nothing
    assert torch.equal(moe(x, w, torch.full_like(ids, -1)), torch.zeros_like(x))


def test_skewed_routing_one_expert_and_idle_experts(moe, problem) -> None:  # type: ignore[no-untyped-def]
    w, _ = random_routing(7, 1, E, seed=3)
    _check(moe, problem, _x(7), w, torch.full((7, 1), 2, dtype=torch.int32))  # every token on expert 2, three idle
    w, ids = random_routing(7, K, E, seed=4, skew=True)
    _check(moe, problem, _x(7), w, ids.to(torch.int64))


def test_empty_batch(moe) -> None:  # type: ignore[no-untyped-def]
    y = moe(_x(0), torch.empty(0, K), torch.empty(0, K, dtype=torch.int32))
    assert y.shape == (0, H) and y.dtype == torch.bfloat16


def test_nan_in_a_token_makes_its_row_nan_only(moe, problem) -> None:  # type: ignore[no-untyped-def]
    w, ids = random_routing(4, K, E, seed=5)
    x = _x(4)
    x[2, 7] = float("nan")
    y = moe(x, w, ids)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()


BAD_CALLS = {
    "moe-id-out-of-range": (lambda w, ids: (w, ids.masked_fill(ids == ids[0, 0], E)), InvalidInputError, "topk_ids"),
    "moe-id-below-minus-one": (lambda w, ids: (w, ids.masked_fill(ids == ids[0, 0], -2)), InvalidInputError, "[-2"),
    "moe-id-repeated": (lambda w, ids: (w, ids[:, :1].repeat(1, K)), InvalidInputError, "distinct"),
    "moe-ids-float": (lambda w, ids: (w, ids.float()), InvalidDtypeError, "int32/int64"),
    "moe-weights-shape": (lambda w, ids: (w[:, :1], ids), InvalidInputError, "topk_weights"),
    "moe-weights-int": (lambda w, ids: (ids, ids), InvalidDtypeError, "topk_weights"),
    "moe-ids-rows": (lambda w, ids: (w[:2], ids[:2]), InvalidInputError, "[M=3"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_routing_is_a_typed_error(moe, case: str) -> None:  # type: ignore[no-untyped-def]
    change, error, fragment = BAD_CALLS[case]
    w, ids = random_routing(3, K, E, seed=6)
    w, ids = change(w, ids)
    with pytest.raises(error, match=None) as info:
        moe(_x(3), w, ids)
    assert fragment in str(info.value)


def test_bad_ids_at_a_new_top_k_raise_before_it_is_planned(problem) -> None:  # type: ignore[no-untyped-def]
    moe = resolve(CPU, plugins=False).prepare_moe(*problem.weights(), top_k=K)
    w, ids = random_routing(3, 3, E, seed=8)
    with pytest.raises(InvalidInputError, match="topk_ids"):
        moe(_x(3), w, ids.masked_fill(ids == ids[0, 0], E))
    assert (torch.bfloat16, 3) not in moe.plans  # nothing planned for a bad call
    assert rel_err(moe(_x(3), w, ids), expected_moe(_x(3), *problem.weights(), w, ids)) < TOL
    assert (torch.bfloat16, 3) in moe.plans


def test_bad_activation_is_a_typed_error(moe) -> None:  # type: ignore[no-untyped-def]
    w, ids = random_routing(3, K, E, seed=6)
    with pytest.raises(InvalidDtypeError, match="x: expected dtype"):
        moe(_x(3).to(torch.int8), w, ids)
    with pytest.raises(InvalidInputError, match=r"x: expected shape \[M, H=256\]"):
        moe(torch.randn(3, 128), w, ids)
    with pytest.raises(InvalidInputError, match="expected device cpu"):
        moe(_x(3).to("meta"), w, ids)
    with pytest.raises(InvalidDtypeError, match=r"x: expected a torch\.Tensor"):
        moe([[1.0]], w, ids)


def test_unchecked_ids_outside_the_experts_contribute_nothing(problem) -> None:  # type: ignore[no-untyped-def]
    moe = resolve(CPU, plugins=False).prepare_moe(*problem.weights(), top_k=K, check_ids=False)
    w, ids = random_routing(3, K, E, seed=7)
    y = moe(_x(3), w, ids.masked_fill(ids == ids[0, 0], 99))
    assert rel_err(y, expected_moe(_x(3), *problem.weights(), w, ids.masked_fill(ids == ids[0, 0], -1))) < TOL


def _weights(problem):  # type: ignore[no-untyped-def]
    return list(problem.weights())


BAD_WEIGHTS = {
    "moe-w13-bf16": (0, lambda t: t.to(torch.bfloat16), InvalidDtypeError, "w13: expected dtype float8_e4m3fn"),
    "moe-w13-2d": (0, lambda t: t[0], InvalidInputError, "w13: expected a 3-D"),
    "moe-w2-shape": (2, lambda t: t[:, :, :64], InvalidInputError, "w2: expected shape [E, H, I]"),
    "moe-scale-shape": (1, lambda t: t[:, :1], InvalidInputError, "w13_scale: expected shape"),
    "moe-scale-dtype": (3, lambda t: t.double(), InvalidDtypeError, "w2_scale: expected dtype float32"),
    "moe-scale-nan": (3, lambda t: t.clone().fill_(float("nan")), InvalidInputError, "w2_scale: expected finite"),
    "moe-weight-meta": (2, lambda t: t.to("meta"), InvalidInputError, "w2: expected a tensor holding data"),
}


@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
def test_bad_checkpoint_is_a_typed_error(problem, case: str) -> None:  # type: ignore[no-untyped-def]
    index, change, error, fragment = BAD_WEIGHTS[case]
    tensors = _weights(problem)
    tensors[index] = change(tensors[index])
    with pytest.raises(error) as info:
        resolve(CPU, plugins=False).prepare_moe(*tensors)
    assert fragment in str(info.value)


def test_bad_block_and_top_k(problem) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInputError, match="block_size"):
        resolve(CPU, plugins=False).prepare_moe(*problem.weights(), block_size=(0, 128))
    with pytest.raises(InvalidInputError, match="top_k"):
        resolve(CPU, plugins=False).prepare_moe(*problem.weights(), top_k=0)


def test_routing_blocks_are_sorted_padded_and_static() -> None:
    ids = torch.tensor([[2, 0], [2, -1], [7, 2]], dtype=torch.int32)  # 7: outside E=3, routed nowhere
    r = route(ids, 3, 4)
    assert r.rows == block_capacity(6, 3, 4) * 4
    assert r.counts.tolist() == [1, 0, 3]
    used = r.block_expert[r.block_expert >= 0].tolist()
    assert used == [0, 2]
    rows = r.slot_ids.view(-1, 4)
    assert rows[0].tolist() == [1, 6, 6, 6] and rows[1].tolist() == [0, 2, 5, 6]  # slots in order, padded with M*k
    assert (r.block_expert[2:] == -1).all() and (r.slot_ids[8:] == 6).all()
    where = row_of_slot(r)
    assert [int(where[s]) for s in (0, 1, 2, 5)] == [4, 0, 5, 6]
    assert masked_rows(r, 3, 2).tolist() == [4, 0, 5, 6, 6, 6]  # expert 2's third slot is beyond max_m 2


def test_module_loads_a_state_dict_and_compiles(problem) -> None:  # type: ignore[no-untyped-def]
    sel = resolve(CPU, plugins=False)
    module = BlockFp8MoE(E, H, INTER, selection=sel, device="meta")
    w13, s13, w2, s2 = problem.weights()
    module.load_state_dict({"w13_weight": w13, "w13_weight_scale_inv": s13, "w2_weight": w2,
                            "w2_weight_scale_inv": s2}, assign=True)
    w, ids = random_routing(5, K, E, seed=8)
    y = module(_x(5), w, ids)
    assert rel_err(y, expected_moe(_x(5), *problem.weights(), w, ids)) < TOL
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, ids: module(x, w, ids) * 2, fullgraph=True, dynamic=True)
    for m in (5, 9):
        w, ids = random_routing(m, K, E, seed=m)
        assert torch.equal(compiled(_x(m), w, ids), module(_x(m), w, ids) * 2)


def _state(problem) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return dict(zip(("w13_weight", "w13_weight_scale_inv", "w2_weight", "w2_weight_scale_inv"), problem.weights(), strict=True))


def test_module_refuses_an_unquantized_checkpoint(problem) -> None:  # type: ignore[no-untyped-def]
    """A bf16 expert weight in the state dict raises (copy_ cast it to fp8 unscaled: every output wrong, unsaid)."""
    for name in ("w13_weight", "w2_weight"):
        state = _state(problem)
        state[name] = state[name].float().bfloat16()
        with pytest.raises(InvalidDtypeError, match=f"{name}: expected dtype float8_e4m3fn"):
            BlockFp8MoE(E, H, INTER, selection=resolve(CPU, plugins=False)).load_state_dict(state)


def test_module_never_runs_replaced_weights_stale(problem) -> None:  # type: ignore[no-untyped-def]
    """Weights replaced by assignment leave it unprepared until prepare(); a partial reload prepares it again."""
    other = random_moe(E, H, INTER, seed=5)
    w, ids = random_routing(5, K, E, seed=3)
    want = expected_moe(_x(5), *problem.weights()[:2], *other.weights()[2:], w, ids)
    module = BlockFp8MoE(E, H, INTER, selection=resolve(CPU, plugins=False))
    module.load_state_dict(_state(problem))
    module.w2_weight = torch.nn.Parameter(other.weights()[2], requires_grad=False)
    module.w2_weight_scale_inv = torch.nn.Parameter(other.weights()[3], requires_grad=False)
    with pytest.raises(NotPreparedError, match="not prepared"):
        module(_x(5), w, ids)
    module.prepare()
    assert rel_err(module(_x(5), w, ids), want) < TOL
    reloaded = BlockFp8MoE(E, H, INTER, selection=resolve(CPU, plugins=False))
    reloaded.load_state_dict(_state(problem))
    reloaded.load_state_dict({"w2_weight": other.weights()[2].clone(), "w2_weight_scale_inv": other.weights()[3].clone()},
                             strict=False, assign=True)
    assert torch.equal(reloaded(_x(5), w, ids), module(_x(5), w, ids))


def test_module_materializes_from_meta_and_deep_copies(problem) -> None:  # type: ignore[no-untyped-def]
    """``to_empty`` from the meta device (unprepared, then loaded), and deepcopy / torch.save of a prepared module."""
    import copy
    import io

    module = BlockFp8MoE(E, H, INTER, selection=resolve(CPU, plugins=False), device="meta")
    module.to_empty(device="cpu")
    with pytest.raises(NotPreparedError):
        module(_x(2), *random_routing(2, K, E, seed=1))
    module.load_state_dict(_state(problem))
    w, ids = random_routing(4, K, E, seed=6)
    y = module(_x(4), w, ids)
    saved = io.BytesIO()
    torch.save(module, saved)  # (pickle itself cannot dump fp8 tensors in torch 2.13; torch.save can)
    saved.seek(0)
    for twin in (copy.deepcopy(module), torch.load(saved, weights_only=False)):
        assert twin.fp8_moe is not module.fp8_moe and torch.equal(twin(_x(4), w, ids), y)


def test_a_failed_load_prepares_nothing(problem) -> None:  # type: ignore[no-untyped-def]
    """A state dict with a mismatched shape: torch's size-mismatch error, not one from preparing uncopied memory."""
    state = _state(problem)
    state["w2_weight_scale_inv"] = state["w2_weight_scale_inv"][:, :, :0]
    module = BlockFp8MoE(E, H, INTER, selection=resolve(CPU, plugins=False))
    with torch.no_grad():
        module.w2_weight_scale_inv.fill_(float("nan"))  # uncopied memory, as a GPU allocator may hand out
    with pytest.raises(RuntimeError, match="size mismatch"):
        module.load_state_dict(state)
    assert module.fp8_moe is None


def test_warmup_runs_each_distinct_moe_layer_at_every_route_once(problem, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from fp8select.moe import Fp8MoE
    from fp8select.warmup import warmup

    sel = resolve(CPU, plugins=False)
    twins = [sel.prepare_moe(*problem.weights(), top_k=K) for _ in range(2)]
    module = BlockFp8MoE(E, H, INTER, selection=sel, top_k=K, device="meta")
    w13, s13, w2, s2 = problem.weights()
    module.load_state_dict({"w13_weight": w13, "w13_weight_scale_inv": s13, "w2_weight": w2,
                            "w2_weight_scale_inv": s2}, assign=True)
    ran: list[tuple[int, int, bool]] = []
    real = Fp8MoE.forward

    def spy(self, x, weights, ids):  # type: ignore[no-untyped-def]
        distinct = all(len(set(row)) == K for row in ids.tolist())
        ran.append((id(self), x.shape[0], distinct and tuple(ids.shape) == (x.shape[0], K)))
        return real(self, x, weights, ids) if x.shape[0] <= 64 else x

    monkeypatch.setattr(Fp8MoE, "forward", spy)
    report = warmup([*twins, twins[1]], ms=[1, 3, 64])
    assert (report.layers, report.distinct, report.calls) == (3, 1, 3)
    assert [(m, ok) for _, m, ok in ran] == [(1, True), (3, True), (64, True)]
    ran.clear()
    report = warmup(torch.nn.Sequential(module))  # a module holding a BlockFp8MoE: both ends of every bucket
    assert report.layers == 1 and {m for _, m, _ in ran} == {1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129,
                                                            256, 257, 512, 513, 1024, 1025, 2048, 2049, 4096,
                                                            4097, 8192}
    with pytest.raises(InvalidInputError, match="H=256"):
        warmup(twins[0], ms=[10**13])


def test_the_fast_path_and_the_checked_path_agree(moe, problem) -> None:  # type: ignore[no-untyped-def]
    w, ids = random_routing(6, K, E, seed=9)
    x = _x(6)
    y = moe(x, w, ids)
    strided = torch.empty(H, 6, dtype=x.dtype).t().copy_(x)  # not contiguous: the checked path
    assert not strided.is_contiguous() and torch.equal(moe(strided, w, ids), y)
    wanting = x.clone().requires_grad_()
    out = moe(wanting, w, ids)
    assert out.grad_fn is None and torch.equal(out, y)
    with pytest.raises(InvalidInputError, match=r"found \[4, 4, 4, 4\]"):  # k = 1: the range check alone
        moe(x, w[:, :1].contiguous(), torch.full((6, 1), E, dtype=torch.int32))
    assert torch.equal(moe(x[:1], w[:1, :1].contiguous(), torch.full((1, 1), -1)), torch.zeros_like(x[:1]))


def test_plain_inputs_of_a_planned_dtype_and_k_take_the_bound_launch_and_anything_else_the_checked_path(
        problem, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The fast path is a speed path: what it takes is counted here, each way out of it one at a time."""
    moe = resolve(CPU, plugins=False).prepare_moe(*problem.weights(), top_k=K)
    checked: list[int] = []
    real = type(moe)._checked_forward
    monkeypatch.setattr(type(moe), "_checked_forward", lambda self, x, w, ids: checked.append(1) or real(self, x, w, ids))
    w, ids = random_routing(6, K, E, seed=10)
    x = _x(6)
    y = moe(x, w, ids)
    half = w.half()  # fp16 weights: read as their values
    assert checked == [] and torch.equal(moe(x, w, ids.long()), y) and torch.equal(moe(x, half, ids), moe(x, half.float(), ids))
    assert checked == []
    ways_out = {
        "x a subclass": (x.as_subclass(torch.nn.Parameter), w, ids), "ids a subclass": (x, w, ids.as_subclass(_Sub)),
        "weights a subclass": (x, w.as_subclass(_Sub), ids), "weights wanting grad": (x, w.clone().requires_grad_(), ids),
        "ids strided": (x, w, torch.empty(K, 6, dtype=ids.dtype).t().copy_(ids)),
        "weights strided": (x, torch.empty(K, 6).t().copy_(w), ids),
        "x 3-D": (x[None], w, ids), "ids 3-D": (x, w, ids[None]), "ids of other rows": (x[:5], w, ids),
        "weights of another shape": (x, w[:, :1].contiguous(), ids),
        "a top-k not planned": (x, w[:, :1].contiguous(), ids[:, :1].contiguous()),
    }
    for name, args in ways_out.items():
        checked.clear()
        with contextlib.suppress(InvalidInputError):
            moe(*args)
        assert checked == [1], name


class _Sub(torch.Tensor):
    pass


class _Named(ReferenceMoe):
    """The reference under another name, each bound launch saying which bucket it serves."""

    def __init__(self, name: str, ran: list[tuple[str, int]], fail: bool = False) -> None:
        self.name, self.ran, self.fail = name, ran, fail  # type: ignore[misc]

    def prepare(self, weights, caps):  # type: ignore[no-untyped-def]
        if self.fail:
            raise RuntimeError("no memory")
        return super().prepare(weights, caps)

    def bind(self, prepared, layout, config, caps):  # type: ignore[no-untyped-def]
        launch = super().bind(prepared, layout, config, caps)
        self.ran.append((self.name, -1))
        assert (layout, caps) == ("sorted", CPU)

        def run(x, w, ids):  # type: ignore[no-untyped-def]
            self.ran.append((self.name, x.shape[0]))
            return launch(x, w, ids)

        return run


def test_a_call_runs_its_buckets_route_and_a_batch_past_the_last_bucket_the_last_route(problem) -> None:  # type: ignore[no-untyped-def]
    from fp8select.moe import Fp8MoE

    ran: list[tuple[str, int]] = []
    rows = {"small/sorted": {1: {"us": 1.0}}, "large/sorted": {b: {"us": 1.0} for b in (2, 8192)}}
    moe = Fp8MoE([_Named("large", ran), _Named("small", ran)], CPU, *problem.weights(), top_k=K, measured=rows)
    assert moe.main_plan.summary() == "M 1: small/sorted, M >= 2: large/sorted"
    assert moe.plans[(torch.bfloat16, K)] is moe.main_plan and moe._plan_for(torch.bfloat16, K) is moe.main_plan
    for m in (1, 2, 8192, 8193):
        ran.clear()
        w, ids = random_routing(m, K, E, seed=m)
        moe(_x(m), w, ids)  # the bound launch
        strided = torch.empty(m, 2 * H, dtype=torch.bfloat16)[:, ::2]
        moe(strided.copy_(_x(m)), w, ids)  # not contiguous: the checked path, the same route
        assert ran == [("small" if m == 1 else "large", m)] * 2, m


def test_a_backend_whose_prepare_fails_gives_its_buckets_to_the_next_and_is_named_when_none_is_left(problem) -> None:  # type: ignore[no-untyped-def]
    from fp8select.moe import Fp8MoE

    ran: list[tuple[str, int]] = []
    with capture_logs() as logs:
        moe = Fp8MoE([_Named("broken", ran, fail=True), _Named("spare", ran)], CPU, *problem.weights(), top_k=K)
    assert moe.backends == ("spare",) and moe.main_plan.summary() == "any M: spare/sorted" and "broken" not in moe.prepared
    assert moe.main_plan.candidates[-1].name == "broken" and not moe.main_plan.candidates[-1].accepted
    assert "not for this layer: broken: prepare() raised RuntimeError: no memory" in moe.describe()
    failed, prepared = logs
    assert failed == {"event": "fp8select.moe_prepare_failed", "log_level": "warning", "backend": "broken",
                      "error": "RuntimeError: no memory"}
    assert prepared.pop("ms") >= 0 and prepared == {
        "event": "fp8select.moe_prepared", "log_level": "info", "experts": E, "hidden": H, "intermediate": INTER,
        "plan": "any M: spare/sorted"}
    with pytest.raises(UnsupportedProblemError) as info:
        Fp8MoE([_Named("broken", ran, fail=True)], CPU, *problem.weights(), top_k=K)
    assert [(c.rank, c.name, c.accepted, c.reason) for c in info.value.candidates] == [
        (1, "broken", False, "prepare() raised RuntimeError: no memory")]
    assert str(info.value).startswith("no backend in the chain supports MoE E=4, H=256, I=128, k=2, any M")


def test_an_m_no_backend_runs_raises_naming_its_bucket(problem) -> None:  # type: ignore[no-untyped-def]
    from test_moe_plan import _DecodeOnly

    from fp8select.moe import Fp8MoE

    moe = Fp8MoE([_DecodeOnly()], CPU, *problem.weights(), top_k=K)
    w, ids = random_routing(65, K, E, seed=1)
    with pytest.raises(UnsupportedProblemError, match="MoE M bucket 128") as info:
        moe(_x(65), w, ids)
    assert [(c.rank, c.name, c.accepted, c.reason) for c in info.value.candidates] == [
        (1, "-", False, "no backend accepts this M: decode-only: requires M <= 64, found M=65")]


def test_layer_shapes_top_k_and_scales_checked_at_load_time(problem) -> None:  # type: ignore[no-untyped-def]
    from fp8select.moe import check_moe_weights

    w13, s13, w2, s2 = problem.weights()
    one = (w13[:1], s13[:1], w2[:1], s2[:1])
    assert check_moe_weights(*one, (128, 128)) == (1, H, INTER)
    tiny = (torch.zeros(1, 2, 1).to(torch.float8_e4m3fn), torch.ones(1, 1, 1), torch.zeros(1, 1, 1).to(torch.float8_e4m3fn),
            torch.ones(1, 1, 1))
    assert check_moe_weights(*tiny, (128, 128)) == (1, 1, 1)
    for shape in ((0, 2, 1), (1, 0, 1), (1, 2, 0), (1, 3, 1)):
        w = torch.zeros(shape).to(torch.float8_e4m3fn)
        with pytest.raises(InvalidInputError, match=re.escape(f"w13: expected [E > 0, 2I > 0 (even), H > 0], found shape {shape}")):
            check_moe_weights(w, *tiny[1:], (128, 128))
    bad = s2.clone()
    bad[0, 0, 0], bad[-1, -1, -1] = float("nan"), float("inf")
    with pytest.raises(InvalidInputError, match=r"^w2_scale: expected finite values, found 2 NaN/inf entries$"):
        check_moe_weights(w13, s13, w2, bad, (128, 128))
    sel = resolve(CPU, plugins=False)
    assert sel.prepare_moe(*problem.weights(), top_k=1).main_plan.problem.top_k == 1
    for top_k in (0, True, 1.0):
        with pytest.raises(InvalidInputError, match=re.escape(f"top_k: expected a positive int or None, found {top_k!r}")):
            sel.prepare_moe(*problem.weights(), top_k=top_k)


def test_unchecked_calls_never_check_ids_on_either_path_and_checked_ones_name_only_bad_ids(problem) -> None:  # type: ignore[no-untyped-def]
    sel = resolve(CPU, plugins=False)
    w, ids = random_routing(3, K, E, seed=2)
    ids[0, 0], ids[1, 1] = E, -1
    unchecked = sel.prepare_moe(*problem.weights(), top_k=K, check_ids=False)
    strided = _x(3).t().contiguous().t()
    assert torch.equal(unchecked(strided, w, ids), unchecked(_x(3), w, ids))
    checked = sel.prepare_moe(*problem.weights(), top_k=K)
    for x in (_x(3), strided):
        with pytest.raises(InvalidInputError, match=re.escape(f"topk_ids: expected expert ids in [0, {E}) or -1 (an expert on "
                                                              f"another rank), found [{E}]")):
            checked(x, w, ids)
    with pytest.raises(NotPicklableError, match=r"^Fp8MoE: a prepared MoE layer holds launches bound to this process's "
                                                r"device; pickle the BlockFp8MoE module"):
        pickle.dumps(checked)


def test_concurrent_first_calls_of_a_new_dtype_wait_for_its_plan(problem, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Two threads making a MoE layer's first fp16 call: the second waits for the first's plan and its launches (it
    used to find the plan published before them: a bare KeyError)."""
    from fp8select.moe import Fp8MoE

    moe = resolve(CPU, plugins=False).prepare_moe(*problem.weights(), top_k=K)
    monkeypatch.setattr(Fp8MoE, "_bind", slowed(Fp8MoE._bind))
    w, ids = random_routing(5, K, E, seed=9)
    x = _x(5, dtype=torch.float16)
    outs, errors = two_threads(lambda: moe(x, w, ids))
    assert errors == [] and len(outs) == 2 and torch.equal(outs[0], outs[1])
    assert rel_err(outs[0], expected_moe(x, *problem.weights(), w, ids)) < TOL


def test_warmup_of_fewer_local_experts_than_top_k_runs_the_plans_top_k(problem) -> None:  # type: ignore[no-untyped-def]
    """A layer of 4 local experts planned for top-6 (expert parallelism) warms the top-6 signature, -1 for the rest
    (it ran top-4: another signature, planned then)."""
    from fp8select.warmup import warmup

    moe = resolve(CPU, plugins=False).prepare_moe(*problem.weights(), top_k=6)
    assert warmup([moe], ms=[3]).calls == 1
    assert set(moe.plans) == {(torch.bfloat16, 6)}
