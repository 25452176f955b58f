"""The model of :mod:`fp8select.measured.model`: which rows it uses, and the numbers it gives between measured shapes.

The expected numbers come from the module's documented formula (efficiency over the roofline floor of the
fastest backend, and each backend's standing relative to it, each the median of the measured shapes' values
weighted by ``1 / (d + 0.5)**4`` over the log2 distance of (N, K), N counted twice), worked out here for shapes
where the answer is simple enough to state.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from fp8select.measured.deepgemm_tiles import deepgemm_block_n
from fp8select.measured.model import MEASURED, MODEL, Measurements
from fp8select.measured.table import new_table
from fp8select.roofline import floor_us

TORCH = {"torch": "2.13.0+cpu"}
Rows = dict[tuple[int, int], dict[int, float]]


def _group(backend: str, rows: Rows, versions: dict[str, str] | None = None, config: bool = False) -> dict[str, Any]:
    return {"backend": backend, "versions": versions or TORCH, "shapes": {
        f"{n},{k}": {str(b): {"us": us, **({"config": {"n": n, "k": k}} if config else {})} for b, us in buckets.items()}
        for (n, k), buckets in rows.items()}}


def _measurements(*groups: dict[str, Any], installed: dict[str, dict[str, str]] | None = None,
                  device: str = "cpu") -> Measurements:
    table = new_table(device)
    table["groups"] = list(groups)
    names = {g["backend"] for g in groups}
    return Measurements(device, [table], installed if installed is not None else {name: TORCH for name in names})


def _eff(n: int, k: int, bucket: int, factor: float) -> float:
    """A time ``factor`` times the roofline floor of (N, K) at ``bucket``."""
    return factor * floor_us(n, k, bucket)


def _weight(shape: tuple[int, int], n: int, k: int) -> float:
    d = math.hypot(2 * math.log2(shape[0] / n), math.log2(shape[1] / k))
    return 1.0 / (d + 0.5) ** 4


def test_a_measured_shape_is_its_own_row() -> None:
    meas = _measurements(_group("a", {(1024, 2048): {16: 12.5}}, config=True))
    est = meas.estimate("a", 1024, 2048, 16)
    assert est is not None and (est.us, est.source, est.config_shape) == (12.5, MEASURED, (1024, 2048))
    assert est.detail == "12.5 us measured" and est.config == {"n": 1024, "k": 2048}
    group = _group("a", {(1024, 2048): {16: 12.5}})
    group["shapes"]["1024,2048"]["16"]["runs"] = 3  # the geometric mean of three runs' timings
    folded = _measurements(group).estimate("a", 1024, 2048, 16)
    assert folded is not None and folded.detail == "12.5 us measured (the mean of 3 runs)"


def test_a_larger_buckets_configuration_that_ran_more_rows_faster_stands_in() -> None:
    """A configured backend's row gives way to the fastest row of a larger bucket that took less than
    1 / FEWER_ROWS of its time (its configuration runs fewer rows no slower), at every smaller bucket; a closer
    one, or a vendor's row without a configuration, is left as measured; the modelled standings read the
    same rows."""
    times = {16: 6.0, 32: 9.7, 64: 10.6, 128: 8.0, 256: 9.5, 512: 14.0}
    configured = {"backend": "a", "versions": TORCH, "shapes": {"1024,2048": {
        str(b): {"us": us, "config": {"at": b}} for b, us in times.items()}}}
    meas = _measurements(configured, _group("v", {(1024, 2048): times}))
    for bucket in (32, 64):
        est = meas.estimate("a", 1024, 2048, bucket)
        assert est is not None and (est.us, est.source, est.config) == (8.0, MEASURED, {"at": 128})
        assert est.detail.startswith("8.0 us measured at M 128 with its launch configuration")
        assert f"({times[bucket]:.1f} us with this bucket's own)" in est.detail
    for bucket in (16, 128, 256, 512):  # faster than every larger bucket, or the fastest of them
        est = meas.estimate("a", 1024, 2048, bucket)
        assert est is not None and (est.us, est.config) == (times[bucket], {"at": bucket})
    assert meas.estimate("v", 1024, 2048, 64).us == 10.6  # type: ignore[union-attr]
    close = {**configured, "shapes": {"1024,2048": {"64": {"us": 8.3, "config": {"at": 64}},
                                                     "128": {"us": 8.0, "config": {"at": 128}}}}}
    assert _measurements(close).estimate("a", 1024, 2048, 64).config == {"at": 64}  # type: ignore[union-attr]
    # Another shape's estimate is modelled from the rows as read: "a" is 8.0 / 8.0 the fastest at M 64 there.
    other = meas.estimate("a", 2048, 2048, 64)
    assert other is not None and other.source == MODEL and other.config == {"at": 128}
    assert "1.00x the fastest" in other.detail


def test_a_vendor_row_below_both_neighbours_at_decode_counts_as_their_median() -> None:
    """A row without a launch configuration below both neighbouring buckets at M <= 16, by at most LUCKY,
    is taken as the median of the three (the first bucket's neighbours: the two above it); a row with one
    (Triton's pick at that bucket), above either neighbour, further below, beyond M 16, or missing a
    neighbour stays as measured."""
    shape = (1024, 2048)
    vendor = {1: 5.0, 2: 6.0, 4: 5.2, 8: 5.9, 16: 6.1, 32: 5.5, 64: 7.0, 128: 8.0}  # M 1 5.2 / 5.0 below: lucky
    meas = _measurements(_group("v", {shape: vendor}), _group("t", {shape: vendor}, config=True),
                         _group("gap", {shape: {1: 5.0, 4: 4.0, 8: 5.0, 16: 6.0}}))

    def us(backend: str, bucket: int) -> float:
        est = meas.estimate(backend, *shape, bucket)
        assert est is not None and est.source == MEASURED
        return est.us

    assert us("v", 1) == 5.2  # median(5.0, 6.0, 5.2): M 2 and 4 around the first bucket
    assert us("v", 2) == 6.0  # above both: as measured
    assert us("v", 4) == 5.9  # median(6.0, 5.2, 5.9)
    assert us("v", 16) == 6.1 and us("v", 32) == 5.5  # M 32: a change of tile may be real
    assert [us("t", b) for b in (1, 4)] == [5.0, 5.2]
    assert us("gap", 1) == 5.0 and us("gap", 4) == 4.0  # M 2 missing: no median at M 1 or M 4
    assert us("gap", 8) == 5.0  # between 4.0 and 6.0
    real = _measurements(_group("v", {shape: {1: 6.0, 2: 5.0, 4: 6.0}}))  # 6.0 / 5.0 = 1.2 > LUCKY
    assert (est := real.estimate("v", *shape, 2)) is not None and est.us == 5.0
    est = meas.estimate("v", *shape, 1)
    assert est is not None and est.detail.startswith("5.2 us measured at the buckets around it (5.0 here, below both")


def test_one_efficiency_everywhere_gives_that_efficiency_at_any_shape() -> None:
    """The fastest backend at 3x its floor at every measured shape: 3x the floor anywhere (whatever the weights)."""
    shapes = [(512, 512), (4096, 1024), (1024, 7168)]
    meas = _measurements(_group("a", {s: {16: _eff(*s, 16, 3.0)} for s in shapes}))
    for n, k in [(2048, 2048), (7168, 512), (512, 16384)]:
        est = meas.estimate("a", n, k, 16)
        assert est is not None and est.source == MODEL
        assert est.us == pytest.approx(_eff(n, k, 16, 3.0), rel=1e-9)


def test_efficiencies_are_the_median_weighted_by_inverse_distance() -> None:
    """One shape at 2x its floor at log2 distance 1 from the query (K 2x off: weight 1/1.5**4 = 0.198), others
    at 8x at distance 1.4 (K or N 2**1.4 or 2**0.7 off: 0.077 each): two of them weigh less than the near one,
    which is the median; three weigh more."""
    near, far = (1024, 4096), [(1024, 5405), (1024, 776), (1663, 2048)]
    assert _weight(near, 1024, 2048) > 2 * _weight(far[0], 1024, 2048)
    assert _weight(near, 1024, 2048) < 3 * _weight(far[0], 1024, 2048)
    for count, eff in ((2, 2.0), (3, 8.0)):
        rows = {near: {64: _eff(*near, 64, 2.0)}} | {s: {64: _eff(*s, 64, 8.0)} for s in far[:count]}
        est = _measurements(_group("a", rows)).estimate("a", 1024, 2048, 64)
        assert est is not None and est.us == pytest.approx(_eff(1024, 2048, 64, eff), rel=1e-9), count


def test_distance_counts_n_twice() -> None:
    """A shape's N sets how many tiles it has (its waves over the SMs), what moves a backend's standing most: a
    shape 2x off in N is as far as one 4x off in K (the same weight: the median is the lower value, whichever
    of the two holds it), and further than one 2x off in K, whose value wins either way."""
    for n_off, k_off in ((2.0, 8.0), (8.0, 2.0)):
        meas = _measurements(_group("a", {(2048, 1024): {8: _eff(2048, 1024, 8, n_off)},
                                          (1024, 4096): {8: _eff(1024, 4096, 8, k_off)}}))
        est = meas.estimate("a", 1024, 1024, 8)
        assert est is not None and est.us == pytest.approx(_eff(1024, 1024, 8, 2.0), rel=1e-9)
    n_off, k_off = (2048, 1024), (1024, 2048)
    assert _weight(n_off, 1024, 1024) == pytest.approx(1 / 2.5**4) and _weight(k_off, 1024, 1024) == pytest.approx(1 / 1.5**4)
    for k_value in (2.0, 8.0):
        meas = _measurements(_group("a", {n_off: {8: _eff(*n_off, 8, 10.0 - k_value)}, k_off: {8: _eff(*k_off, 8, k_value)}}))
        est = meas.estimate("a", 1024, 1024, 8)
        assert est is not None and est.us == pytest.approx(_eff(1024, 1024, 8, k_value), rel=1e-9)
        assert est.config_shape == k_off  # the nearer of the two


def test_one_neighbour_far_off_does_not_move_the_median() -> None:
    """Four neighbours at the same distance, where b ran 1.1x, 1.2x, 1.3x and 5x the fastest (a): b is modelled
    at 1.2x a (a weighted mean of the logs would give 1.7x), and the detail says where that standing was measured."""
    ratios = {(512, 1024): 1.1, (2048, 1024): 1.2, (1024, 256): 1.3, (1024, 4096): 5.0}
    meas = _measurements(_group("a", {s: {16: _eff(*s, 16, 2.0)} for s in ratios}),
                         _group("b", {s: {16: _eff(*s, 16, 2.0 * r)} for s, r in ratios.items()}))
    a, b = meas.estimate("a", 1024, 1024, 16), meas.estimate("b", 1024, 1024, 16)
    assert a is not None and b is not None and b.us == pytest.approx(1.2 * a.us, rel=1e-9)
    assert b.detail.endswith(", 1.20x the fastest as at 2048x1024")
    assert [share for _, share in b.sources] == pytest.approx([0.25] * 4)


def test_a_backend_is_placed_relative_to_the_fastest_at_each_shape() -> None:
    """b ran only where it is 2x the fastest (a): modelled anywhere as 2x a's model, though a's model uses
    shapes b never ran at; and a stays itself (its standing is 1 wherever it ran)."""
    s1, s2 = (1024, 1024), (4096, 4096)
    for order in ("ab", "ba"):  # whichever is read first
        rows = {"a": _group("a", {s1: {16: _eff(*s1, 16, 2.0)}, s2: {16: _eff(*s2, 16, 6.0)}}),
                "b": _group("b", {s1: {16: _eff(*s1, 16, 4.0)}})}
        meas = _measurements(*(rows[name] for name in order))
        a, b = meas.estimate("a", 2048, 2048, 16), meas.estimate("b", 2048, 2048, 16)
        assert a is not None and b is not None
        assert a.us == pytest.approx(_eff(2048, 2048, 16, 2.0), rel=1e-9)  # equal weights: the lower of 2 and 6
        assert b.us == pytest.approx(2 * a.us, rel=1e-9), order
        assert a.detail.endswith("1.00x the fastest as at 4096x4096") and b.detail.endswith("2.00x the fastest as at 1024x1024")


def test_shapes_where_deepgemm_picks_another_tile_width_count_a_tenth() -> None:
    """7168x4096 at M 2048 lies as far from 3584x4096 as from 14336x4096; DeepGEMM picks a 112-wide tile at the
    first two (and is slow there, as on the H200 at N 5120 and 7168) and 128 at the third. On an H200 the shape
    sharing the tile carries 10/11 of the weight, so its standings decide: b, not a, is modelled fastest. On
    another device (whose DeepGEMM the restated choice is not) both weigh alike."""
    same, other, at = (3584, 4096), (14336, 4096), (7168, 4096)
    assert deepgemm_block_n(2048, *at) == deepgemm_block_n(2048, *same) == 112 != deepgemm_block_n(2048, *other)
    groups = (_group("a", {same: {2048: _eff(*same, 2048, 1.2)}, other: {2048: _eff(*other, 2048, 1.0)}}),
              _group("b", {same: {2048: _eff(*same, 2048, 1.0)}, other: {2048: _eff(*other, 2048, 1.1)}}))
    meas = _measurements(*groups, device="NVIDIA H200")
    a, b = meas.estimate("a", *at, 2048), meas.estimate("b", *at, 2048)
    assert a is not None and b is not None and b.us < a.us
    assert a.sources == ((same, pytest.approx(10 / 11)), (other, pytest.approx(1 / 11)))
    assert a.us == pytest.approx(1.2 * b.us)
    elsewhere = _measurements(*groups, device="NVIDIA B200").estimate("a", *at, 2048)
    assert elsewhere is not None and elsewhere.sources == ((same, pytest.approx(0.5)), (other, pytest.approx(0.5)))


def test_the_fastest_is_the_fastest_of_every_backend_not_the_last_read() -> None:
    s1, s2 = (1024, 1024), (4096, 4096)
    meas = _measurements(_group("fast", {s1: {16: _eff(*s1, 16, 2.0)}, s2: {16: _eff(*s2, 16, 2.0)}}),
                         _group("slow", {s1: {16: _eff(*s1, 16, 3.0)}, s2: {16: _eff(*s2, 16, 5.0)}}))
    fast = meas.estimate("fast", 2048, 2048, 16)
    assert fast is not None and fast.us == pytest.approx(_eff(2048, 2048, 16, 2.0), rel=1e-9)


def test_nearest_shape_lends_its_configuration_and_is_named() -> None:
    meas = _measurements(_group("a", {(512, 512): {32: 5.0}, (4096, 1024): {32: 9.0}}, config=True))
    est = meas.estimate("a", 4096, 2048, 32)
    assert est is not None and est.config_shape == (4096, 1024) and est.config == {"n": 4096, "k": 1024}
    near, far = _weight((4096, 1024), 4096, 2048), _weight((512, 512), 4096, 2048)
    assert est.sources == (((4096, 1024), pytest.approx(near / (near + far))), ((512, 512), pytest.approx(far / (near + far))))
    assert est.detail == f"{est.us:.1f} us modelled from 2 measured shapes (4096x1024 {near / (near + far):.0%}, 512x512 " \
                         f"{far / (near + far):.0%}), 1.00x the fastest as at 4096x1024"


def test_a_modelled_estimate_names_its_three_largest_sources() -> None:
    shapes = [(1024 * 2**i, 1024) for i in range(5)]
    meas = _measurements(_group("a", {s: {1: 3.0} for s in shapes}))
    est = meas.estimate("a", 3 * 1024, 1024, 1)
    # log2 distances from 3072: 0.42 (4096), 0.58 (2048), 1.42 (8192), 1.58 (1024), 2.42 (16384)
    assert est is not None and [s for s, _ in est.sources] == [(4096, 1024), (2048, 1024), (8192, 1024), (1024, 1024),
                                                                (16384, 1024)]
    assert sum(share for _, share in est.sources) == pytest.approx(1.0)
    assert est.detail.endswith("(4096x1024 " + f"{est.sources[0][1]:.0%}, 2048x1024 {est.sources[1][1]:.0%}, "
                               f"8192x1024 {est.sources[2][1]:.0%}, ...), 1.00x the fastest as at 4096x1024")


def test_no_estimate_without_rows_at_the_bucket_or_for_the_backend() -> None:
    meas = _measurements(_group("a", {(1024, 1024): {16: 5.0}}))
    assert meas.estimate("a", 2048, 2048, 32) is None
    assert meas.estimate("b", 1024, 1024, 16) is None


def test_a_bucket_no_shape_was_measured_at_is_interpolated_between_its_measured_neighbours() -> None:
    # "a" measured at M 16 and 256 (its own shape at 16, another shape at 256), "b" at M 16 only
    meas = _measurements(_group("a", {(1024, 1024): {16: 5.0}, (2048, 2048): {256: 40.0}}, config=True),
                         _group("b", {(1024, 1024): {16: 4.0}}))
    low, high = meas.estimate("a", 1024, 1024, 16), meas.estimate("a", 1024, 1024, 256)
    assert low is not None and high is not None and (low.source, high.source) == (MEASURED, MODEL)
    est = meas.estimate("a", 1024, 1024, 64)  # halfway in log2 M: the geometric mean
    assert est is not None and est.source == MODEL and est.us == pytest.approx(math.sqrt(low.us * high.us), rel=1e-12)
    assert est.detail == (f"{est.us:.1f} us interpolated between M 16 (5.0 us, measured) and M 256 ({high.us:.1f} us, "
                          "model): no shape measured at M 64")
    assert (est.config, est.config_shape, est.sources) == (high.config, high.config_shape, high.sources)
    quarter = meas.estimate("a", 1024, 1024, 32)
    assert quarter is not None and quarter.us == pytest.approx(low.us ** 0.75 * high.us ** 0.25, rel=1e-12)
    # beyond the measured range, or a backend measured on one side only: no estimate
    assert meas.estimate("a", 1024, 1024, 8) is None and meas.estimate("a", 1024, 1024, 512) is None
    assert meas.estimate("b", 1024, 1024, 64) is None


def test_a_bucket_measured_at_other_shapes_is_modelled_from_them_not_interpolated() -> None:
    meas = _measurements(_group("a", {(1024, 1024): {16: 5.0, 256: 50.0}, (2048, 2048): {64: 30.0}}))
    est = meas.estimate("a", 1024, 1024, 64)
    assert est is not None and est.source == MODEL and est.detail.startswith(f"{est.us:.1f} us modelled from 1 measured")


def test_rows_of_the_installed_versions_win_else_the_version_measured_most() -> None:
    def dg(version: str, shapes: int, us: float) -> dict[str, Any]:
        return _group("deepgemm", {(1024 * (i + 1), 1024): {1: us} for i in range(shapes)},
                      {"deep_gemm": version, **TORCH})

    groups = (dg("1.0", 1, 1.0), dg("2.0", 3, 2.0), dg("3.0", 2, 3.0))
    installed = _measurements(*groups, installed={"deepgemm": {"deep_gemm": "1.0", **TORCH}})
    assert installed.estimate("deepgemm", 1024, 1024, 1).us == 1.0  # type: ignore[union-attr]
    assert installed.describe() == "deepgemm: 1 shapes measured on cpu, installed versions"
    other = _measurements(*groups, installed={"deepgemm": {"deep_gemm": "9.9", **TORCH}})
    est = other.estimate("deepgemm", 1024, 1024, 1)
    assert est is not None and est.us == 2.0  # 3 shapes: more than 2.0's neighbours either side
    assert est.detail == "2.0 us measured, measured with deep_gemm 2.0, torch 2.13.0+cpu"
    assert other.describe() == "deepgemm: 3 shapes measured on cpu, other versions (deep_gemm 2.0, torch 2.13.0+cpu)"


def test_shapes_backends_and_describe_list_every_backend() -> None:
    meas = _measurements(_group("b", {(4096, 512): {1: 1.0}, (512, 4096): {1: 1.0}}), _group("a", {(1024, 1024): {1: 1.0}}))
    assert meas.device_name == "cpu" and meas.backends == ("a", "b")
    assert meas.shapes("b") == ((512, 4096), (4096, 512)) and meas.shapes("c") == ()
    assert meas.describe().splitlines() == ["a: 1 shapes measured on cpu, installed versions",
                                            "b: 2 shapes measured on cpu, installed versions"]


def test_an_estimate_is_computed_once_per_backend_shape_and_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's layers repeat a few shapes: the second layer of a shape reads the first one's estimates."""
    shapes = [(512, 512), (4096, 1024), (1024, 7168)]
    meas = _measurements(_group("a", {s: {16: _eff(*s, 16, 3.0), 32: _eff(*s, 32, 2.0)} for s in shapes}))
    computed: list[tuple[str, int, int, int]] = []
    compute = Measurements._estimate
    monkeypatch.setattr(Measurements, "_estimate", lambda self, *key: computed.append(key) or compute(self, *key))
    first = [meas.estimate("a", 2048, 2048, b) for b in (16, 32)] + [meas.estimate("b", 2048, 2048, 16)]
    again = [meas.estimate("a", 2048, 2048, b) for b in (16, 32)] + [meas.estimate("b", 2048, 2048, 16)]
    assert first == again and first[2] is None
    assert computed == [("a", 2048, 2048, 16), ("a", 2048, 2048, 32), ("b", 2048, 2048, 16)]


def _partly_measured(own: dict[str, dict[int, float]]) -> Measurements:
    """Two neighbours where a runs at 2x its floor and b at 1.3x a, at buckets 4, 16 and 256; and the layer shape
    (2048, 2048) with ``own`` rows (per backend, per bucket), as load-time measurement leaves it."""
    others = [(1024, 2048), (4096, 2048)]
    rows = {"a": {s: {b: _eff(*s, b, 2.0) for b in (4, 16, 256)} for s in others},
            "b": {s: {b: _eff(*s, b, 2.6) for b in (4, 16, 256)} for s in others}}
    for name, buckets in own.items():
        rows[name][(2048, 2048)] = buckets
    return _measurements(*(_group(name, shapes) for name, shapes in rows.items()))


def test_a_partly_measured_shape_scales_its_estimates_to_its_own_speed() -> None:
    """The layer ran a at 3x what the other shapes predict (a small shape, launch-bound): b, left unmeasured
    there, is modelled at 1.3x a's measured time, not at 1.3x a's model (which would beat the measured a)."""
    model_a = _eff(2048, 2048, 16, 2.0)
    meas = _partly_measured({"a": {16: 3 * model_a}})
    a, b = meas.estimate("a", 2048, 2048, 16), meas.estimate("b", 2048, 2048, 16)
    assert a is not None and a.source == MEASURED and b is not None and b.source == MODEL
    assert b.us == pytest.approx(1.3 * a.us, rel=1e-9)
    assert "scaled 3.00x to this shape's measured speed" in b.detail
    assert all(shape != (2048, 2048) for shape, _ in b.sources)  # the shape does not model itself


def test_the_scale_is_interpolated_in_log_m_between_measured_buckets() -> None:
    """Measured 3x at M 4 and 1.5x at M 256: at M 16 (a third of the way in log M) the scale is
    3 ** (2/3) * 1.5 ** (1/3); beyond the last measured bucket, the last one's."""
    meas = _partly_measured({"a": {4: 3 * _eff(2048, 2048, 4, 2.0), 256: 1.5 * _eff(2048, 2048, 256, 2.0)}})
    for name, standing in (("a", 1.0), ("b", 1.3)):
        est = meas.estimate(name, 2048, 2048, 16)
        assert est is not None and est.us == pytest.approx(standing * 3 ** (2 / 3) * 1.5 ** (1 / 3) * _eff(2048, 2048, 16, 2.0))
    b4 = meas.estimate("b", 2048, 2048, 4)
    assert b4 is not None and b4.us == pytest.approx(1.3 * 3 * _eff(2048, 2048, 4, 2.0))


def test_the_scale_follows_the_fastest_row_measured_at_a_bucket() -> None:
    """Both measured at M 16 (a at 2x its model, b at 1.6x a's model): the fastest row there sets the scale
    (1.6x), so a stays measured and unmeasured M 256 gets a and b at 1.6x their models."""
    meas = _partly_measured({"a": {16: 2 * _eff(2048, 2048, 16, 2.0)}, "b": {16: 1.6 * _eff(2048, 2048, 16, 2.0)}})
    a, b = meas.estimate("a", 2048, 2048, 256), meas.estimate("b", 2048, 2048, 256)
    assert a is not None and a.us == pytest.approx(1.6 * _eff(2048, 2048, 256, 2.0))
    assert b is not None and b.us == pytest.approx(1.6 * 1.3 * _eff(2048, 2048, 256, 2.0))


def test_a_shape_without_rows_is_not_scaled() -> None:
    meas = _partly_measured({})
    est = meas.estimate("b", 2048, 2048, 16)
    assert est is not None and est.us == pytest.approx(1.3 * _eff(2048, 2048, 16, 2.0)) and "scaled" not in est.detail
