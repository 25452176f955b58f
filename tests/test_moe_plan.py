"""MoE plans (:func:`fp8select.moe_plan.build_moe_plan`): per M bucket the route, why, its launch
configuration and its detail, the gates' verdicts, and batch-invariant plans, over the real backends'
declarations and over small backends whose gates each test sets (``_Gated``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from fp64_moe_reference import random_moe, random_routing
from matrix import MATRIX
from test_cli_moe import DG_MOE

from fp8select import BatchInvariantError, InvalidInputError, NoBackendError, UnsupportedProblemError, resolve
from fp8select.backends.moe import MoeBackend, MoeProblem, ReferenceMoe, TritonMoe
from fp8select.backends.moe_deepgemm import DeepGemmMoe
from fp8select.buckets import M_BUCKET_MAX, M_BUCKETS
from fp8select.kernels.moe_config import default_config
from fp8select.measured.invariance import POSITIONS, Invariance, Record, merge_records
from fp8select.measured.moe import MoeMeasurements
from fp8select.measured.moe_model import MoeEstimate
from fp8select.measured.table import backend_versions
from fp8select.moe_plan import EXPLICIT, GATE, INVARIANT, MEASURED, MODEL, RULE, build_moe_plan
from fp8select.moe_select import moe_chain
from fp8select.verdict import Verdict

CPU = MATRIX["cpu-only"][0]
E, H, INTER, K = 4, 256, 128, 2
LAYER = MoeProblem(E, H, INTER, K)


def test_plan_rule_measured_and_explicit() -> None:
    problem = MoeProblem(256, 7168, 2048, 8)
    chain = [DeepGemmMoe(), TritonMoe(), ReferenceMoe()]
    plan = build_moe_plan(problem, chain, DG_MOE)
    assert plan.route(64).layout == "masked" and plan.route(65).layout == "contiguous"
    assert {r.why for r in plan.routes} == {RULE} and plan.backends == ("deepgemm",)
    measured = {"triton/sorted": {1: {"us": 10.0, "config": None}}, "deepgemm/masked": {"1": {"us": 12.0}}}
    plan = build_moe_plan(problem, chain, DG_MOE, measured=measured)
    assert (plan.route(1).backend, plan.route(1).why) == ("triton", MEASURED)
    assert "deepgemm/masked 12.0" in plan.route(1).detail and plan.route(2).backend == "deepgemm"
    assert build_moe_plan(problem, chain, DG_MOE, explicit="triton").backends == ("triton",)
    assert "M 1-64: deepgemm/masked, M >= 65: deepgemm/contiguous" == build_moe_plan(problem, chain, DG_MOE).summary()


def _table(times: dict[str, float], buckets: tuple[int, ...] = (1, 2, 64, 4096)) -> MoeMeasurements:
    """Rows at E 8 and 32 (H 7168, I 2048 and 200, k 8): each route at a fixed time per bucket."""
    shapes = ("8,7168,2048,8", "32,7168,2048,8", "8,7168,200,8", "32,7168,200,8")
    entries = [{"backend": route.split("/")[0], "layout": route.split("/")[1], "versions": {"torch": "2.11.0"},
                "shapes": {s: {str(b): {"us": us} for b in buckets} for s in shapes}} for route, us in times.items()]
    return MoeMeasurements([{"moe": entries}], {})


def test_plan_models_the_buckets_no_row_measures() -> None:
    problem = MoeProblem(16, 7168, 2048, 8)  # between the measured E 8 and 32: equal shares
    chain = [DeepGemmMoe(), TritonMoe(), ReferenceMoe()]
    table = _table({"deepgemm/masked": 200.0, "deepgemm/contiguous": 300.0, "triton/sorted": 100.0})
    estimated = table.estimates(16, 7168, 2048, 8)
    assert "reference/sorted" not in estimated  # never measured: no estimate
    plan = build_moe_plan(problem, chain, DG_MOE, estimated=estimated)
    first = plan.route(1)
    assert (first.backend, first.layout, first.why) == ("triton", "sorted", MODEL)
    assert first.detail.startswith(f"modelled {first.us:.1f} us, 1.00x the fastest route, from 4 measured shapes E,H,I,k (")
    assert "8,7168,2048,8 " in first.detail and "32,7168,2048,8 " in first.detail
    assert "(others: deepgemm/masked " in first.detail and first.config is not None  # Triton's default configuration
    assert plan.route(64).why == MODEL and plan.route(4096).backend == "triton"
    # a bucket no shape was measured at, between measured ones: interpolated from them; beyond them: the rule
    assert (plan.route(8).backend, plan.route(8).why) == ("triton", MODEL) and "none measured at M 8" in plan.route(8).detail
    assert (plan.route(8192).why, plan.route(8192).layout) == (RULE, "contiguous")
    assert "model" in plan.describe() and plan.to_dict()["routes"][0]["why"] == MODEL
    # a measured row wins over every estimate, however slow; the buckets it lacks stay modelled
    measured = {"deepgemm/contiguous": {1: {"us": 1000.0}}}
    plan = build_moe_plan(problem, chain, DG_MOE, measured=measured, estimated=estimated)
    assert (plan.route(1).backend, plan.route(1).layout, plan.route(1).why) == ("deepgemm", "contiguous", MEASURED)
    assert (plan.route(2).backend, plan.route(2).why) == ("triton", MODEL)
    # the explicit choice wins over both
    plan = build_moe_plan(problem, chain, DG_MOE, estimated=estimated, explicit="deepgemm")
    assert plan.backends == ("deepgemm",) and {r.why for r in plan.routes} == {EXPLICIT}


def test_the_model_ranks_by_skewed_routing_too_where_the_rows_hold_it() -> None:
    """Triton 5% ahead under uniform routing but 40% behind under skew at the measured shapes: modelled from
    rows with both times, the plan runs DeepGEMM masked, as it would at a measured bucket; from the uniform
    times alone (or where a route has no skewed time), Triton."""
    chain = [DeepGemmMoe(), TritonMoe(), ReferenceMoe()]
    shapes = ("8,7168,2048,8", "32,7168,2048,8")
    times = {"deepgemm/masked": (105.0, 50.0), "triton/sorted": (100.0, 70.0)}

    def table(skewed: set[str]) -> MoeMeasurements:
        rows = {route: {s: {"1": {"us": u, **({"skewed_us": k} if route in skewed else {})}} for s in shapes}
                for route, (u, k) in times.items()}
        return MoeMeasurements([{"moe": [{"backend": r.split("/")[0], "layout": r.split("/")[1], "versions": {},
                                          "shapes": by_shape} for r, by_shape in rows.items()]}], {})

    problem = MoeProblem(16, 7168, 2048, 8)
    both = table(set(times)).estimates(16, 7168, 2048, 8)
    assert both["triton/sorted"][1].skewed_us == pytest.approx(70.0 * both["triton/sorted"][1].us / 100.0, rel=0.01)
    assert "; under skewed routing " in both["triton/sorted"][1].detail
    route = build_moe_plan(problem, chain, DG_MOE, estimated=both).route(1)
    assert (route.backend, route.layout, route.why) == ("deepgemm", "masked", MODEL)
    for skewed in (set(), {"deepgemm/masked"}):
        estimated = table(skewed).estimates(16, 7168, 2048, 8)
        assert (build_moe_plan(problem, chain, DG_MOE, estimated=estimated).route(1).backend) == "triton"


def test_the_model_chooses_among_the_routes_the_gates_accept() -> None:
    chain = [DeepGemmMoe(), TritonMoe(), ReferenceMoe()]
    table = _table({"deepgemm/masked": 50.0, "deepgemm/contiguous": 60.0, "triton/sorted": 100.0})
    plan = build_moe_plan(MoeProblem(16, 7168, 2048, 8), chain, DG_MOE, estimated=table.estimates(16, 7168, 2048, 8))
    # modelled at M 1, 2, 64 and 4096 and the buckets between (interpolated), the rule beyond 4096
    assert plan.summary() == "M 1-4096: deepgemm/masked, M >= 4097: deepgemm/contiguous"
    assert (plan.route(4096).layout, plan.route(4096).why) == ("masked", MODEL)  # the rule would run contiguous
    # I = 200: DeepGEMM's gate rejects the layer, so its (faster) estimates are not chosen from
    odd = MoeProblem(16, 7168, 200, 8)
    plan = build_moe_plan(odd, chain, DG_MOE, estimated=table.estimates(16, 7168, 200, 8))
    assert plan.route(1).why == MODEL and plan.backends == ("triton",)
    assert "not for this layer: deepgemm: requires I % 128 == 0" in plan.describe()
    # only DeepGEMM estimated, and rejected: the rule among the rest
    only = _table({"deepgemm/masked": 50.0})
    plan = build_moe_plan(odd, chain, DG_MOE, estimated=only.estimates(16, 7168, 200, 8))
    assert {r.why for r in plan.routes} == {RULE} and plan.backends == ("triton",)


def test_plan_gates_say_why() -> None:
    odd = MoeProblem(8, 7168, 200, 8)
    plan = build_moe_plan(odd, [DeepGemmMoe(), ReferenceMoe()], DG_MOE)
    assert plan.backends == ("reference",)
    assert "requires I % 128 == 0" in plan.describe()
    with pytest.raises(UnsupportedProblemError, match="requires block size"):
        build_moe_plan(dataclasses.replace(odd, block_size=(1, 32)), [DeepGemmMoe()], DG_MOE)


def test_the_selection_explains_moe_plans_and_says_when_no_backend_runs() -> None:
    sel = resolve(DG_MOE, plugins=False, verify=False)
    text = sel.moe_plan_for(32, 7168, 2048, 8).describe()
    assert "deepgemm/masked" in text and "deepgemm/contiguous" in text
    assert "MoE plan for E=32, H=7168, I=2048, k=8" in text
    with pytest.raises(NoBackendError, match="MoE experts layers"):
        moe_chain(dataclasses.replace(resolve(CPU, plugins=False), disabled=("reference",)))


class _DecodeOnly(ReferenceMoe):
    name = "decode-only"

    def supports(self, problem, caps, layout):  # type: ignore[no-untyped-def]
        verdict = super().supports(problem, caps, layout)
        if verdict.ok and problem.m is not None and problem.m > 64:
            return type(verdict).reject(f"requires M <= 64, found M={problem.m}")
        return verdict


def test_a_bucket_the_first_backend_rejects_is_routed_by_the_gate_saying_why() -> None:
    from fp8select.moe_plan import GATE

    problem = MoeProblem(E, H, INTER, K)
    plan = build_moe_plan(problem, [_DecodeOnly(), ReferenceMoe()], CPU)
    assert (plan.route(64).backend, plan.route(64).why) == ("decode-only", RULE)
    route = plan.route(65)
    assert (route.backend, route.why) == ("reference", GATE) and "decode-only: requires M <= 64, found M=65" in route.detail
    alone = build_moe_plan(problem, [_DecodeOnly()], CPU)
    assert alone.route(65).backend is None and alone.route(65).why == GATE
    assert "no backend accepts this M: decode-only: requires M <= 64" in alone.route(65).detail
    assert "M >= 65        -                          gate" in alone.describe()



class _Gated(MoeBackend):
    """A backend whose gates the test sets: ``refuse`` maps a layout to the (lo, hi) range of M it rejects,
    ``device`` the device kind its gate reads from the capabilities the plan passes. Its default
    configuration names the layout and bucket it was asked for; a measured row's is ``("row", ...)``."""

    def __init__(self, name: str, layouts: tuple[str, ...] = ("sorted",), refuse: dict[str, tuple[int, int]] | None = None,
                 device: str | None = None) -> None:
        self.name, self.layouts, self.refuse, self.device = name, layouts, refuse or {}, device  # type: ignore[misc]

    def supports(self, problem: MoeProblem, caps: Any, layout: str) -> Verdict:
        verdict = super().supports(problem, caps, layout)
        if self.device is not None and caps.device_kind != self.device:
            return Verdict.reject(f"requires device {self.device}, found {caps.device_kind}")
        lo, hi = self.refuse.get(layout, (0, -1))
        if verdict.ok and problem.m is not None and lo <= problem.m <= hi:
            return Verdict.reject(f"requires M outside {lo}-{hi}, found M={problem.m}")
        return verdict

    def default_config(self, problem: MoeProblem, layout: str, bucket: int) -> Any:
        return ("default", layout, bucket)

    def launch_config(self, config: Any) -> Any:
        return ("row", tuple(sorted(config.items())))


def _rows(**times: dict[int, float]) -> dict[str, dict[int, dict[str, Any]]]:
    """Measured rows without configurations: ``a_sorted={1: 10.0}`` -> ``{"a/sorted": {1: {"us": 10.0}}}``."""
    return {name.replace("_", "/"): {b: {"us": us} for b, us in by_bucket.items()} for name, by_bucket in times.items()}


def _estimate(us: float) -> MoeEstimate:
    return MoeEstimate(us, f"modelled {us:.1f} us", ())


def test_ties_go_to_the_priority_order_then_to_the_layout_order() -> None:
    """Equal times: the backend first in priority order ("zeta" before "alpha"), and of its layouts the
    first declared ("masked" before "contiguous"); measured or modelled alike."""
    chain = [_Gated("zeta", ("masked", "contiguous")), _Gated("alpha")]
    every = {bucket: 10.0 for bucket in M_BUCKETS}
    plan = build_moe_plan(LAYER, chain, CPU, measured=_rows(alpha_sorted=every, zeta_contiguous=every, zeta_masked=every))
    assert plan.summary() == "any M: zeta/masked" and plan.route(1).why == MEASURED
    estimates = {name: {1: _estimate(10.0)} for name in ("alpha/sorted", "zeta/contiguous", "zeta/masked")}
    route = build_moe_plan(LAYER, chain, CPU, estimated=estimates).route(1)
    assert (route.backend, route.layout, route.why) == ("zeta", "masked", MODEL)


def test_a_measured_or_modelled_route_says_its_time_and_the_next_three() -> None:
    chain = [_Gated("a", ("x", "y", "z")), _Gated("b", ("x", "y"))]
    rows = _rows(a_x={1: 5.0, 2: 3.0}, a_y={1: 2.0}, a_z={1: 4.0}, b_x={1: 1.0}, b_y={1: 3.0})
    rows["a/x"][2]["config"] = {"tile": 64}
    plan = build_moe_plan(LAYER, chain, CPU, measured=rows)
    first = plan.route(1)
    assert (first.backend, first.layout, first.us, first.config) == ("b", "x", 1.0, ("default", "x", 1))
    assert first.detail == "measured 1.0 us (others: a/y 2.0, b/y 3.0, a/z 4.0 us)"  # a/x 5.0: the fifth
    second = plan.route(2)  # the only row there: no others; its own configuration
    assert (second.detail, second.us, second.config) == ("measured 3.0 us", 3.0, ("row", (("tile", 64),)))
    estimates = {"a/x": {1: _estimate(5.0), 2: _estimate(6.0)}, "a/y": {1: _estimate(2.0)}, "a/z": {1: _estimate(4.0)},
                 "b/x": {1: _estimate(1.0)}, "b/y": {1: _estimate(3.0)}}
    plan = build_moe_plan(LAYER, chain, CPU, estimated=estimates)
    assert (plan.route(1).us, plan.route(1).config) == (1.0, ("default", "x", 1))
    assert plan.route(1).detail == "modelled 1.0 us (others: a/y 2.0, b/y 3.0, a/z 4.0 us)"
    assert (plan.route(2).detail, plan.route(2).us) == ("modelled 6.0 us", 6.0)


def test_a_bucket_won_by_a_hair_goes_to_the_route_around_it() -> None:
    """A measured winner at most 2% ahead of the route (backend and layout) that runs the buckets on both sides
    goes to that route, with that route's row; an end bucket follows its one neighbour. Not past 2%, nor where
    the neighbours differ, nor to a layout or backend the gates reject there, nor to a route with no row there,
    nor from a modelled bucket."""
    chain = [_Gated("a", ("x", "y"), refuse={"y": (17, 32)}), _Gated("b")]
    b_wins = {2: 98.5, 8: 100.0, 32: 99.0, 128: 95.0, 512: 99.0, 4096: 99.0, 8192: 90.0}
    rows = _rows(a_y={bucket: 102.0 if bucket == 8 else 100.0 for bucket in M_BUCKETS},
                 b_sorted={bucket: b_wins.get(bucket, 110.0) for bucket in M_BUCKETS})
    rows["a/y"][2]["config"] = {"tile": 32}
    plan = build_moe_plan(LAYER, chain, CPU, measured=rows)
    second = plan.route(2)
    assert (second.backend, second.layout, second.why, second.us) == ("a", "y", MEASURED, 100.0)
    assert second.config == ("row", (("tile", 32),))  # the row's own configuration
    assert second.detail == "measured 100.0 us, within 2% of b/sorted (98.5 us), which the buckets on both sides do not run"
    assert (plan.route(8).backend, plan.route(8).config) == ("a", ("default", "y", 8))  # exactly 2% ahead
    assert plan.route(32).backend == "b"  # a/y's gate rejects M 17-32 (a/x has no row)
    assert plan.route(128).backend == "b"  # 5% ahead
    assert plan.route(512).backend == "a"
    assert plan.route(4096).backend == "b"  # the buckets around it run a/y and b/sorted
    assert plan.summary() == "M 1-16: a/y, M 17-32: b/sorted, M 33-64: a/y, M 65-128: b/sorted, M 129-2048: a/y, " \
        "M >= 2049: b/sorted"
    # the first and last buckets follow the one next to them
    plain = [_Gated("a", ("x", "y")), _Gated("b")]
    ends = build_moe_plan(LAYER, plain, CPU, measured=_rows(a_y={b: 100.0 for b in M_BUCKETS},
                                                            b_sorted={1: 99.0, 4: 50.0, 8192: 99.0}))
    assert ends.summary() == "M 1-2: a/y, M 3-4: b/sorted, M >= 5: a/y"
    assert [(r.detail, r.config) for r in (ends.route(1), ends.route(8192))] == [
        ("measured 100.0 us, within 2% of b/sorted (99.0 us), which the bucket next to it does not run",
         ("default", "y", bucket)) for bucket in (1, 8192)]
    inner = build_moe_plan(LAYER, plain, CPU, measured=_rows(a_y={b: 100.0 for b in M_BUCKETS}, b_sorted={4096: 99.0}))
    assert inner.route(4096).detail.endswith("which the buckets on both sides do not run")  # the last inner bucket
    # a backend none of whose layouts runs the bucket: the winner stays
    chain = [_Gated("c", refuse={"sorted": (3, 4)}), _Gated("b")]
    plan = build_moe_plan(LAYER, chain, CPU, measured=_rows(c_sorted={2: 50.0, 8: 50.0}, b_sorted={4: 60.0}))
    assert [plan.route(m).backend for m in (2, 4, 8)] == ["c", "b", "c"]
    # no row of the neighbours' route at the bucket: the winner stays
    plan = build_moe_plan(LAYER, plain, CPU, measured=_rows(a_y={1: 10.0, 4: 10.0}, b_sorted={2: 9.9}))
    assert [plan.route(m).backend for m in (1, 2, 4)] == ["a", "b", "a"]
    # modelled buckets are left as they are
    estimates = {"a/y": {b: _estimate(10.0) for b in (1, 2, 4)}, "b/sorted": {2: _estimate(9.9)}}
    plan = build_moe_plan(LAYER, plain, CPU, estimated=estimates)
    assert [(plan.route(m).backend, plan.route(m).why) for m in (1, 2, 4)] == [("a", MODEL), ("b", MODEL), ("a", MODEL)]


def test_routes_timed_under_skew_too_rank_by_the_worse_standing() -> None:
    """Where every route of a bucket has a time under skewed routing, the one whose worse ratio to the fastest
    (uniform or skewed) is least runs it, and its detail gives both times; where one route lacks it, time under
    uniform routing decides. The smoothing compares the same standings."""
    chain = [_Gated("a", ("x", "y")), _Gated("b")]
    rows: dict[str, Any] = _rows(a_x={1: 10.0, 2: 10.0}, a_y={1: 10.3, 2: 10.3}, b_sorted={1: 11.0, 2: 11.0})
    for bucket, skewed in ((1, {"a/x": 30.0, "a/y": 12.0, "b/sorted": 11.0}), (2, {"a/x": 30.0, "a/y": 12.0})):
        for name, us in skewed.items():
            rows[name][bucket]["skewed_us"] = us
    plan = build_moe_plan(LAYER, chain, CPU, measured=rows)
    first = plan.route(1)  # a/x 2.7x behind under skew, a/y 1.09x, b/sorted 1.1x under uniform routing
    assert (first.backend, first.layout, first.us) == ("a", "y", 10.3)
    assert first.detail == "measured 10.3 us, 12.0 us skewed (others: b/sorted 11.0/11.0, a/x 10.0/30.0 us uniform/skewed)"
    second = plan.route(2)  # b/sorted has no skewed time there
    assert (second.backend, second.layout, second.detail) == ("a", "x", "measured 10.0 us (others: a/y 10.3, b/sorted 11.0 us)")
    # equal standings: the faster under uniform routing, then the priority and layout order
    tie = _rows(a_x={b: 11.0 for b in M_BUCKETS}, a_y={b: 10.0 for b in M_BUCKETS})
    for bucket in M_BUCKETS:
        tie["a/x"][bucket]["skewed_us"], tie["a/y"][bucket]["skewed_us"] = 10.0, 11.0
    assert build_moe_plan(LAYER, chain, CPU, measured=tie).summary() == "any M: a/y"
    # times under 1 us count; a time of 0 is no time (uniform routing decides)
    small = _rows(a_x={1: 0.4}, a_y={1: 0.5}, b_sorted={1: 0.6})
    for name, us in (("a/x", 0.9), ("a/y", 0.5), ("b/sorted", 0.6)):
        small[name][1]["skewed_us"] = us
    assert build_moe_plan(LAYER, chain, CPU, measured=small).route(1).layout == "y"
    small["b/sorted"][1]["skewed_us"] = 0
    assert build_moe_plan(LAYER, chain, CPU, measured=small).route(1).layout == "x"
    # a/y's standing at M 2 (1.03x) is not within 2% of a/x's: M 2 is not smoothed to the M 1 and M 4 route
    rows["a/y"][4] = {"us": 10.0}
    assert build_moe_plan(LAYER, chain, CPU, measured=rows).route(2).layout == "x"
    rows["a/y"][2]["us"] = 10.1  # 1.01x now
    smoothed = build_moe_plan(LAYER, chain, CPU, measured=rows).route(2)
    assert (smoothed.layout, smoothed.detail) == (
        "y", "measured 10.1 us, within 2% of a/x (10.0 us), which the buckets on both sides do not run")
    rows["b/sorted"][2]["skewed_us"], rows["a/x"][2]["skewed_us"] = 11.0, 11.9  # every route with skew: a/y leads
    rows["a/y"][2]["skewed_us"] = 12.0  # a/x by 0.8%
    smoothed = build_moe_plan(LAYER, chain, CPU, measured=rows).route(2)
    assert (smoothed.layout, smoothed.detail) == (
        "y", "measured 10.1 us, 12.0 us skewed, within 2% of a/x (10.0 us), which the buckets on both sides do not run")


def test_rows_without_a_time_are_not_measurements() -> None:
    """A row whose ``us`` is missing or not a number (a failed check's row) plans nothing."""
    rows: dict[str, Any] = {"a/sorted": {1: {"error": "wrong numbers"}, 2: {"us": "fast"}, 4: {"us": None}, 8: "7.0"}}
    plan = build_moe_plan(LAYER, [_Gated("a")], CPU, measured=rows)
    assert [plan.route(m).why for m in (1, 2, 4, 8)] == [RULE] * 4


BAD_ROWS = {
    "not a mapping": ([{"us": 1.0}], r"measured: expected a mapping of 'backend/layout' to M buckets, found list"),
    "unknown route": ({"triton/sortd": {1: {"us": 1.0}}},
                      r"no MoE backend declares route 'triton/sortd'; the routes are aiter/fused, cuda-scaled-grouped-mm/sorted, "),
    "rows not a mapping": ({"triton/sorted": ({"us": 1.0},)}, r"measured\['triton/sorted'\]: expected a mapping of M buckets to "
                                                              r"rows, found tuple"),
    "not a bucket": ({"triton/sorted": {3: {"us": 1.0}}}, r"expected M buckets 1, 2, 4, \.\.\., 8192, found 3"),
    "bool bucket": ({"triton/sorted": {True: {"us": 1.0}}}, r"found True"),
    "no time": ({"triton/sorted": {1: {"m": 1}}}, r"\[1\]: unknown key\(s\) 'm'"),
    "negative": ({"deepgemm/masked": {"2": {"us": -3}}}, r"\['2'\]\.us: expected a positive finite number"),
    "skew nan": ({"deepgemm/masked": {2: {"us": 3.0, "skewed_us": float("nan")}}}, r"\.skewed_us: expected a positive"),
    "bad config": ({"triton/sorted": {8: {"us": 3.0, "config": {"BLOCK_M": 3}}}}, r"\[8\]\.config: MoeTritonConfig keys"),
    "vendor config": ({"deepgemm/masked": {8: {"us": 3.0, "config": {}}}}, r"expected no configuration for backend 'deepgemm'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_rows_a_user_gives_are_checked_as_a_tables_rows(case: str) -> None:
    """``moe_plan_for(measured=...)`` and ``prepare_moe(measured=...)`` say what is wrong with rows given to
    them, where the plan would have read such a row as no measurement and planned by the rule silently."""
    rows, message = BAD_ROWS[case]
    with pytest.raises(InvalidInputError, match=message):
        resolve(DG_MOE, plugins=False, verify=False).moe_plan_for(32, 7168, 2048, 8, measured=rows)
    with pytest.raises(InvalidInputError, match=message):
        resolve(CPU, plugins=False).prepare_moe(*random_moe(E, H, INTER, seed=0).weights(), top_k=K, measured=rows)


def test_rows_a_user_gives_are_planned_from_a_copy() -> None:
    """String and int buckets plan alike, a route this machine does not run is kept and never read, and
    rows changed after ``prepare_moe`` do not change the plans it makes later (for another top-k)."""
    plan = resolve(DG_MOE, plugins=False, verify=False).moe_plan_for(
        32, 7168, 2048, 8, measured={"triton/sorted": {"1": {"us": 10.0}}, "deepgemm/masked": {1: {"us": 12.0}},
                                     "aiter/fused": {1: {"us": 1.0}}})
    assert (plan.route(1).backend, plan.route(1).why, plan.route(2).why) == ("triton", MEASURED, RULE)
    rows: dict[str, Any] = {"reference/sorted": {1: {"us": 5.0}}}
    moe = resolve(CPU, plugins=False).prepare_moe(*random_moe(E, H, INTER, seed=0).weights(), top_k=K, measured=rows)
    rows["reference/sorted"][1]["us"] = 7.0
    rows["reference/sorted"][2] = {"us": 9.0}
    w, ids = random_routing(2, 1, E, seed=1)
    moe(torch.randn(2, H).to(torch.bfloat16), w, ids)
    later = moe.plans[(torch.bfloat16, 1)]
    assert (later.route(1).detail, later.route(2).why) == ("measured 5.0 us", RULE)


def test_the_rule_and_the_explicit_choice_take_the_layouts_that_run_the_bucket() -> None:
    """DeepGEMM's pair of layouts: masked up to M 64, contiguous above, unless the other one alone runs
    the bucket; the explicit choice the same way, with its default configuration."""
    both = _Gated("dg", ("contiguous", "masked"), refuse={"masked": (1, 2), "contiguous": (4097, M_BUCKET_MAX)})
    plan = build_moe_plan(LAYER, [both, _Gated("other")], CPU)
    assert [plan.route(m).layout for m in (1, 2, 4, 64, 65, 4096, 8192)] == \
        ["contiguous", "contiguous", "masked", "masked", "contiguous", "contiguous", "masked"]
    route = plan.route(65)
    assert (route.why, route.detail, route.config) == (RULE, "first in priority order (no measurement)",
                                                       ("default", "contiguous", 128))
    plan = build_moe_plan(LAYER, [_Gated("other"), both], CPU, explicit="dg")
    route = plan.route(1)
    assert (route.backend, route.layout, route.why, route.detail, route.config) == (
        "dg", "contiguous", EXPLICIT, "the explicit choice", ("default", "contiguous", 1))
    assert plan.explicit == "dg" and plan.describe().splitlines()[0].endswith(" (explicit choice: dg)")


def test_an_explicit_choice_that_rejects_a_bucket_leaves_it_to_the_others() -> None:
    decode = _Gated("decode", refuse={"sorted": (65, M_BUCKET_MAX)})
    plan = build_moe_plan(LAYER, [_Gated("first"), decode], CPU, explicit="decode")
    assert (plan.route(64).backend, plan.route(64).why) == ("decode", EXPLICIT)
    assert (plan.route(65).backend, plan.route(65).why) == ("first", RULE)
    unknown = build_moe_plan(LAYER, [_Gated("first")], CPU, explicit="nope")  # not in the chain: no choice
    assert unknown.explicit is None and unknown.describe().splitlines()[0] == "MoE plan for E=4, H=256, I=128, k=2"


def test_routes_where_the_first_backend_or_every_backend_rejects_the_bucket() -> None:
    first = _Gated("first", refuse={"sorted": (65, M_BUCKET_MAX)})
    second = _Gated("second", refuse={"sorted": (4097, M_BUCKET_MAX)})
    plan = build_moe_plan(dataclasses.replace(LAYER, m=7), [first, second], CPU)
    assert plan.problem.m is None and [r.bucket for r in plan.routes] == list(M_BUCKETS)
    route = plan.route(65)
    assert (route.bucket, route.backend, route.layout, route.why, route.config) == (
        128, "second", "sorted", GATE, ("default", "sorted", 128))
    assert route.detail == "first in priority order that accepts this M (first: requires M outside 65-8192, found M=65)"
    none = plan.route(4097)
    assert (none.backend, none.layout, none.why, none.config) == (None, "", GATE, None)
    assert none.detail == ("no backend accepts this M: first: requires M outside 65-8192, found M=4097; "
                           "second: requires M outside 4097-8192, found M=4097")
    assert plan.summary() == "M 1-64: first/sorted, M 65-4096: second/sorted, M >= 4097: none"


def test_the_gates_are_asked_with_the_device_and_name_what_they_refused() -> None:
    """Every gate reads the capabilities the plan is given; a backend's candidate line joins its layouts'
    reasons; the ranks follow the chain."""
    cuda = _Gated("cuda-only", device="cuda")
    plan = build_moe_plan(LAYER, [cuda, _Gated("any")], DG_MOE)
    assert plan.backends == ("cuda-only",)
    plan = build_moe_plan(LAYER, [cuda, _Gated("two", ("x", "y")), _Gated("any")], CPU)
    assert plan.backends == ("two",)
    assert [(c.rank, c.name, c.accepted, c.reason) for c in plan.candidates] == [
        (1, "cuda-only", False, "requires device cuda, found cpu"),
        (2, "two", True, "supports MoE E=4, H=256, I=128, k=2, any M, block [128, 128], weight float8_e4m3fn, input "
                         "bfloat16 (x); supports MoE E=4, H=256, I=128, k=2, any M, block [128, 128], weight "
                         "float8_e4m3fn, input bfloat16 (y)"),
        (3, "any", True, "supports MoE E=4, H=256, I=128, k=2, any M, block [128, 128], weight float8_e4m3fn, input "
                         "bfloat16 (sorted)")]
    assert plan.describe().splitlines()[-1] == "  not for this layer: cuda-only: requires device cuda, found cpu"
    with pytest.raises(UnsupportedProblemError, match="MoE E=4, H=256, I=128, k=2, any M") as info:
        build_moe_plan(LAYER, [cuda], CPU)
    assert [c.reason for c in info.value.candidates] == ["requires device cuda, found cpu"]


class _Raises(_Gated):
    def supports(self, problem: MoeProblem, caps: Any, layout: str) -> Verdict:
        raise RuntimeError("boom")


def test_a_gate_that_raises_rejects_its_backend_saying_so() -> None:
    plan = build_moe_plan(LAYER, [_Raises("odd"), _Gated("any")], CPU)
    assert plan.backends == ("any",) and plan.candidates[0].reason == "its gate raised RuntimeError: boom"


def test_describe_summary_and_to_dict_of_a_plan() -> None:
    chain = [TritonMoe(), ReferenceMoe()]
    caps = MATRIX["h200-torch2.11"][0]
    plan = build_moe_plan(MoeProblem(32, 7168, 2048), chain, caps, measured={"triton/sorted": {1: {"us": 9.5}}})
    lines = plan.describe().splitlines()
    assert lines[0] == "MoE plan for E=32, H=7168, I=2048" and len(lines) == 1 + len(plan.ranges())
    assert lines[1].startswith("  M 1            triton/sorted              measured  [moe ") and lines[1].endswith(
        "] measured 9.5 us")
    route = plan.route(1)
    assert route.config == default_config(1, 1, 32)
    assert route.to_dict() == {"bucket": 1, "backend": "triton", "layout": "sorted", "why": MEASURED,
                               "detail": "measured 9.5 us", "config": route.config.to_dict(), "us": 9.5}
    data = plan.to_dict()
    assert {k: v for k, v in data.items() if k not in ("routes", "candidates")} == {
        "experts": 32, "hidden": 7168, "intermediate": 2048, "top_k": None, "explicit": None, "batch_invariant": None}
    assert data["routes"] == [r.to_dict() for r in plan.routes]
    assert data["candidates"] == [c.to_dict() for c in plan.candidates] and len(data["candidates"]) == 2


# -- batch-invariant plans -----------------------------------------------------------------------

SHAPE = (E, H, INTER, K)


def _invariance(caps: Any, chain: list[MoeBackend], *recorded: tuple[str, str, tuple[tuple[int, Any], ...]]) -> Invariance:
    """Records (backend, layout, schedule) of the experts op at ``SHAPE`` for every M and position."""
    packages = {b.name: b.packages for b in chain}
    records = [Record(name, backend_versions(caps, packages[name]), schedule, (SHAPE,), (1, M_BUCKET_MAX), POSITIONS,
                      True, layout=layout) for name, layout, schedule in recorded]
    return Invariance(caps, chain, [("test", merge_records(None, records, caps.device_name or ""))])


def _invariant(chain: list[MoeBackend], invariance: Invariance, **kwargs: Any) -> Any:
    return build_moe_plan(dataclasses.replace(LAYER, m=3), chain, DG_MOE, invariance=invariance, **kwargs)


ANY_CONFIG: tuple[tuple[int, Any], ...] = ((1, None),)


def test_an_invariant_plan_takes_the_least_time_counting_an_unmeasured_bucket_as_twice_the_slowest() -> None:
    a, b = _Gated("a"), _Gated("b")
    invariance = _invariance(DG_MOE, [a, b], ("a", "sorted", ANY_CONFIG), ("b", "sorted", ANY_CONFIG))
    half = dict.fromkeys(M_BUCKETS[::2], 6.0)
    # every bucket at 10 us against half of them at 6 (the rest counted as 12): b, second in priority order
    plan = _invariant([a, b], invariance, measured=_rows(a_sorted=dict.fromkeys(M_BUCKETS, 10.0), b_sorted=half))
    assert plan.summary() == "any M: b/sorted (batch-invariant)" and plan.problem.m is None
    assert {r.why for r in plan.routes} == {INVARIANT} and plan.invariant.startswith("b/sorted measured batch-invariant")
    # every bucket at 6 us against one at 4 (the rest counted as 8): a
    plan = _invariant([a, b], invariance, measured=_rows(a_sorted=dict.fromkeys(M_BUCKETS, 6.0), b_sorted={1: 4.0}))
    assert plan.backends == ("a",)
    # nothing measured: the first in priority order
    assert _invariant([b, a], invariance).backends == ("b",)


def test_an_invariant_plan_breaks_ties_by_priority_then_layout() -> None:
    two = _Gated("two", ("x", "y"))
    invariance = _invariance(DG_MOE, [two], ("two", "x", ANY_CONFIG), ("two", "y", ANY_CONFIG))
    plan = _invariant([two], invariance, measured=_rows(two_x={1: 5.0}, two_y={1: 5.0}))
    assert plan.summary() == "any M: two/x (batch-invariant)"


def test_an_invariant_route_keeps_its_records_configuration_and_is_timed_by_rows_of_it_only() -> None:
    a = _Gated("a")
    plain = _invariant([a], _invariance(DG_MOE, [a], ("a", "sorted", ANY_CONFIG)),
                       measured={"a/sorted": {1: {"us": 5.0}, 2: {"us": 4.0, "config": {"tile": 64}}}})
    assert {r.config for r in plain.routes} == {("default", "sorted", 1)}  # its one default, for every M
    assert (plain.route(1).us, plain.route(1).detail) == (5.0, "one kernel for every M; measured 5.0 us")
    assert (plain.route(2).us, plain.route(2).detail) == (None, "one kernel for every M; no time measured for it here")
    schedule = ((1, {"tile": 32}), (64, {"tile": 64}))
    tiled = _invariant([a], _invariance(DG_MOE, [a], ("a", "sorted", schedule)), measured={
        "a/sorted": {1: {"us": 5.0, "config": {"tile": 64}}, 2: {"us": 6.0}, 64: {"us": 7.0, "config": {"tile": 64}}}})
    assert [tiled.route(m).config for m in (1, 32, 64, 8192)] == [("row", (("tile", 32),))] * 2 + [("row", (("tile", 64),))] * 2
    assert [tiled.route(m).us for m in (1, 2, 64)] == [None, None, 7.0]
    triton = TritonMoe()  # a record without a configuration: the rule's at M 1 for this layer, at every M
    plan = _invariant([triton], _invariance(DG_MOE, [triton], ("triton", "sorted", ANY_CONFIG)))
    assert {r.config for r in plan.routes} == {default_config(1, K, E)}


def test_an_invariant_plan_honours_the_explicit_choice() -> None:
    """On a GPU the reference is invariant by construction but chosen only explicitly; an explicit choice
    refuses every other backend, recorded or not."""
    a = _Gated("a")
    invariance = _invariance(DG_MOE, [a, ReferenceMoe()], ("a", "sorted", ANY_CONFIG))
    assert _invariant([a, ReferenceMoe()], invariance).backends == ("a",)
    plan = _invariant([a, ReferenceMoe()], invariance, explicit="reference")
    assert plan.summary() == "any M: reference/sorted (batch-invariant)" and plan.explicit == "reference"
    assert plan.invariant.startswith("invariant by construction")
    with pytest.raises(BatchInvariantError) as info:
        _invariant([_Gated("b"), ReferenceMoe()], invariance, explicit="b")
    assert [(c.rank, c.name, c.accepted) for c in info.value.candidates] == [(1, "b/sorted", False),
                                                                              (2, "reference/sorted", False)]
    assert info.value.candidates[0].reason.startswith("no batch-invariance record on ")
    assert info.value.candidates[1].reason == "not the explicit choice (b)"
    assert "no backend runs MoE E=4, H=256, I=128, k=2, M=3, block [128, 128]" in str(info.value)


def test_a_recorded_route_whose_gate_rejects_a_bucket_is_not_invariant_for_every_m() -> None:
    decode = _Gated("decode", refuse={"sorted": (65, M_BUCKET_MAX)})
    invariance = _invariance(DG_MOE, [decode], ("decode", "sorted", ANY_CONFIG))
    with pytest.raises(BatchInvariantError) as info:
        _invariant([decode], invariance)
    assert [c.reason for c in info.value.candidates] == ["rejects M 65-128 (requires M outside 65-8192, found M=65)"]
    a = _Gated("a")
    both = _invariance(DG_MOE, [decode, a], ("decode", "sorted", ANY_CONFIG), ("a", "sorted", ANY_CONFIG))
    assert _invariant([decode, a], both).backends == ("a",)
