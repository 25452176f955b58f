"""The MoE model of :mod:`fp8select.measured.moe_model`, read through :class:`MoeMeasurements`: hand-made rows
where the documented formula gives an answer simple enough to state (a constant ratio between routes, a
constant multiple of the reference time, a shape halfway between two measured ones), which rows it uses,
and where it has no estimate."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fp8select.buckets import M_BUCKETS
from fp8select.measured.moe import MoeMeasurements
from fp8select.measured.moe_model import FIXED_US, MoeModel, moe_reference_us

V1, V2 = {"torch": "2.13.0+cpu"}, {"torch": "2.12.0+cpu"}
Shape = tuple[int, int, int, int]
SMALL, LARGE, MIDDLE = (8, 1024, 512, 8), (32, 1024, 512, 8), (16, 1024, 512, 8)  # MIDDLE: halfway in log2(M k / E)


def _entry(route: str, rows: dict[Shape, dict[int, float]], versions: dict[str, str] = V1) -> dict[str, Any]:
    backend, layout = route.split("/")
    return {"backend": backend, "layout": layout, "versions": versions, "shapes": {
        ",".join(map(str, s)): {str(b): {"us": us} for b, us in buckets.items()} for s, buckets in rows.items()}}


def _measurements(*entries: dict[str, Any], installed: dict[str, dict[str, str]] | None = None) -> MoeMeasurements:
    return MoeMeasurements([{"moe": list(entries)}], installed or {e["backend"]: V1 for e in entries})


def _ref(shape: Shape, bucket: int, factor: float) -> float:
    return factor * moe_reference_us(*shape, bucket)


def test_the_reference_time_is_the_floor_of_the_experts_touched_plus_launches() -> None:
    # one token with k=2 of 64 experts reads two experts' weights: 3 * 7168 * 2048 fp8 bytes each, plus scales
    one = moe_reference_us(64, 7168, 2048, 2, 1)
    weights = 2 * (3 * 7168 * 2048 + (32 * 56 + 56 * 16) * 4)
    assert one == pytest.approx((weights + 7168 * 4) / 4.3e12 * 1e6 + FIXED_US)
    # a large batch touches every expert and is compute-bound: 2 M k 3 H I FLOPs at the FP8 peak
    big = moe_reference_us(8, 7168, 2048, 8, 8192)
    assert big == pytest.approx(2 * 8192 * 8 * 3 * 7168 * 2048 / 1979e12 * 1e6 + FIXED_US)


def test_a_constant_ratio_between_routes_and_a_constant_level_carry_over_exactly() -> None:
    shapes = [SMALL, LARGE, (128, 4096, 1536, 8)]
    fast = {s: {b: _ref(s, b, 3.0) for b in (1, 64, 4096)} for s in shapes}
    slow = {s: {b: 2 * us for b, us in buckets.items()} for s, buckets in fast.items()}
    est = _measurements(_entry("a/x", fast), _entry("b/y", slow)).estimates(64, 2048, 768, 6)
    # the buckets between measured ones interpolated (in log2 M) from their nearest measured neighbours, none
    # beyond the measured range
    assert set(est) == {"a/x", "b/y"} and set(est["a/x"]) == {b for b in M_BUCKETS if b <= 4096}
    for bucket in est["a/x"]:
        assert est["a/x"][bucket].us == pytest.approx(_ref((64, 2048, 768, 6), bucket, 3.0))
        assert est["b/y"][bucket].us == pytest.approx(2 * est["a/x"][bucket].us)
        assert "1.00x the fastest route" in est["a/x"][bucket].detail
        assert "2.00x the fastest route" in est["b/y"][bucket].detail
        between = bucket not in (1, 64, 4096)
        assert ("(none measured at M " in est["a/x"][bucket].detail) == between
    assert est["a/x"][8].detail.endswith(" at M 1 and 64 (none measured at M 8)")
    assert est["a/x"][128].detail.endswith(" at M 64 and 4096 (none measured at M 128)")


def test_a_bucket_between_measured_ones_mixes_their_estimates_where_the_route_ran_at_both() -> None:
    """Halfway in log2 M (M 8 between 1 and 64): the standing, and each shape's share of it, are the two buckets'
    means. A route without a row at one of the two nearest measured buckets gets no estimate between them, nor at
    a bucket another route was measured at."""
    shapes = [SMALL, LARGE, (128, 4096, 1536, 8), (16, 4096, 1536, 8)]
    fast = {s: {b: _ref(s, b, 3.0) for b in (1, 64)} for s in shapes}
    slow = {s: {1: 2 * fast[s][1], 64: 4 * fast[s][64]} for s in (SMALL, LARGE)}
    slow[shapes[2]] = {1: 2 * fast[shapes[2]][1]}  # a shape at M 1 only, another at M 64 only: a share on one side
    slow[shapes[3]] = {64: 4 * fast[shapes[3]][64]}
    est = _measurements(_entry("a/x", fast), _entry("b/y", slow)).estimates(64, 2048, 768, 6)
    low, high, mid = est["b/y"][1], est["b/y"][64], est["b/y"][8]
    assert math.log(mid.us / est["a/x"][8].us) == pytest.approx((math.log(2.0) + math.log(4.0)) / 2)
    shares = {s: (dict(low.sources).get(s, 0.0) + dict(high.sources).get(s, 0.0)) / 2 for s in shapes}
    assert dict(mid.sources) == pytest.approx(shares) and sum(shares.values()) == pytest.approx(1.0)
    assert shapes[2] not in dict(high.sources) and 0 < shares[shapes[2]] < dict(low.sources)[shapes[2]]
    assert shapes[3] not in dict(low.sources) and 0 < shares[shapes[3]] < dict(high.sources)[shapes[3]]
    # c/z measured at M 1 and 2 only: M 2 is now a measured bucket, and the buckets above it lie between 2 and 64
    only_low = {s: {1: 5 * fast[s][1], 2: 5 * _ref(s, 2, 3.0)} for s in shapes}
    est = _measurements(_entry("a/x", fast), _entry("b/y", slow), _entry("c/z", only_low)).estimates(64, 2048, 768, 6)
    assert set(est["c/z"]) == {1, 2}  # nothing at 64 to interpolate towards
    assert set(est["b/y"]) == {1, 64}  # no row at M 2 (measured by another route), so none from 2 to 64 either


def test_the_nearest_shape_in_tokens_per_expert_decides_and_is_named() -> None:
    # route a wins with few tokens per expert (E 32), route b with many (E 8); same expert size
    a = {SMALL: {16: _ref(SMALL, 16, 6.0)}, LARGE: {16: _ref(LARGE, 16, 2.0)}}
    b = {SMALL: {16: _ref(SMALL, 16, 2.0)}, LARGE: {16: _ref(LARGE, 16, 6.0)}}
    table = _measurements(_entry("a/x", a), _entry("b/y", b))
    near_large = table.estimates(24, 1024, 512, 8)
    assert near_large["a/x"][16].us < near_large["b/y"][16].us
    assert [s for s, _ in near_large["a/x"][16].sources] == [LARGE, SMALL]
    assert "from 2 measured shapes E,H,I,k (32,1024,512,8 " in near_large["a/x"][16].detail
    near_small = table.estimates(10, 1024, 512, 8)
    assert near_small["b/y"][16].us < near_small["a/x"][16].us
    # halfway (log2 of tokens per expert): equal shares, so the standings average to equal estimates
    middle = table.estimates(*MIDDLE)
    assert [share for _, share in middle["a/x"][16].sources] == pytest.approx([0.5, 0.5])
    assert middle["a/x"][16].us == pytest.approx(middle["b/y"][16].us)
    # the standing is the weighted mean of log(t / best): log 3 at one shape, 0 at the other
    assert f"{math.sqrt(3):.2f}x the fastest route" in middle["a/x"][16].detail


def test_a_route_is_estimated_only_from_the_shapes_where_it_ran() -> None:
    a = {SMALL: {1: 100.0}, LARGE: {1: 100.0}}
    b = {LARGE: {1: 50.0}}
    est = _measurements(_entry("a/x", a), _entry("b/y", b)).estimates(*MIDDLE)
    assert [s for s, _ in est["b/y"][1].sources] == [LARGE] and est["b/y"][1].sources[0][1] == 1.0
    assert len(est["a/x"][1].sources) == 2
    # a's standing: 1.0 at SMALL (the only route there), 2.0 at LARGE, equal weights: sqrt(2)
    assert "1.41x the fastest route" in est["a/x"][1].detail
    assert "c/z" not in est  # never measured: no estimate
    assert _measurements().estimates(*MIDDLE) == {}


def test_rows_at_the_installed_versions_are_the_ones_modelled() -> None:
    here = _entry("a/x", {SMALL: {1: 100.0}})
    other = _entry("a/x", {SMALL: {1: 900.0}, LARGE: {1: 900.0}}, V2)
    est = _measurements(other, here).estimates(*MIDDLE)["a/x"][1]
    assert [s for s, _ in est.sources] == [SMALL]
    # no rows at the installed versions: those of the other versions with the most rows
    est = _measurements(other, here, installed={"a": {"torch": "2.11.0"}}).estimates(*MIDDLE)["a/x"][1]
    assert len(est.sources) == 2


def test_estimates_are_deterministic_and_finite() -> None:
    rows = {s: {b: _ref(s, b, 1.5 + i) for b in (1, 2, 8192)} for i, s in enumerate([SMALL, LARGE])}
    first = _measurements(_entry("a/x", rows)).estimates(7, 7168, 2048, 7)
    assert first == _measurements(_entry("a/x", rows)).estimates(7, 7168, 2048, 7)
    assert all(math.isfinite(e.us) and e.us > 0 for e in first["a/x"].values())


def test_tokens_per_expert_count_k_as_well_as_e() -> None:
    """64 experts with k 16 give each expert the tokens 32 experts with k 8 do: that measured shape decides
    (weights 1 / 0.5**2 against 1 / 2.5**2 for 8 experts with k 8, two octaves away)."""
    rows = {SMALL: {16: 100.0}, LARGE: {16: 100.0}}
    sources = _measurements(_entry("a/x", rows)).estimates(64, 1024, 512, 16)["a/x"][16].sources
    assert [s for s, _ in sources] == [LARGE, SMALL]
    assert [share for _, share in sources] == pytest.approx([4 / 4.16, 0.16 / 4.16])


def test_an_estimate_names_three_measured_shapes_and_says_when_there_are_more() -> None:
    shapes = [SMALL, LARGE, MIDDLE, (64, 1024, 512, 8)]
    three = _measurements(_entry("a/x", {s: {1: 10.0} for s in shapes[:3]})).estimates(*MIDDLE)["a/x"][1].detail
    assert three.endswith("%)") and ", ...)" not in three and three.count("%") == 3
    four = _measurements(_entry("a/x", {s: {1: 10.0} for s in shapes})).estimates(*MIDDLE)["a/x"][1].detail
    assert four.endswith("%, ...)") and four.count("%") == 3 and "from 4 measured shapes" in four


def test_tables_without_moe_rows_and_routes_never_measured() -> None:
    empty = MoeMeasurements([{"schema": 1, "device_name": "dev", "entries": []}], {})
    assert not empty and empty.routes == () and empty.estimates(*MIDDLE) == {} and empty.describe() == ""
    assert MoeModel({}).estimate("a/x", MIDDLE, 1) is None
    two = _measurements(_entry("b/y", {SMALL: {1: 1.0}}), _entry("a/x", {SMALL: {1: 1.0}, LARGE: {1: 1.0}}))
    assert two.routes == ("a/x", "b/y")
    assert two.describe().split("\n") == ["a/x: 2 MoE shapes measured, installed versions",
                                          "b/y: 1 MoE shapes measured, installed versions"]
