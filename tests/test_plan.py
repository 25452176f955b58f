"""One plan per layer: per M bucket the fastest backend (measured, modelled or by rule), an explicit
choice obeyed, the weight budget, and what the layer says about it."""

from __future__ import annotations

import json
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
from fp8select.buckets import M_BUCKETS, between, bucket_index, bucket_range, m_bucket
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
    min_m: ClassVar[int | None] = None
    preferred: ClassVar[int | None] = None
    ran: ClassVar[list[tuple[str, int, Any]]] = []

    def supports_m(self, m: int, caps: Capabilities) -> Verdict:
        if self.max_m is not None and m > self.max_m:
            return Verdict.reject(f"requires M <= {self.max_m}, found M={m}")
        if self.min_m is not None and m < self.min_m:
            return Verdict.reject(f"requires M >= {self.min_m}, found M={m}")
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
    # the nearest measured buckets on either side, and how far between them in log2 M
    assert between([1, 16, 256, 8192], 64) == (16, 256, 0.5) and between({256, 16}, 32) == (16, 256, 0.25)
    assert between([16, 256], 8) is None and between([16, 256], 512) is None and between([], 64) is None


# -- the model ---------------------------------------------------------------------------------------


def test_estimates_are_measured_for_a_known_shape_and_modelled_between_shapes() -> None:
    meas = measurements({"a": {(1024, 1024): {16: 10.0}, (4096, 4096): {16: 40.0}}})
    exact = meas.estimate("a", 1024, 1024, 16)
    assert exact is not None and exact.source == MEASURED and exact.us == 10.0
    mid = meas.estimate("a", 2048, 2048, 16)
    assert mid is not None and mid.source == MODEL and "2 measured shapes" in mid.detail
    # efficiency (time / floor) is interpolated, so the estimate lies between the neighbours' efficiencies
    eff = [10.0 / floor_us(1024, 1024, 16), 40.0 / floor_us(4096, 4096, 16)]
    assert min(eff) * (1 - 1e-12) <= mid.us / floor_us(2048, 2048, 16) <= max(eff) * (1 + 1e-12)
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


def test_the_weight_budget_counts_the_copies_a_layer_holds_for_other_dtypes() -> None:
    """``max_weight_copies`` bounds a layer over all its plans: a later dtype's plan adds no copy past it."""
    a = fake("a", layout_name="copy-a", activation_dtypes=(torch.bfloat16,))
    b = fake("b", layout_name="copy-b", activation_dtypes=(torch.float16,))
    c = fake("c")  # the checkpoint's bytes
    meas = measurements({"a": {(N, K): {m: 1.0 for m in M_BUCKETS}}, "b": {(N, K): {m: 1.0 for m in M_BUCKETS}},
                         "c": {(N, K): {m: 3.0 for m in M_BUCKETS}}})
    fp16 = replace(_problem(), act_dtype=torch.float16, out_dtype=torch.float16)
    assert build_plan(fp16, [a, b, c], CPU, estimator(meas), held={"copy-a"}).backends == ("c",)
    assert build_plan(fp16, [a, b, c], CPU, estimator(meas), held={"copy-b"}).backends == ("b",)  # held: no cost
    w, s = _weights()
    layer = Fp8Linear([a, b, c], CPU, w, s, measurements=meas)
    assert layer.backends == ("a",) and layer.memory()["copies"] == 1
    x = torch.randn(3, K, dtype=torch.float16)
    assert rel_err(layer(x), expected(x, w, s, (128, 128))) < 1e-2
    assert layer.memory()["copies"] == 1 and "b" not in layer.prepared


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


def test_warmup_runs_a_layer_of_another_output_dtype_too() -> None:
    """Two layers that differ only in their output dtype run other kernels (an output-dtype specialization): both warm."""
    from fp8select.warmup import warmup

    a = fake("a")
    meas = measurements({"a": {(N, K): {m: 10.0 for m in M_BUCKETS}}})
    w, s = _weights()
    layers = [Fp8Linear([a], CPU, w, s, measurements=meas, out_dtype=out) for out in (None, torch.float32)]
    Fake.ran.clear()
    report = warmup(layers, ms=[3])
    assert (report.layers, report.distinct, report.calls) == (2, 2, 2)


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


# -- the numbers and words of a plan, each of which a user or a log reader relies on ---------------------


def test_a_gate_is_asked_at_both_ends_of_each_bucket_and_the_last_at_its_start() -> None:
    asked: list[int | None] = []

    class Recording(Fake):
        name = "recording"

        def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
            asked.append(problem.m)
            return super().supports(problem, caps)

    build_plan(_problem(), [Recording()], CPU, estimator(None))
    ends = {m for b in M_BUCKETS for m in bucket_range(b) if m is not None}
    assert asked[0] is None  # the layer as a whole first, then each bucket's ends
    assert set(asked[1:]) == ends and len(asked[1:]) == len(ends)  # M=1 and M=2 asked once each


def test_a_raising_gate_is_named_and_an_unsupported_layer_describes_itself() -> None:
    class Broken(Fake):
        name = "broken"

        def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
            raise RuntimeError("boom")

    plan = build_plan(_problem(), [Broken(), fake("ok")], CPU, estimator(None))
    assert plan.candidates[0].reason.startswith("its gate raised RuntimeError")
    assert [(c.rank, c.name, c.accepted) for c in plan.candidates] == [(1, "broken", False), (2, "ok", True)]
    with pytest.raises(UnsupportedProblemError, match=r"N=256, K=384"):
        build_plan(_problem(), [Broken()], CPU, estimator(None))


def test_routes_carry_the_estimates_time_and_configuration() -> None:
    tri, other = fake("triton"), fake("other")
    meas = measurements({"triton": {(N, K): {1: 3.0, 2: 9.0}}, "other": {(N, K): {1: 6.0, 2: 4.0}}})
    plan = build_plan(_problem(), [tri, other], CPU, estimator(meas))
    fast, slow = plan.route(1), plan.route(2)
    assert (fast.backend, fast.us, fast.config) == ("triton", 3.0, TRITON_CONFIG)
    assert (slow.backend, slow.us, slow.config) == ("other", 4.0, None)
    assert fast.detail == "3.0 us measured (others: other 6.0 us)"
    explicit = build_plan(_problem(), [tri, other], CPU, estimator(meas), explicit="triton")
    assert explicit.explicit == "triton"
    at2 = explicit.route(2)  # slower there, run all the same, with its own time and configuration
    assert (at2.backend, at2.why, at2.us, at2.config) == ("triton", EXPLICIT, 9.0, TRITON_CONFIG)
    assert at2.detail == "the explicit choice; 9.0 us measured"
    assert explicit.route(4).detail == "the explicit choice" and explicit.route(4).us is None  # nothing measured at 4


def test_others_are_listed_fastest_first_at_most_three() -> None:
    backends = [fake(n) for n in "abcde"]
    meas = measurements({n: {(N, K): {1: us}} for n, us in zip("abcde", (5.0, 1.0, 4.0, 2.0, 3.0), strict=True)})
    plan = build_plan(_problem(), backends, CPU, estimator(meas))
    assert plan.route(1).backend == "b"
    assert plan.route(1).detail == "1.0 us measured (others: d 2.0, e 3.0, c 4.0 us)"
    alone = build_plan(_problem(), backends[:1], CPU, estimator(meas))
    assert alone.route(1).detail == "5.0 us measured"  # no one else measured: no "others"


def test_a_bucket_no_backend_accepts_names_each_rejection() -> None:
    plan = build_plan(_problem(), [fake("a", max_m=64), fake("b", max_m=32)], CPU, estimator(None))
    assert [r.bucket for r in plan.routes] == list(M_BUCKETS)
    route = plan.route(65)
    assert (route.backend, route.why) == (None, GATE)
    assert route.detail == ("no backend accepts this M (a: requires M <= 64, found M=65; "
                            "b: requires M <= 32, found M=65)")
    assert plan.route(64).backend == "a" and plan.route(32).backend == "a"


def test_the_priority_rule_says_what_it_passed_over() -> None:
    small, tiny, other = fake("small", preferred=31), fake("tiny", preferred=4), fake("other")
    plan = build_plan(_problem(), [small, tiny, other], CPU, estimator(None))
    assert plan.route(1).detail == "first in priority order (no measurement)"
    assert plan.route(64).backend == "other"
    assert plan.route(64).detail == ("first in priority order (no measurement), passing over "
                                     "small (preferred only for M <= 31), tiny (preferred only for M <= 4)")
    # a preference holds up to and including its limit: a bucket starting at the limit is still preferred
    at_edge = build_plan(_problem(), [fake("small", preferred=33), other], CPU, estimator(None))
    assert at_edge.route(64).backend == "small" and at_edge.route(65).backend == "other"


def test_the_speed_rule_is_read_with_the_layers_capabilities() -> None:
    class Small(Fake):
        name = "small"

        def preferred_m(self, caps: Capabilities) -> int | None:
            return int(caps.env["SMALL_UP_TO"])

    caps = CPU.with_overrides({"env.SMALL_UP_TO": "16"})
    plan = build_plan(_problem(), [Small(), fake("other")], caps, estimator(None))
    assert plan.route(16).backend == "small" and plan.route(17).backend == "other"


def test_an_explicit_choice_rejected_at_some_m_leaves_the_rest_to_the_gate() -> None:
    plan = build_plan(_problem(), [fake("slow", max_m=128), fake("fast")], CPU, estimator(None), explicit="slow")
    assert (plan.route(129).backend, plan.route(129).why) == ("fast", GATE)
    assert plan.route(129).detail.startswith("slow rejects this M (requires M <= 128, found M=129); first in priority")
    # a name that is not an accepted backend of the chain is no explicit choice
    unknown = build_plan(_problem(), [fake("a"), fake("b")], CPU, estimator(None), explicit="c")
    assert unknown.explicit is None and {(r.backend, r.why) for r in unknown.routes} == {("a", RULE)}


def test_one_copy_by_default_and_the_bound_is_recorded() -> None:
    copies = [fake(n, layout_name=f"copy-{n}") for n in "abc"]
    rows = {n: {(N, K): {m: 1.0 if i == j % 3 else 2.0 for j, m in enumerate(M_BUCKETS)}} for i, n in enumerate("abc")}
    plan = build_plan(_problem(), copies, CPU, estimator(measurements(rows)))
    assert plan.weight_copies == 1 and plan.max_weight_copies == 1
    assert build_plan(_problem(), copies, CPU, estimator(measurements(rows)), max_weight_copies=2).max_weight_copies == 2


def test_the_budget_drops_the_copy_whose_loss_is_least_by_measured_time_not_by_count() -> None:
    """a's copy wins 2 buckets by 100x, b's wins 12 buckets by 10%: dropping b costs least (12 log 1.1
    < 2 log 100), although it serves more buckets and its name sorts after a's."""
    a, b, c = fake("a", layout_name="copy-a"), fake("b", layout_name="copy-b"), fake("c")
    rows = {"a": {(N, K): {m: 1.0 for m in (1, 2)}}, "b": {(N, K): {m: 1.0 for m in M_BUCKETS[2:]}},
            "c": {(N, K): {m: 100.0 if m <= 2 else 1.1 for m in M_BUCKETS}}}
    plan = build_plan(_problem(), [a, b, c], CPU, estimator(measurements(rows)))
    assert plan.backends == ("a", "c") and plan.notes == ("weight layout 'copy-b' left out: max_weight_copies=1",)


def test_equal_losses_drop_the_layout_first_by_name() -> None:
    a, b, c = fake("a", layout_name="copy-a"), fake("b", layout_name="copy-b"), fake("c")
    rows = {"a": {(N, K): {m: 1.0 for m in (1, 2, 4, 8)}}, "b": {(N, K): {m: 1.0 for m in (16, 32, 64, 128)}},
            "c": {(N, K): {m: 3.0 for m in M_BUCKETS}}}
    plan = build_plan(_problem(), [b, a, c], CPU, estimator(measurements(rows)))
    assert plan.backends == ("c", "b")


def test_the_budget_never_leaves_a_bucket_without_a_backend() -> None:
    """Dropping a would leave M > 64 to nobody (c takes M <= 64 only): b's copy goes instead, even though
    a is the slower of the two where both run."""
    a, b, c = fake("a", layout_name="copy-a"), fake("b", layout_name="copy-b", max_m=64), fake("c", max_m=64)
    rows = {"a": {(N, K): {m: 2.0 for m in M_BUCKETS}}, "b": {(N, K): {m: 1.0 for m in M_BUCKETS if m <= 64}},
            "c": {(N, K): {m: 1.5 for m in M_BUCKETS if m <= 64}}}
    plan = build_plan(_problem(), [a, b, c], CPU, estimator(measurements(rows)))
    assert all(r.backend is not None for r in plan.routes) and plan.backends == ("c", "a")


def test_when_a_bucket_must_be_lost_the_budget_loses_the_fewest() -> None:
    """a alone runs M > 4096, b alone M 65-4096 (six buckets): one copy allowed, a's goes (one bucket
    left to no backend), although a is the faster where it runs."""
    a, b = fake("a", layout_name="copy-a", min_m=4097), fake("b", layout_name="copy-b", max_m=4096)
    rows = {"a": {(N, K): {8192: 0.5}}, "b": {(N, K): {m: 1.0 for m in M_BUCKETS}}, "c": {(N, K): {m: 2.0 for m in M_BUCKETS}}}
    plan = build_plan(_problem(), [a, b, fake("c", max_m=64)], CPU, estimator(measurements(rows)))
    assert plan.backends == ("b",) and [r.bucket for r in plan.routes if r.backend is None] == [8192]


@pytest.mark.parametrize("others_us, dropped", [(1.05, "copy-b"), (1.067, "copy-b"), (1.09, "copy-a")])
def test_an_unmeasured_route_costs_twice_the_buckets_worst_known_time(others_us: float, dropped: str) -> None:
    """M=8192 was measured for a only (2.0 us), above every other backend's measured buckets (so nothing is
    interpolated there): dropping a's copy sends it by rule to b, unmeasured there, counted as 2 x 2.0 us (a
    loss of log 2), plus log(1.2/1.0) at M=4096. Dropping b's instead costs 12 log(others_us) at the 12
    buckets b wins."""
    a, b, c = fake("a", layout_name="copy-a"), fake("b", layout_name="copy-b"), fake("c")
    rest = [m for m in M_BUCKETS if m not in (4096, 8192)]
    rows = {"a": {(N, K): {4096: 1.0, 8192: 2.0}}, "b": {(N, K): {4096: 1.2, **{m: 1.0 for m in rest}}},
            "c": {(N, K): {4096: 50.0, **{m: others_us for m in rest}}}}
    loss_a = math.log(1.2) + math.log(2 * 2.0 / 2.0)
    loss_b = len(rest) * math.log(others_us)
    assert (loss_b < loss_a) == (dropped == "copy-b")  # the scenario is what its name says
    plan = build_plan(_problem(), [a, b, c], CPU, estimator(measurements(rows)))
    assert plan.notes == (f"weight layout {dropped!r} left out: max_weight_copies=1",)
    assert plan.route(8192).backend == ("a" if dropped == "copy-b" else "b")


def test_to_dict_is_the_plan_as_json() -> None:
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.plan import Plan, Route, WeightUse

    config = TritonConfig.from_dict(TRITON_CONFIG)
    routes = tuple(Route(b, "triton" if b <= 64 else None, MEASURED if b <= 64 else GATE, f"d{b}",
                         config=config if b <= 64 else None, us=1.23456 if b <= 64 else None) for b in M_BUCKETS)
    plan = Plan(Problem(N, K, (128, 128)), routes, (WeightUse("fnuz", ("triton", "aiter")),), (), explicit="triton",
                max_weight_copies=3, notes=("a note",))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data == {"n": N, "k": K, "block_size": [128, 128], "explicit": "triton", "max_weight_copies": 3,
                    "routes": data["routes"], "weights": [{"layout": "fnuz", "backends": ["triton", "aiter"], "copy": True}],
                    "notes": ["a note"], "batch_invariant": None}
    assert [r["bucket"] for r in data["routes"]] == list(M_BUCKETS)
    assert data["routes"][0] == {"bucket": 1, "backend": "triton", "why": MEASURED, "detail": "d1",
                                 "config": config.to_dict(), "us": 1.235}  # microseconds to the nanosecond
    assert data["routes"][-1] == {"bucket": 8192, "backend": None, "why": GATE, "detail": "d8192", "config": None, "us": None}


def test_the_fingerprint_does_not_depend_on_the_order_of_a_configurations_keys() -> None:
    tri = fake("triton")
    forward, backward = table({"triton": {(N, K): {1: 3.0}}}), table({"triton": {(N, K): {1: 3.0}}})
    row = backward["groups"][0]["shapes"][f"{N},{K}"]["1"]
    row["config"] = dict(reversed(list(row["config"].items())))
    plans = [build_plan(_problem(), [tri], CPU, estimator(Measurements("cpu", [t], {"triton": {"torch": "2.13.0+cpu"}})))
             for t in (forward, backward)]
    assert list(plans[0].route(1).config) != list(plans[1].route(1).config)  # the same configuration, keys in another order
    assert plans[0].fingerprint() == plans[1].fingerprint()
    assert len(plans[0].fingerprint()) == 16 and int(plans[0].fingerprint(), 16) >= 0


def test_summary_merges_by_backend_and_describe_by_decision() -> None:
    """M=1 measured for b, the rest by rule: one range in the summary, two in describe()."""
    a, b, c = fake("a", layout_name="copy-a"), fake("b", max_m=4096), fake("c", max_m=64)
    meas = measurements({"b": {(N, K): {1: 1.0}}, "c": {(N, K): {1: 2.0}}})
    plan = build_plan(_problem(), [b, c, a], CPU, estimator(meas), max_weight_copies=None)
    assert plan.summary() == "M 1-4096: b, M >= 4097: a"
    only = build_plan(_problem(), [c], CPU, estimator(None))
    assert only.summary() == "M 1-64: c, M >= 65: none"
    lines = plan.describe().splitlines()
    assert lines[0] == "plan for N=256, K=384, block [128, 128]"  # no explicit choice
    assert lines[1].split(None, 4) == ["M", "1", "b", MEASURED, plan.route(1).detail]
    rule = lines[2].split()
    assert rule[:4] == ["M", "2-4096", "b", RULE] and rule[4:6] == ["at", "M=2:"]  # a merged range: whose detail
    assert lines[2].endswith(plan.route(2).detail)
    assert lines[3].split()[:4] == ["M", ">=", "4097", "a"] and "at M=" not in lines[3]
    assert lines[4:] == ["  weight layout 'checkpoint' (the checkpoint's) for b",
                         "  weight layout 'copy-a' (a copy) for a"]
    explicit = build_plan(_problem(), [b, c, a], CPU, estimator(meas), explicit="c").describe().splitlines()
    assert explicit[0].endswith(" (explicit choice: c)")
    assert any(line.split()[:4] == ["M", "65-4096", "b", GATE] for line in explicit)


def test_describe_lists_shared_weights_refusals_notes_and_unrunnable_ranges() -> None:
    class Broken(Fake):
        name = "broken"

        def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
            return Verdict.reject("requires nothing, found something")

    a, b = fake("a", layout_name="fnuz", max_m=64), fake("b", layout_name="fnuz", max_m=64)
    meas = measurements({"a": {(N, K): {1: 1.0}}, "b": {(N, K): {2: 1.0}}})
    plan = build_plan(_problem(), [Broken(), a, b], CPU, estimator(meas))
    lines = plan.describe().splitlines()
    assert plan.backends == ("a", "b") and "  weight layout 'fnuz' (a copy) for a, b" in lines
    assert "  not for this layer: broken: requires nothing, found something" in lines
    assert sum("not for this layer" in line for line in lines) == 1  # the accepted a and b are not listed
    none = next(line for line in lines if line.split()[:3] == ["M", ">=", "65"])
    assert none.split()[3:5] == ["-", GATE]
    assert len(lines) == 1 + len(plan.ranges()) + 1 + 1  # header, ranges, one weight, one refusal
    kept = build_plan(_problem(), [Broken(), a, b], CPU, estimator(meas), max_weight_copies=0, explicit="a")
    lines = kept.describe().splitlines()
    assert lines[-1] == f"  note: {kept.notes[0]}" and "explicit choice 'a'" in kept.notes[0]


def test_a_backend_that_wins_by_a_hair_is_left_out_for_its_start_up() -> None:
    """A backend whose every bucket another backend of the plan runs at most HAIR slower is not used (its
    import and JIT cost start-up); one that wins by more somewhere is kept, and so is an explicit choice."""
    from fp8select.plan import HAIR

    a, b, c = fake("a"), fake("b"), fake("c")
    def rows(c_at_64: float) -> dict[str, dict[tuple[int, int], dict[int, float]]]:
        return {"a": {(N, K): {m: 10.0 if m <= 16 else 30.0 for m in M_BUCKETS}},
                "b": {(N, K): {m: 20.0 if m <= 16 else 10.0 for m in M_BUCKETS}},
                "c": {(N, K): {m: c_at_64 if m == 64 else 50.0 for m in M_BUCKETS}}}

    hair = build_plan(_problem(), [a, b, c], CPU, estimator(measurements(rows(10.0 / (1 + HAIR / 2)))))
    assert hair.backends == ("a", "b") and hair.route(64).backend == "b"
    assert any("c left out" in note and "M 33-64: b +1.0%" in note for note in hair.notes), hair.notes
    clear = build_plan(_problem(), [a, b, c], CPU, estimator(measurements(rows(10.0 / (1 + 2 * HAIR)))))
    assert clear.backends == ("a", "b", "c") and clear.route(64).backend == "c" and not clear.notes
    explicit = build_plan(_problem(), [a, b, c], CPU, estimator(measurements(rows(10.0 / (1 + HAIR / 2)))),
                          explicit="c")
    assert "c" in explicit.backends


def test_a_near_tie_between_two_buckets_of_one_backend_goes_to_that_backend() -> None:
    """A bucket whose measured winner leads by at most HAIR the backend that runs the buckets on both sides
    (the one bucket next to it, at the ends) runs that backend; by more, or where either time there is modelled or that backend is
    gated, or with an explicit choice, the winner stays."""
    from fp8select.measured.model import Estimate
    from fp8select.plan import HAIR, _smoothed
    from fp8select.routes import Route

    a, b = fake("a"), fake("b")
    near, clear = 10.0 / (1 + HAIR / 2), 10.0 / (1 + 2 * HAIR)

    def b_rows(at: dict[int, float]) -> dict[int, float]:  # b: 5 us at M 8192 (kept for it), 12 elsewhere
        return {m: at.get(m, 5.0 if m == 8192 else 12.0) for m in M_BUCKETS}

    def plan_with(at: dict[int, float]) -> Any:
        rows = {"a": {(N, K): {m: 10.0 for m in M_BUCKETS}}, "b": {(N, K): b_rows(at)}}
        return build_plan(_problem(), [a, b], CPU, estimator(measurements(rows)))

    tie = plan_with({32: near})  # b leads a at M 17-32 by 1%, a runs M 9-16 and 33-64
    assert tie.route(32).backend == "a" and tie.route(32).us == 10.0 and tie.route(32).why == MEASURED
    assert "within 2% of b (9.9 us)" in tie.route(32).detail
    assert tie.summary() == "M 1-4096: a, M >= 4097: b"
    assert plan_with({32: clear}).route(32).backend == "b"  # by 4%: a real lead
    first = plan_with({1: near}).route(1)  # the first bucket has one neighbour, which decides
    assert first.backend == "a" and "which the bucket next to it does not run" in first.detail
    assert plan_with({1: clear}).route(1).backend == "b"
    assert plan_with({1: near, 2: near}).summary() == "M 1-2: b, M 3-4096: a, M >= 4097: b"
    # The last bucket: a near tie there goes to a, which runs the one below (b kept for its lead at M 1).
    assert plan_with({1: 5.0, 8192: near}).summary() == "M 1: b, M >= 2: a"
    assert plan_with({16: near, 32: near}).summary() == "M 1-8: a, M 9-32: b, M 33-4096: a, M >= 4097: b"
    # Modelled times (a shape no table holds) are left as they are: their error is larger than HAIR.
    routes = [Route(m, "b" if m == 32 else "a", MODEL if m == 32 else MEASURED, "", None, 9.9 if m == 32 else 10.0)
              for m in M_BUCKETS]
    estimates = {("a", 32): Estimate(10.0, MEASURED, "")}
    assert _smoothed(routes, estimates, {})[M_BUCKETS.index(32)].backend == "b"
    routes[M_BUCKETS.index(32)] = replace(routes[M_BUCKETS.index(32)], why=MEASURED)
    assert _smoothed(routes, estimates, {})[M_BUCKETS.index(32)].backend == "a"
    assert _smoothed(routes, {("a", 32): Estimate(10.0, MODEL, "")}, {})[M_BUCKETS.index(32)].backend == "b"
    assert _smoothed(routes, estimates, {("a", 32): "gated"})[M_BUCKETS.index(32)].backend == "b"
    # At most HAIR: a lead of exactly HAIR goes too; the route takes the neighbour's row, its configuration with it.
    at_hair = {("a", 32): Estimate(9.9 * (1 + HAIR), MEASURED, "row", {"BLOCK_M": 64}, (N, K))}
    smoothed = _smoothed(routes, at_hair, {})[M_BUCKETS.index(32)]
    assert (smoothed.backend, smoothed.config, smoothed.us) == ("a", {"BLOCK_M": 64}, 9.9 * (1 + HAIR))
    assert _smoothed(routes, {("a", 32): replace(at_hair[("a", 32)], us=9.9 * (1 + HAIR) * 1.0001)},
                     {})[M_BUCKETS.index(32)].backend == "b"
    explicit = build_plan(_problem(), [a, b], CPU, estimator(measurements(
        {"a": {(N, K): {m: 10.0 for m in M_BUCKETS}}, "b": {(N, K): b_rows({32: near})}})), explicit="a")
    assert explicit.route(32).backend == "a" and explicit.route(32).why == EXPLICIT
