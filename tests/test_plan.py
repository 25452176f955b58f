"""One plan per layer: per M bucket the fastest backend (measured, modelled or by rule), an explicit
choice obeyed, the weight budget, and what the layer says about it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import torch
from fp64_reference import expected, random_problem, rel_err
from structlog.testing import capture_logs

from fp8select import Capabilities, InvalidInputError, UnsupportedProblemError, resolve
from fp8select.backends.base import CHECKPOINT_LAYOUT, Backend, PreparedWeight
from fp8select.backends.reference import ReferenceBackend
from fp8select.buckets import M_BUCKETS, bucket_index, bucket_range, m_bucket
from fp8select.layer import Fp8Linear
from fp8select.measured.model import Measurements
from fp8select.measured.table import new_table
from fp8select.plan import EXPLICIT, GATE, MEASURED, MODEL, RULE, build_plan
from fp8select.problem import Problem
from fp8select.roofline import floor_us
from fp8select.verdict import Verdict

CPU = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",))
CPU_TRITON = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",), packages={"triton": "3.9.0"},
                          env={"TRITON_INTERPRET": "1"})
N, K = 256, 384
TRITON_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 2, "num_warps": 4,
                 "num_stages": 2, "path": "gemm", "FIXUP": 0, "TMA": 0}


class Fake(ReferenceBackend):
    """The reference computation under another name, recording what it ran."""

    name = "fake"
    requires = ()
    layout_name: ClassVar[str] = CHECKPOINT_LAYOUT
    max_m: ClassVar[int | None] = None
    preferred: ClassVar[int | None] = None
    ran: ClassVar[list[tuple[str, int, Any]]] = []

    def supports_m(self, m: int, caps: Capabilities) -> Verdict:
        if self.max_m is not None and m > self.max_m:
            return Verdict.reject(f"requires M <= {self.max_m}, found M={m}")
        return Verdict.accept("any M")

    def weight_layout(self, caps: Capabilities, problem: Problem) -> str:
        return self.layout_name

    def preferred_m(self, caps: Capabilities) -> int | None:
        return self.preferred

    def launch_config(self, config: Any) -> Any:
        return dict(config)

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        if self.layout_name == CHECKPOINT_LAYOUT:
            return super().prepare(weight, weight_scale, block_size, caps)
        copy = weight.clone()
        return PreparedWeight(self.name, copy, weight_scale, block_size, *weight.shape, copy)

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None, bias: torch.Tensor | None,
            out_dtype: torch.dtype, caps: Capabilities, config: Any = None) -> torch.Tensor:
        Fake.ran.append((self.name, x.shape[0], config))
        return super().run(prepared, x, input_scale=input_scale, bias=bias, out_dtype=out_dtype, caps=caps)


def fake(name: str, **attrs: Any) -> Backend:
    return type(name.title().replace("-", ""), (Fake,), {"name": name, **attrs})()


def table(rows: dict[str, dict[tuple[int, int], dict[int, float]]], device: str = "cpu",
          versions: dict[str, str] | None = None) -> dict[str, Any]:
    t = new_table(device)
    for backend, shapes in rows.items():
        t["groups"].append({"backend": backend, "versions": versions or {"torch": "2.13.0+cpu"}, "shapes": {
            f"{n},{k}": {str(b): {"us": us, **({"config": TRITON_CONFIG} if backend == "triton" else {})}
                         for b, us in buckets.items()} for (n, k), buckets in shapes.items()}})
    return t


def measurements(rows: dict[str, dict[tuple[int, int], dict[int, float]]], **installed: dict[str, str]) -> Measurements:
    return Measurements("cpu", [table(rows)], {name: installed.get(name, {"torch": "2.13.0+cpu"}) for name in rows})


def estimator(meas: Measurements | None, n: int = N, k: int = K) -> Any:
    return lambda backend, bucket: None if meas is None else meas.estimate(backend.name, n, k, bucket)


def _problem(n: int = N, k: int = K) -> Problem:
    return Problem(n, k)


# -- buckets ---------------------------------------------------------------------------------------


def test_buckets() -> None:
    assert [m_bucket(m) for m in (0, 1, 2, 3, 4, 5, 16, 17, 8192, 9000)] == [1, 1, 2, 4, 4, 8, 16, 32, 8192, 8192]
    assert [bucket_range(b) for b in (1, 2, 4, 8192)] == [(1, 1), (2, 2), (3, 4), (4097, None)]
    assert all(M_BUCKETS[bucket_index(m)] == m_bucket(m) for m in range(1, 20000, 7))


# -- the model ---------------------------------------------------------------------------------------


def test_estimates_are_measured_for_a_known_shape_and_modelled_between_shapes() -> None:
    meas = measurements({"a": {(1024, 1024): {16: 10.0}, (4096, 4096): {16: 40.0}}})
    exact = meas.estimate("a", 1024, 1024, 16)
    assert exact is not None and exact.source == MEASURED and exact.us == 10.0
    mid = meas.estimate("a", 2048, 2048, 16)
    assert mid is not None and mid.source == MODEL and "2 measured shapes" in mid.detail
    # efficiency (time / floor) is interpolated, so the estimate lies between the neighbours' efficiencies
    eff = [10.0 / floor_us(1024, 1024, 16), 40.0 / floor_us(4096, 4096, 16)]
    assert min(eff) <= mid.us / floor_us(2048, 2048, 16) <= max(eff)
    assert meas.estimate("a", 2048, 2048, 32) is None  # no shape measured at that bucket
    assert meas.estimate("b", 1024, 1024, 16) is None  # a backend never measured


def test_rows_of_another_version_are_used_and_named() -> None:
    meas = measurements({"deepgemm": {(N, K): {1: 5.0}}}, deepgemm={"torch": "2.13.0+cpu", "deep_gemm": "2.7.0"})
    est = meas.estimate("deepgemm", N, K, 1)
    assert est is not None and est.us == 5.0 and "measured with torch 2.13.0+cpu" in est.detail
    assert "other versions" in meas.describe()


# -- the plan ----------------------------------------------------------------------------------------


def test_each_bucket_gets_the_fastest_measured_backend() -> None:
    a, b = fake("a"), fake("b")
    meas = measurements({"a": {(N, K): {m: 10.0 for m in M_BUCKETS}}, "b": {(N, K): {m: 5.0 if m <= 16 else 20.0
                                                                                     for m in M_BUCKETS}}})
    plan = build_plan(_problem(), [a, b], CPU, estimator(meas))
    assert [plan.route(m).backend for m in (1, 16, 17, 8192, 100000)] == ["b", "b", "a", "a", "a"]
    assert {r.why for r in plan.routes} == {MEASURED}
    assert plan.route(32).detail == "10.0 us measured (others: b 20.0 us)"
    assert plan.summary() == "M 1-16: b, M >= 17: a"
    assert plan.backends == ("b", "a")


def test_every_accepted_backend_of_the_chain_may_be_used_not_only_two() -> None:
    backends = [fake(n) for n in ("a", "b", "c", "d")]
    best = {1: "d", 2: "c", 4: "b"}
    rows = {n: {(N, K): {m: (1.0 if best.get(m, "a") == n else 9.0) for m in M_BUCKETS}} for n in "abcd"}
    plan = build_plan(_problem(), backends, CPU, estimator(measurements(rows)))
    assert plan.backends == ("d", "c", "b", "a")


def test_unmeasured_shapes_use_the_model_and_no_data_uses_the_priority_order() -> None:
    a, b = fake("a"), fake("b")
    meas = measurements({"a": {(512, 512): {1: 10.0}, (1024, 1024): {1: 12.0}},
                         "b": {(512, 512): {1: 5.0}, (1024, 1024): {1: 6.0}}})
    plan = build_plan(_problem(700, 700), [a, b], CPU, estimator(meas, 700, 700))
    assert plan.route(1).backend == "b" and plan.route(1).why == MODEL
    assert plan.route(2).backend == "a" and plan.route(2).why == RULE  # nothing measured at M=2: priority order
    unmeasured = build_plan(_problem(), [a, b], CPU, estimator(None))
    assert {(r.backend, r.why) for r in unmeasured.routes} == {("a", RULE)}


def test_a_speed_rule_applies_only_without_measurements() -> None:
    small = fake("small", preferred=31)  # like FlashInfer's sm90 kernel: SGLang uses it for M < 32
    other = fake("other")
    plan = build_plan(_problem(), [small, other], CPU, estimator(None))
    assert plan.route(16).backend == "small" and plan.route(32).backend == "small" and plan.route(33).backend == "other"
    assert "preferred only for M <= 31" in plan.route(64).detail
    meas = measurements({"small": {(N, K): {64: 1.0}}, "other": {(N, K): {64: 2.0}}})
    assert build_plan(_problem(), [small, other], CPU, estimator(meas)).route(64).backend == "small"


def test_gates_decide_what_cannot_run() -> None:
    limited, other = fake("limited", max_m=64), fake("other")
    meas = measurements({"limited": {(N, K): {m: 1.0 for m in M_BUCKETS}}, "other": {(N, K): {m: 2.0 for m in M_BUCKETS}}})
    plan = build_plan(_problem(), [limited, other], CPU, estimator(meas))
    assert plan.route(64).backend == "limited" and plan.route(65).backend == "other"
    only = build_plan(_problem(), [limited], CPU, estimator(meas))
    assert only.route(65).backend is None and "requires M <= 64" in only.route(65).detail


def test_a_gate_that_raises_is_a_rejection() -> None:
    class Broken(Fake):
        name = "broken"

        def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
            raise RuntimeError("boom")

    class Nonsense(Fake):
        name = "nonsense"

        def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
            return True  # type: ignore[return-value]

    plan = build_plan(_problem(), [Broken(), Nonsense(), fake("ok")], CPU, estimator(None))
    assert plan.backends == ("ok",)
    reasons = {c.name: c.reason for c in plan.candidates}
    assert "raised RuntimeError: boom" in reasons["broken"] and "expected a Verdict" in reasons["nonsense"]
    with pytest.raises(UnsupportedProblemError, match="boom"):
        build_plan(_problem(), [Broken()], CPU, estimator(None))


def test_an_explicit_choice_runs_wherever_its_gate_accepts() -> None:
    slow, fast = fake("slow", max_m=128), fake("fast")
    meas = measurements({"slow": {(N, K): {m: 9.0 for m in M_BUCKETS}}, "fast": {(N, K): {m: 1.0 for m in M_BUCKETS}}})
    plan = build_plan(_problem(), [slow, fast], CPU, estimator(meas), explicit="slow")
    assert all(plan.route(m).backend == "slow" and plan.route(m).why == EXPLICIT for m in (1, 64, 128))
    assert plan.route(129).backend == "fast" and plan.route(129).why == GATE
    assert "slow rejects this M (requires M <= 128" in plan.route(129).detail


def test_the_weight_budget() -> None:
    a = fake("a", layout_name="copy-a")
    b = fake("b", layout_name="copy-b")
    c = fake("c")  # the checkpoint's bytes
    rows = {"a": {(N, K): {m: 1.0 if m <= 8 else 5.0 for m in M_BUCKETS}},
            "b": {(N, K): {m: 1.0 if m > 8 else 5.0 for m in M_BUCKETS}},
            "c": {(N, K): {m: 3.0 for m in M_BUCKETS}}}
    est = estimator(measurements(rows))
    free = build_plan(_problem(), [a, b, c], CPU, est, max_weight_copies=None)
    assert free.backends == ("a", "b") and free.weight_copies == 2
    one = build_plan(_problem(), [a, b, c], CPU, est, max_weight_copies=1)
    assert one.weight_copies == 1 and one.backends == ("c", "b")  # dropping a's copy costs least (4 buckets)
    assert any("'copy-a' left out" in note for note in one.notes)
    none = build_plan(_problem(), [a, b, c], CPU, est, max_weight_copies=0)
    assert none.backends == ("c",) and none.weight_copies == 0
    explicit = build_plan(_problem(), [a, b, c], CPU, est, max_weight_copies=0, explicit="a")
    assert "a" in explicit.backends and any("explicit choice 'a'" in note for note in explicit.notes)


def test_backends_of_one_layout_share_one_copy() -> None:
    a = fake("a", layout_name="fnuz")
    b = fake("b", layout_name="fnuz")
    rows = {"a": {(N, K): {m: 1.0 if m <= 8 else 5.0 for m in M_BUCKETS}},
            "b": {(N, K): {m: 1.0 if m > 8 else 5.0 for m in M_BUCKETS}}}
    plan = build_plan(_problem(), [a, b, fake("c")], CPU, estimator(measurements(rows)), max_weight_copies=1)
    assert plan.backends == ("a", "b") and plan.weight_copies == 1


def test_plan_fingerprint_ignores_details_only() -> None:
    a, b = fake("a"), fake("b")
    meas = measurements({"a": {(N, K): {1: 1.0}}, "b": {(N, K): {1: 2.0}}})
    p1 = build_plan(_problem(), [a, b], CPU, estimator(meas))
    p2 = build_plan(_problem(), [a, b], CPU, estimator(measurements({"a": {(N, K): {1: 1.5}}, "b": {(N, K): {1: 2.0}}})))
    p3 = build_plan(_problem(), [a, b], CPU, estimator(measurements({"a": {(N, K): {1: 3.0}}, "b": {(N, K): {1: 2.0}}})))
    assert p1.fingerprint() == p2.fingerprint() != p3.fingerprint()


# -- the layer ---------------------------------------------------------------------------------------


def _weights(n: int = N, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    return random_problem(n, k, seed=11)


def test_the_layer_runs_each_bucket_on_its_backend_with_its_config() -> None:
    a, b = fake("a"), fake("b")
    meas = measurements({"a": {(N, K): {m: 10.0 for m in M_BUCKETS}},
                         "b": {(N, K): {m: 5.0 if m <= 4 else 20.0 for m in M_BUCKETS}}})
    w, s = _weights()
    layer = Fp8Linear([a, b], CPU, w, s, measurements=meas)
    assert set(layer.prepared) == {"a", "b"}
    Fake.ran.clear()
    for m in (1, 3, 4, 5, 9):
        x = torch.randn(m, K, dtype=torch.bfloat16)
        assert rel_err(layer(x), expected(x, w, s, (128, 128))) < 1e-2
    assert [(name, m) for name, m, _ in Fake.ran] == [("b", 1), ("b", 3), ("b", 4), ("a", 5), ("a", 9)]
    assert layer.backend_for(4).name == "b" and layer.backend_for(5).name == "a"
    assert "measured" in layer.describe() and "M 1-4" in repr(layer)


def test_a_triton_row_hands_its_config_to_the_backend() -> None:
    tri = fake("triton")
    meas = measurements({"triton": {(N, K): {1: 3.0}}})
    w, s = _weights()
    Fake.ran.clear()
    Fp8Linear([tri], CPU, w, s, measurements=meas)(torch.randn(1, K, dtype=torch.bfloat16))
    assert Fake.ran[-1][2] == TRITON_CONFIG


def test_one_prepared_weight_per_layout_and_the_budget_is_kept() -> None:
    a = fake("a", layout_name="copy")
    b = fake("b")
    meas = measurements({"a": {(N, K): {m: 1.0 if m <= 8 else 5.0 for m in M_BUCKETS}},
                         "b": {(N, K): {m: 1.0 if m > 8 else 5.0 for m in M_BUCKETS}}})
    w, s = _weights()
    layer = Fp8Linear([a, b], CPU, w, s, measurements=meas)
    mem = layer.memory()
    assert mem == {"checkpoint_held": True, "copies": 1, "copy_bytes": N * K}
    assert layer.prepared["b"].weight is w
    layer0 = Fp8Linear([a, b], CPU, w, s, measurements=meas, max_weight_copies=0)
    assert layer0.memory()["copies"] == 0 and layer0.backends == ("b",)
    with pytest.raises(InvalidInputError, match="max_weight_copies"):
        Fp8Linear([a, b], CPU, w, s, max_weight_copies=-1)


def test_a_backend_that_fails_to_prepare_is_left_out() -> None:
    class Failing(Fake):
        name = "failing"

        def prepare(self, *args: Any, **kwargs: Any) -> PreparedWeight:
            raise RuntimeError("vendor library refused")

    w, s = _weights()
    with capture_logs() as logs:
        layer = Fp8Linear([Failing(), fake("ok")], CPU, w, s)
    assert layer.backends == ("ok",)
    assert any(e["event"] == "fp8select.prepare_failed" and "refused" in e["error"] for e in logs)


def test_another_dtype_gets_its_own_plan_with_a_backend_that_takes_it() -> None:
    bf16_only = fake("bf16only", activation_dtypes=(torch.bfloat16,), out_dtypes=(torch.bfloat16,))
    anything = fake("anything")
    w, s = _weights()
    layer = Fp8Linear([bf16_only, anything], CPU, w, s)
    assert layer.backends == ("bf16only",)
    x = torch.randn(3, K, dtype=torch.float16)
    assert rel_err(layer(x), expected(x, w, s, (128, 128))) < 1e-2
    assert layer.backend_for(3, torch.float16).name == "anything" and set(layer.prepared) == {"bf16only", "anything"}


def test_outputs_carry_no_gradient() -> None:
    w, s = _weights()
    layer = resolve(CPU, plugins=False).prepare(w, s)
    x = torch.randn(2, K, dtype=torch.float32, requires_grad=True)
    assert not layer(x).requires_grad


def test_prepared_layers_log_one_event_with_their_plan() -> None:
    w, s = _weights()
    with capture_logs() as logs:
        resolve(CPU, plugins=False, tuning=False).prepare(w, s)
    events = [e for e in logs if e["event"] == "fp8select.layer_prepared"]
    assert len(events) == 1 and events[0]["n"] == N and events[0]["plan"] == "any M: reference"


# -- through resolve() ---------------------------------------------------------------------------------


def _interp_table(prefer: str) -> dict[str, Any]:
    other = "reference" if prefer == "triton" else "triton"
    return table({prefer: {(N, K): {m: 1.0 for m in M_BUCKETS}}, other: {(N, K): {m: 2.0 for m in M_BUCKETS}}})


def test_an_explicit_choice_is_obeyed_over_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    w, s = _weights()
    auto = resolve(CPU_TRITON, plugins=False, tuning=_interp_table("triton")).prepare(w, s)
    assert {auto.backend_for(m).name for m in (1, 64, 4096)} == {"triton"}
    sel = resolve(CPU_TRITON, plugins=False, backend="reference", tuning=_interp_table("triton"))
    explicit = sel.prepare(w, s)
    assert {explicit.backend_for(m).name for m in (1, 64, 4096)} == {"reference"}
    assert explicit.backends == ("reference",)
    env = resolve(CPU_TRITON.with_overrides({"env.FP8SELECT_BACKEND": "reference"}), plugins=False,
                  tuning=_interp_table("triton"))
    assert env.prepare(w, s).backend_for(1).name == "reference"


def test_a_malformed_tuning_mapping_is_a_typed_error_at_resolve() -> None:
    with pytest.raises(InvalidInputError, match=r"tuning: .*us"):
        resolve(CPU, plugins=False, tuning={"schema": 2, "device_name": "x",
                                            "groups": [{"backend": "triton", "versions": {}, "shapes": {"1,1": {"2": {}}}}]})
    with pytest.raises(InvalidInputError, match="schema"):
        resolve(CPU, plugins=False, tuning={"schema": 1, "fingerprint": "abc", "device_name": "x", "versions": {},
                                            "entries": {"1,1": {"8": {"backend": "triton", "config": {"BLOCK_M": "x"}}}}})


def test_max_weight_copies_is_checked_and_passed_on() -> None:
    with pytest.raises(InvalidInputError, match="max_weight_copies"):
        resolve(CPU, plugins=False, max_weight_copies=-2)
    sel = resolve(CPU, plugins=False, max_weight_copies=None)
    w, s = _weights()
    assert sel.prepare(w, s).max_weight_copies is None and sel.prepare(w, s, max_weight_copies=0).max_weight_copies == 0


def test_model_choice_on_the_shipped_h200_table_is_sane() -> None:
    """On the shipped H200 measurements, a shape that is not in the table gets Triton at M=1 and
    cuBLAS at M=4096 (the crossover every measured shape shows)."""
    caps = Capabilities(device_kind="cuda", device_name="NVIDIA H200", compute_capability=(9, 0),
                        torch_version="2.11.0+cu130", cuda_version="13.0", packages={"triton": "3.6.0"},
                        has_scaled_mm=True, scaling_types=("BlockWise1x128", "BlockWise128x128"),
                        float8_dtypes=("float8_e4m3fn",), triton_backends=("nvidia",))
    sel = resolve(caps, plugins=False, verify=False)
    assert sel.measurements is not None and set(sel.measurements.backends) >= {"triton", "cuda-scaled-mm"}
    est = {b.name: [sel.measurements.estimate(b.name, 3072, 6144, m) for m in (1, 4096)] for b in sel.chain
           if b.name in ("triton", "cuda-scaled-mm")}
    assert all(e is not None and e.source == MODEL for pair in est.values() for e in pair)
    assert est["triton"][0].us < est["cuda-scaled-mm"][0].us  # type: ignore[union-attr]
    assert est["cuda-scaled-mm"][1].us < est["triton"][1].us  # type: ignore[union-attr]
    assert math.isfinite(est["triton"][1].us)  # type: ignore[union-attr]


def test_warmup_runs_every_route_of_each_distinct_layer_once() -> None:
    from fp8select.warmup import warmup

    a, b = fake("a"), fake("b")
    meas = measurements({"a": {(N, K): {m: 10.0 for m in M_BUCKETS}},
                         "b": {(N, K): {m: 5.0 if m <= 4 else 20.0 for m in M_BUCKETS}}})
    w, s = _weights()
    layers = [Fp8Linear([a, b], CPU, w, s, measurements=meas) for _ in range(3)]
    Fake.ran.clear()
    with capture_logs() as logs:
        report = warmup(layers)
    assert report.layers == 3 and report.distinct == 1
    ran = {(name, m) for name, m, _ in Fake.ran}
    assert {("b", 1), ("b", 2), ("b", 3), ("b", 4), ("a", 5), ("a", 8), ("a", 4097), ("a", 8192)} <= ran
    assert report.calls == len(Fake.ran) == 26  # both ends of each bucket: 1, 2, then 12 buckets x 2
    assert next(e for e in logs if e["event"] == "fp8select.warmup")["calls"] == 26
    Fake.ran.clear()
    assert warmup(layers[0], ms=[3, 64]).calls == 2 and {(n, m) for n, m, _ in Fake.ran} == {("b", 3), ("a", 64)}
    with pytest.raises(InvalidInputError, match="ms"):
        warmup(layers, ms=[0])


def test_triton_and_aiter_share_one_fnuz_copy_on_gfx942(monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import install
    from matrix import MATRIX

    install(monkeypatch, "aiter", gfx="gfx942")
    sel = resolve(MATRIX["mi300x-aiter"][0], plugins=False, order=["aiter", "triton", "reference"], tuning=False)
    plan = sel.plan_for(256, 512)
    assert {w.layout for w in plan.weights} <= {"e4m3fnuz"}
    meas = measurements({"aiter": {(256, 512): {m: 1.0 if m > 8 else 5.0 for m in M_BUCKETS}},
                         "triton": {(256, 512): {m: 1.0 if m <= 8 else 5.0 for m in M_BUCKETS}}})
    both = build_plan(Problem(256, 512), list(sel.chain), sel.capabilities, estimator(meas, 256, 512))
    assert both.backends == ("triton", "aiter") and both.weight_copies == 1


def test_describe_shows_each_ranges_launch_configuration() -> None:
    """The Triton rows' kernel (path and tiles) per M range; ranges with different configurations stay apart."""
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.plan import Plan, Route, WeightUse

    gemm = TritonConfig.from_dict(TRITON_CONFIG)
    wgmma = TritonConfig.from_dict({**TRITON_CONFIG, "BLOCK_M": 128, "BLOCK_N": 128, "SPLIT_K": 1, "num_warps": 8,
                                    "path": "wgmma", "TMA": 1})
    routes = tuple(Route(b, "triton", MEASURED, f"{b} us", config=gemm if b <= 512 else wgmma) for b in M_BUCKETS)
    plan = Plan(Problem(N, K, (128, 128)), routes, (WeightUse(CHECKPOINT_LAYOUT, ("triton",)),), ())
    lines = plan.describe().splitlines()
    assert "M 1-512" in lines[1] and f"[{gemm.describe()}]" in lines[1]
    assert "M >= 513" in lines[2] and "[wgmma 128x128 sk1 w8 s2 tma]" in lines[2]


def test_a_modelled_routes_borrowed_config_is_fitted_to_the_layers_shape() -> None:
    """A shape never measured borrows the nearest measured shape's configuration; the backend fits it
    (Triton: the split-K, :func:`fp8select.kernels.triton_search.fit_split`). A measured shape's is kept."""
    class Fitting(Fake):
        name = "triton"

        def fit_config(self, config: Any, measured_at: tuple[int, int], problem: Problem, m: int) -> Any:
            return {**config, "fitted": (measured_at, problem.n, problem.k, m)}

    meas = measurements({"triton": {(N, K): {8: 10.0}}})
    modelled = build_plan(_problem(2 * N, K), [Fitting()], CPU, estimator(meas, 2 * N, K))
    assert modelled.route(8).why == MODEL and modelled.route(8).config["fitted"] == ((N, K), 2 * N, K, 8)
    measured = build_plan(_problem(), [Fitting()], CPU, estimator(meas))
    assert measured.route(8).config == TRITON_CONFIG


def test_the_triton_backend_fits_a_borrowed_split_to_the_layer() -> None:
    from fp8select.backends.triton import TritonBackend
    from fp8select.kernels.triton_config import TritonConfig

    cfg = TritonConfig.from_dict(TRITON_CONFIG)  # 16 x 64 tiles, split 2
    fitted = TritonBackend().fit_config(cfg, (N, K), _problem(N // 2, K), 8)
    assert fitted == replace(cfg, SPLIT_K=4)  # half the column tiles: twice the split, the same programs
