"""The benchmark reports from measured times (pure Python, no GPU): benchmarks.limits's prefill ratio (the Triton
layer's against the vendors' of the same timing) and quantization floor; benchmarks.regret's table names;
benchmarks.model_check's scoring of the model's choices; decode_ab's distilled rows as merge_tuning folds them in."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import distill_limits, limits
from fp8select import roofline


def _vendors(n: int, k: int, m: int, **whole_gemm: tuple[float, float]) -> dict:
    return {(n, k, m): {b: {"whole": w, "gemm": g} for b, (w, g) in whole_gemm.items()}}


def test_prefill_compares_the_layer_with_the_vendors_of_the_same_timing() -> None:
    cfg = {"BLOCK_M": 128}
    h = SimpleNamespace(points={(4096, 7168, 1024): {"tried": 3, "failed": 0, "table": {"us": 90.0, "config": cfg},
                                                     "best": {"us": 80.0, "config": cfg}}})
    vendors = _vendors(4096, 7168, 1024, triton=(100.0, 95.0), **{"cuda-scaled-mm": (75.0, 70.0)}, deepgemm=(60.0, 50.0))
    (point,) = limits.points(h, vendors, decode=False)
    assert point["triton_layer_us"] == 100.0 and point["sweep_gain"] == pytest.approx(90 / 80, abs=1e-4)
    assert point["layer_speed_vs"] == {"cuda-scaled-mm": 0.75, "deepgemm": 0.6}
    assert "speed_vs_cuda-scaled-mm" not in point["sweep"]  # a time of another phase is not set against them
    summary = limits.summarize({"prefill": {"points": [point]}})["prefill"]
    assert summary["layer_speed_vs_cublas_geomean"] == 0.75 and not summary["layer_reaches_0_85"]
    assert summary["sweep_projected_vs_cublas_geomean"] == pytest.approx(0.75 * 90 / 80, abs=1e-3)


def test_quantization_points_carry_the_floor_a_separate_quantizer_cannot_beat() -> None:
    n, k, m = 2112, 7168, 4096
    (point,) = limits.quant_points(_vendors(n, k, m, deepgemm=(133.0, 106.0), triton=(170.0, 190.0)))
    quant_us = roofline.quant_bytes(m, k) / roofline.HBM_BYTES_PER_S * 1e6  # about 20.7 us
    assert point["fastest"] == "deepgemm" and point["fastest_ratio"] == pytest.approx(133 / 106, abs=1e-4)
    assert point["floor_ratio"] == pytest.approx((106 + quant_us) / 106, abs=1e-4) and point["floor_ratio"] > 1.05
    (small,) = limits.quant_points(_vendors(32768, 512, 1024, deepgemm=(41.0, 38.0)))
    quant = limits.summarize({"quant": {"points": [point, small]}})["quant"]
    assert (quant["fastest_within_5pct"], quant["floor_within_5pct"]) == (0, 1)
    report = {"environment": {}, "args": {"out": "x"}, "summary": {"quant": quant}, "quant": {"points": [point, small]}}
    assert json.loads(distill_limits.distill(report))["quant"][0]["floor_ratio"] == point["floor_ratio"]


def test_regret_shipped_parts_cover_the_shipped_shapes_once_in_about_equal_weight() -> None:
    """``--shipped PART/PARTS``: every dense shape of the shipped H200 table in exactly one part, the parts'
    weight bytes within the largest shape's of each other; a bad PART/PARTS is a usage error."""
    from benchmarks.model_check import table_truth
    from benchmarks.regret import main, shipped_part
    from fp8select.measured.table import SHIPPED_DIR

    table = json.loads((SHIPPED_DIR / "tuning-nvidia-h200.json").read_text())
    shapes = sorted({(n, k) for n, k, _ in table_truth(table)})
    for parts in (1, 2, 3):
        got = [shipped_part(shapes, part, parts) for part in range(1, parts + 1)]
        assert sorted(s for p in got for s in p) == shapes
        loads = [sum(n * k for n, k in p) for p in got]
        assert max(loads) - min(loads) <= max(n * k for n, k in shapes)
    assert shipped_part(shapes, 1, 2)[0] == max(shapes, key=lambda s: s[0] * s[1])  # the largest first
    for bad in ("0/2", "3/2", "1", "a/b"):
        with pytest.raises(SystemExit):
            main(["--shipped", bad, "--out", "unused.json"])


def test_regret_worst_points_are_the_kept_runs_worst_of_this_chain_on_the_tables_shapes() -> None:
    from benchmarks.regret import worst_points

    chain, alone = ["a", "b", "reference"], ["b", "reference"]
    found = {"r1": {"chain": chain, "ratios": {(1, 2, 8): 1.05, (1, 2, 16): 1.01, (3, 4, 1): 1.20}},
             "r2": {"chain": chain, "ratios": {(1, 2, 16): 1.10, (5, 6, 1): 1.50}},
             "r3": {"chain": alone, "ratios": {(1, 2, 4): 2.0}}}
    held = {(1, 2), (3, 4)}  # (5, 6) is no shape of the table: the model plans it, a fold cannot help it
    got = worst_points(found, chain, held, 2)
    assert list(got.items()) == [((3, 4), [1]), ((1, 2), [16])]  # M 16's worst over the runs, 1.10, beats M 8's 1.05
    assert worst_points(found, chain, held, 9) == {(3, 4): [1], (1, 2): [8, 16]}
    assert worst_points(found, alone, held, 9) == {(1, 2): [4]}
    assert worst_points(found, ["c"], held, 9) == {}


def test_regret_worst_starts_at_the_worst_point_summarize_regret_scores_on_the_tables_shapes() -> None:
    """The kept runs scored with today's plan: ``--worst 1`` times the point that is the worst of every set of
    runs of the table's shapes, with the vendors and without."""
    from benchmarks import summarize_regret
    from benchmarks.model_check import table_truth
    from benchmarks.regret import RESULTS, worst_points
    from fp8select.measured.table import SHIPPED_DIR

    found = summarize_regret.replan(RESULTS)
    pooled = summarize_regret.replan_sets(found)
    table = json.loads((SHIPPED_DIR / "tuning-nvidia-h200.json").read_text())
    held = {(n, k) for n, k, _ in table_truth(table)}
    for prefix, name in (("vendors, ", "regret_vendors_deepseek"), ("no vendors, ", "regret_novendors_deepseek")):
        chain = found[name]["chain"]
        ((shape, (m,)),) = worst_points(found, chain, held, 1).items()
        ratio = max(run["ratios"].get((*shape, m), 0.0) for run in found.values() if run["chain"] == chain)
        worsts = [figures["now"][1] for label, figures in pooled.items()
                  if label.startswith(prefix) and label.endswith("(table)")]
        assert round(ratio, 3) == max(worsts) > 1, (prefix, shape, m)


def test_results_and_tables_name_files_without_the_machines_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What benchmarks.regret names its tables by, and benchmarks.moe_routes the report a table is written from."""
    from benchmarks.distill_limits import portable

    monkeypatch.chdir(tmp_path)
    assert portable(str(tmp_path / "fp8select" / "data" / "t.json")) == "fp8select/data/t.json"
    assert portable("/elsewhere/work/tuning.json") == ".../tuning.json"
    assert portable("relative/t.json") == "relative/t.json"


def test_model_check_scores_the_models_choice_against_measured_times() -> None:
    from benchmarks import model_check

    # Two backends on three shapes: "a" twice as fast below N 4096, "b" 1.5x faster from there on.
    def rows(fast: bool) -> dict:
        return {"1": {"us": 10.0 if fast else 20.0}}

    shapes = {"a": {}, "b": {}}
    for n in (1024, 2048, 8192):
        shapes["a"][f"{n},4096"], shapes["b"][f"{n},4096"] = rows(n < 4096), rows(n >= 4096)
    shapes["b"]["8192,4096"]["1"]["us"] = 10.0 / 1.5
    table = {"device_name": "gpu", "schema": 2, "groups": [{"backend": b, "versions": {"torch": "2"}, "shapes": s}
                                                          for b, s in shapes.items()]}
    loo = model_check.summary(model_check.choice_regret(
        model_check.table_truth(table), lambda n, k: model_check._measurements(table, (n, k))))
    # 2048 left out: planned from 1024 (a fast) and 8192 (b fast), nearer 1024: a, right. 8192 left out: only
    # a-fast shapes remain: a, 3x slower than b there. 1024 left out: nearer 2048: a, right.
    assert (loo["points"], loo["over_8pct"], loo["worst"]) == (3, 1, 3.0)
    assert loo["worst_point"] == {"n": 8192, "k": 4096, "m": 1, "pick": "a", "best": "b"}


def test_model_check_plans_another_runs_shapes_without_the_tables_rows_of_them() -> None:
    """A regret run's shape the table holds too is planned from the table's other shapes: "a" is fast at 1024
    and 2048, "b" at 8192; the run times 8192, where the table's own rows would have picked "b"."""
    from benchmarks import model_check

    times = {(1024, 4096): {"a": 10.0, "b": 20.0}, (2048, 4096): {"a": 10.0, "b": 20.0}, (8192, 4096): {"a": 30.0, "b": 10.0}}
    table = {"device_name": "gpu", "schema": 2, "groups": [
        {"backend": b, "versions": {"torch": "2"}, "shapes": {f"{n},{k}": {"1": {"us": t[b]}} for (n, k), t in times.items()}}
        for b in ("a", "b")]}
    got = model_check.unseen_regret(table, {(8192, 4096, 1): {"a": 30.0, "b": 10.0}})
    assert (got["points"], got["worst"], got["worst_point"]["pick"]) == (1, 3.0, "a")


def test_model_check_on_the_shipped_table_is_the_kept_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import model_check

    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    out = tmp_path / "check.json"
    regret = [arg for name in ("vendors", "novendors") for runs in ("other_model", "unseen_model", "glm_model")
              for arg in ("--regret", str(results / f"regret_{name}_{runs}.json"))]
    assert model_check.main([*regret, "--out", str(out)]) == 0
    capsys.readouterr()
    report = json.loads(out.read_text())
    shapes = sum(len(members) for members in report["models"].values())
    assert shapes >= 99  # the served shapes and five more
    for label in ("all", "without vendors"):  # measured properties of the shipped H200 rows, asserted loosely
        for fold in ("leave_one_shape_out", "leave_one_model_out"):
            summary = report[label][fold]
            assert summary["points"] == 14 * shapes and summary["geomean"] < 1.03 and summary["vs_single_geomean"] < 1.0
        # Rows measured at load time only help: each budget's regret at most the previous one's, from none
        # measured (a shape's own rows mixed with estimates of the model's level once made it 1.02 / 2.0).
        folds = ("leave_one_shape_out", *(f"{rows}_rows_measured" for rows in model_check.PARTLY))
        regrets = [report[label][fold]["geomean"] for fold in folds]
        assert regrets == sorted(regrets, reverse=True), (label, regrets)
        # A bucket no shape was measured at, between two that were: interpolated, far closer than the priority order
        between = report[label]["leave_one_bucket_out"]
        assert between["points"] == 12 * shapes and between["geomean"] < 1.03 < between["rule"]["geomean"]
        assert between["worst"] < between["rule"]["worst"]
        for rows in model_check.PARTLY:  # a first start on a device no table covers: every point planned
            first = report[label][f"no_table_{rows}_rows"]
            assert first["points"] == 14 * shapes and first["geomean"] < 1.03 and first["vs_single_geomean"] < 1.0
    assert json.loads((results / "model_check.json").read_text()) == report  # what the tool computes today


def test_decode_ab_distills_medians_into_rows_merge_tuning_folds_in() -> None:
    """decode_ab.py --distill: per point the median of three reports, the table's configuration (the layer)
    against the fastest fixed one; merge_tuning.py takes those faster by more than its margin."""
    pytest.importorskip("triton")
    from benchmarks import decode_ab, merge_tuning

    def report(layer: float, decode: float, gemm: float) -> dict:
        return {"env": {"device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0"},
                "configs": {"decode": decode_ab.CONFIGS["decode"], "gemm": decode_ab.CONFIGS["gemm"]},
                "points": [{"n": 7168, "k": 16384, "m": 8, "us": {"layer": layer, "decode": decode, "gemm": gemm,
                                                                   "flashinfer": 30.0}}]}

    got = decode_ab.distill([report(39.0, 37.0, 40.0), report(38.0, 36.0, 35.0), report(40.0, 50.0, 41.0)])
    (row,) = got["decode"]
    # medians 39 / 37 / 40: decode is the fastest fixed configuration (a vendor is not one)
    assert (row["table_us"], row["sweep_us"], row["sweep_name"]) == (39.0, 37.0, "decode")
    assert row["sweep_config"]["SPLIT_K"] == 8 and row["sweep_config"]["FIXUP"] == 0 and row["reports"] == 3
    table = merge_tuning.from_limits(got, 0.02)
    assert table["groups"][0]["shapes"]["7168,16384"]["8"]["us"] == 37.0
    assert merge_tuning.from_limits(got, 0.06)["groups"][0]["shapes"] == {}  # 5.1% faster: not by 6%


def test_merge_tuning_takes_faster_rows_by_its_margin_or_every_row_of_a_retiming(tmp_path: Any) -> None:
    """By default a row of NEW replaces BASE's only where faster by more than the margin (a narrower re-tune never
    makes a row worse); ``--all`` takes every row of NEW, slower ones too (a re-timing of whole points)."""
    from benchmarks import merge_tuning

    def table(rows: dict[str, dict[str, float]]) -> dict:
        return {"schema": 2, "device_name": "gpu", "groups": [
            {"backend": b, "versions": {"torch": "2"}, "shapes": {"256,512": {m: {"us": us} for m, us in by_m.items()}}}
            for b, by_m in rows.items()]}

    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(table({"a": {"1": 10.0, "2": 10.0}, "b": {"1": 9.0}})))
    new.write_text(json.dumps(table({"a": {"1": 9.9, "2": 8.0}, "b": {"1": 9.5}})))
    for flags, want in (([], {"a": {"1": 9.9, "2": 8.0}, "b": {"1": 9.0}}),
                        (["--margin", "0.02"], {"a": {"1": 10.0, "2": 8.0}, "b": {"1": 9.0}}),
                        (["--all"], {"a": {"1": 9.9, "2": 8.0}, "b": {"1": 9.5}})):
        merge_tuning.main([str(base), str(new), str(tmp_path / "out.json"), *flags])
        out = json.loads((tmp_path / "out.json").read_text())
        assert {g["backend"]: {m: r["us"] for m, r in g["shapes"]["256,512"].items()} for g in out["groups"]} == want, flags


def test_merge_tuning_folds_a_runs_timings_into_the_rows_and_takes_them_out_again(tmp_path: Any) -> None:
    """--fold makes each row a run timed again the geometric mean of its timings (``runs``), Triton's only where
    the run ran the row's configuration, a backend's only at the run's versions; a run folded once is refused
    the second time, and unfold gives back the table before it (to the rounding of a row's microseconds)."""
    from benchmarks import merge_tuning
    from fp8select.measured.table import validate_table

    config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
    other = {**config, "num_stages": 4}
    env = {"device": "gpu", "torch": "2", "cuda": "13.0", "triton": "3.6.0", "time": "2026-12-02T10:00:00Z"}
    base = {"schema": 2, "device_name": "gpu", "groups": [
        {"backend": "cuda-scaled-mm", "versions": {"torch": "2", "cuda": "13.0", "triton": "3.6.0"},
         "shapes": {"256,512": {"1": {"us": 10.0}, "2": {"us": 10.0, "runs": 2}}}},
        {"backend": "deepgemm", "versions": {"torch": "2", "cuda": "13.0", "triton": "3.6.0", "deep_gemm": "2.6.1"},
         "shapes": {"256,512": {"1": {"us": 8.0}}}},
        {"backend": "flashinfer", "versions": {"torch": "2", "cuda": "13.0", "triton": "3.6.0", "flashinfer": "0.6"},
         "shapes": {"256,512": {"1": {"us": 8.0}}}},
        {"backend": "triton", "versions": {"torch": "2", "cuda": "13.0", "triton": "3.6.0"},
         "shapes": {"256,512": {"1": {"us": 9.0, "config": config}, "2": {"us": 9.0, "config": config}}}}]}
    run = {"environment": env, "capabilities": {"packages": {"deep_gemm": "2.6.1+local", "flashinfer": "0.7"}},
           "points": [{"n": 256, "k": 512, "m": 1, "us": {"cuda-scaled-mm": 12.1, "deepgemm": 8.0 * 1.21,
                                                          "flashinfer": 1.0, "triton": 9.0 * 1.21, "auto": 1.0},
                       "configs": {"triton": config}},
                      {"n": 256, "k": 512, "m": 2, "us": {"cuda-scaled-mm": 10.0 * 1.1 ** 3, "triton": 1.0},
                       "configs": {"triton": other}},
                      {"n": 256, "k": 512, "m": 3, "us": {"cuda-scaled-mm": 1.0}}]}  # not a bucket's M: not a row's
    folded, count = merge_tuning.fold(base, run, "regret_x")
    assert count == 4 and validate_table(folded) is None and folded["folded"] == ["2026-12-02T10:00:00Z regret_x"]
    rows = {g["backend"]: g["shapes"]["256,512"] for g in folded["groups"]}
    assert rows["cuda-scaled-mm"]["1"] == {"us": 11.0, "runs": 2}  # sqrt(10 * 12.1)
    assert rows["cuda-scaled-mm"]["2"] == {"us": 11.0, "runs": 3}  # (10 * 10 * 10 * 1.331) ** (1/3)
    assert rows["deepgemm"]["1"] == {"us": 8.8, "runs": 2}
    assert rows["flashinfer"]["1"] == {"us": 8.0}  # timed at another version
    assert rows["triton"]["1"] == {"us": 9.9, "config": config, "runs": 2}
    assert rows["triton"]["2"] == {"us": 9.0, "config": config}  # the run ran another configuration
    with pytest.raises(SystemExit, match="already folded"):
        merge_tuning.fold(folded, run, "regret_x")
    assert merge_tuning.unfold(folded, run) == base and merge_tuning.unfold(base, run) is base
    retimed = json.loads(json.dumps(folded))
    retimed["groups"][1]["shapes"]["256,512"]["1"] = {"us": 7.0}  # deepgemm's re-timed whole since the fold
    assert merge_tuning.unfold(retimed, run)["groups"][1]["shapes"]["256,512"]["1"] == {"us": 7.0}
    path = tmp_path / "regret_x.json"
    path.write_text(json.dumps(run))
    (tmp_path / "base.json").write_text(json.dumps(base))
    with pytest.raises(SystemExit, match="needs --fold"):
        merge_tuning.main([str(tmp_path / "base.json"), str(path), str(tmp_path / "out.json")])
    merge_tuning.main([str(tmp_path / "base.json"), str(path), str(tmp_path / "out.json"), "--fold"])
    assert json.loads((tmp_path / "out.json").read_text()) == folded
    with pytest.raises(SystemExit, match="devices differ"):
        merge_tuning.fold(base, {**run, "environment": {**env, "device": "other"}}, "regret_y")


def test_a_run_folded_into_the_shipped_table_is_scored_without_its_timings() -> None:
    """--replan plans a folded run from the shipped table with the run's timings taken back out: the same figures
    as from the table folded from the other runs alone (out of sample)."""
    from benchmarks import merge_tuning, summarize_regret
    from fp8select.measured.table import SHIPPED_DIR

    shipped = json.loads((SHIPPED_DIR / "tuning-nvidia-h200.json").read_text())
    name = "regret_vendors_decode_check"
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    run = json.loads((results / f"{name}.json").read_text())
    assert any(entry.endswith(" " + name) for entry in shipped["folded"])
    without = merge_tuning.unfold(shipped, run)
    assert len(without["folded"]) == len(shipped["folded"]) - 1
    assert summarize_regret.replan(results, table=shipped)[name] == \
        summarize_regret.replan(results, table=without)[name]


def test_model_check_cross_validates_by_shape_and_by_model_against_the_best_single_backend() -> None:
    """Two DeepSeek-V3 shapes and one unlisted: leaving the model out removes both of its shapes at once, so
    they are planned from the unlisted shape only; vs_single is the pick's time over the layer's one best backend."""
    from benchmarks import model_check

    times = {(2112, 7168): {"a": 10.0, "b": 20.0}, (4096, 7168): {"a": 10.0, "b": 20.0}, (65536, 7168): {"a": 30.0, "b": 10.0}}
    table = {"device_name": "gpu", "schema": 2, "groups": [
        {"backend": b, "versions": {"torch": "2"}, "shapes": {f"{n},{k}": {"1": {"us": t[b]}} for (n, k), t in times.items()}}
        for b in ("a", "b")]}
    assert model_check.model_of((2112, 7168)) == model_check.model_of((4096, 7168)) == "DeepSeek-V3/R1/V3.1"
    report = model_check.cross_validation(table, None)
    assert report["models"] == {"65536x7168": ["65536x7168"], "DeepSeek-V3/R1/V3.1": ["2112x7168", "4096x7168"]}
    by_shape, by_model = report["leave_one_shape_out"], report["leave_one_model_out"]
    assert (by_shape["over_8pct"], by_model["over_8pct"]) == (1, 3)  # 65536x7168 is wrong either way
    assert by_model["worst"] == 3.0 and by_model["vs_single_worst"] == 3.0
    # per layer: by shape only 65536x7168 picks wrong (a, 3x its one best backend b); by model the DeepSeek-V3
    # layers too (b, planned from 65536x7168 alone: 2x a)
    assert [(r["layers"], r["layers_slower_than_single"], r["layer_vs_single_worst"]) for r in (by_shape, by_model)] \
        == [(3, 1, 3.0), (3, 3, 3.0)]
    assert model_check.cross_validation(table, {"a"})["leave_one_model_out"]["worst"] == 1.0


def test_the_kept_results_are_distilled() -> None:
    """benchmarks/results/ holds the figures the docs quote, not run logs: JSON only, under 2,000 lines in all."""
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    files = sorted(results.iterdir())
    assert files and all(f.suffix == ".json" for f in files), [f.name for f in files if f.suffix != ".json"]
    lines = sum(len(f.read_text().splitlines()) for f in files)
    assert lines < 2000, f"benchmarks/results/ holds {lines} lines: distil them"
    for f in files:
        json.loads(f.read_text())


def test_moe_model_check_scores_the_model_the_rule_and_one_route_by_measured_times() -> None:
    """Three shapes of one expert size: CUTLASS is twice as fast as DeepGEMM at E 8 and 16, DeepGEMM masked
    twice as fast as CUTLASS at E 64; left out in turn, E 8 and 16 are modelled from each other (right), and
    E 64 from them (wrong by 2x); leaving the model out leaves nothing to model from."""
    from benchmarks import moe_model_check

    times = {8: {"deepgemm/masked": 20.0, "deepgemm/contiguous": 30.0, "cutlass/offsets": 10.0},
             16: {"deepgemm/masked": 20.0, "deepgemm/contiguous": 30.0, "cutlass/offsets": 10.0},
             64: {"deepgemm/masked": 10.0, "deepgemm/contiguous": 30.0, "cutlass/offsets": 20.0}}
    entries = [{"backend": r.split("/")[0], "layout": r.split("/")[1], "versions": {"torch": "2"},
                "shapes": {f"{e},1024,512,8": {"1": {"us": t[r]}, "128": {"us": t[r]}} for e, t in times.items()}}
               for r in times[8]]
    report = moe_model_check.cross_validation({"device_name": "gpu", "moe": entries})
    by_shape = report["leave_one_shape_out"]["summary"]
    assert by_shape["points"] == 6 and by_shape["model"]["worst"] == 2.0 and by_shape["model"]["over_8pct"] == 2
    assert by_shape["model"]["worst_at"] == "64,1024,512,8 M 1"
    # the rule: masked at M 1 (2x at E 8 and 16), contiguous at M 128 (3x, 3x, 3x)
    assert by_shape["rule"]["geomean"] == pytest.approx((2 * 2 * 1 * 3 * 3 * 3) ** (1 / 6), abs=1e-4)
    assert by_shape["always"]["worst"] == 2.0 and by_shape["always"]["over_8pct"] == 2
    assert "model_skewed" not in by_shape  # no row has a skewed time
    assert report["leave_one_model_out"]["summary"] == {"points": 0}
    # with skewed times where DeepGEMM masked is 4x faster than CUTLASS at E 8 and 16: ranked by both (2x behind
    # uniform is less than 4x behind skewed), E 8 and 16 run masked: right under skew, 2x the fastest uniform
    for entry in entries:
        for e, buckets in entry["shapes"].items():
            for row in buckets.values():
                row["skewed_us"] = row["us"] / 8 if entry["layout"] == "masked" and not e.startswith("64,") else row["us"]
    by_shape = moe_model_check.cross_validation({"device_name": "gpu", "moe": entries})["leave_one_shape_out"]["summary"]
    assert by_shape["model_skewed"]["points"] == 6 and by_shape["model"]["worst_at"] == "8,1024,512,8 M 1"
    assert by_shape["model"]["worst"] == 2.0 and by_shape["model"]["over_8pct"] == 4
    assert by_shape["model_skewed"]["worst"] == 1.0


def test_moe_model_check_on_the_shipped_table_beats_the_rule_and_is_the_kept_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import moe_model_check

    out = tmp_path / "check.json"
    assert moe_model_check.main(["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "leave-one-shape-out" in text and "model geo/worst" in text
    report = json.loads(out.read_text())
    summary = report["leave_one_shape_out"]["summary"]
    assert summary["points"] == 70 and len(report["leave_one_shape_out"]["folds"]) == 5
    # measured properties of the shipped H200 rows, asserted loosely
    assert summary["model"]["geomean"] < summary["rule"]["geomean"] - 0.1
    assert summary["model"]["geomean"] < summary["always"]["geomean"]  # better than always running CUTLASS
    kept = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "moe_model_check.json").read_text())
    assert kept == report  # the kept result is what the tool computes from the shipped table today


def test_moe_model_check_on_another_devices_routes_is_the_kept_result(tmp_path: Path) -> None:
    """``--routes``: the H100's distilled route times (benchmarks.moe_routes) as the table, every point of the
    report a point of the cross-validation, and the kept figures what the tool computes from them today."""
    from benchmarks import moe_model_check, moe_routes

    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    routes = json.loads((results / "moe_routes_h100.json").read_text())
    truth = moe_model_check.table_truth(moe_routes.as_table(routes))
    assert len(truth) == len(routes["points"]) and all(
        truth[(tuple(int(v) for v in p["shape"].split(",")), p["m"])] == {r: t[0] for r, t in p["us"].items()}
        for p in routes["points"])
    out = tmp_path / "check.json"
    assert moe_model_check.main(["--routes", str(results / "moe_routes_h100.json"), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["routes"] == "benchmarks/results/moe_routes_h100.json" and "table" not in report
    assert report == json.loads((results / "moe_model_check_h100.json").read_text())


def test_regret_ties_names_the_points_whose_two_fastest_rows_are_within_the_margin() -> None:
    """--ties times the points one timing orders by chance: the two fastest of the machine's backends within the margin."""
    from benchmarks.regret import near_ties

    table = {"groups": [
        {"backend": "a", "shapes": {"256,512": {"1": {"us": 10.0}, "2": {"us": 10.0}, "4": {"us": 10.0}}, "512,512": {"1": {"us": 5.0}}}},
        {"backend": "b", "shapes": {"256,512": {"1": {"us": 10.2}, "2": {"us": 11.0}, "4": {"us": 9.0}}}},
        {"backend": "c", "shapes": {"256,512": {"2": {"us": 10.1}, "4": {"us": 9.1}}, "512,512": {"1": {"us": 5.1}}}}]}
    assert near_ties(table, ["a", "b", "c"], 0.03) == {(256, 512): [1, 2, 4], (512, 512): [1]}
    assert near_ties(table, ["a", "b"], 0.03) == {(256, 512): [1]}  # c's rows are not this machine's
    assert near_ties(table, ["a", "b", "c"], 0.015) == {(256, 512): [2, 4]}
    table["groups"][2]["shapes"]["512,512"]["1"]["us"] = 5.02
    assert list(near_ties(table, ["a", "b", "c"], 0.03)) == [(512, 512), (256, 512)]  # the closest contest (0.4%) first


def test_moe_writes_its_report_as_kept_each_columns_worst_numerics_and_a_timing_per_line() -> None:
    """benchmarks.moe's moe.json is the kept form itself: numerics as each column's worst case (a case that
    raised counted apart), whether M 0 held, the summary of auto against the fastest pinned column, a
    timing per line."""
    from benchmarks import moe

    timing = [{"shape": "s", "m": 1, "routing": "uniform", "column": c, "median_us": us}
              for c, us in (("auto", 10.5), ("triton/sorted", 10.0), ("cutlass/offsets", 12.0))]
    numerics = [{"shape": "s", "m": 1, "routing": "uniform", "column": "triton/sorted", "rel_err": 0.004,
                 "rel_err_vs_bf16_gemm_outputs": 0.0123456},
                {"shape": "s", "m": 16, "routing": "skewed", "column": "triton/sorted", "rel_err": 0.006,
                 "rel_err_vs_bf16_gemm_outputs": 0.01},
                {"shape": "s", "m": 16, "routing": "skewed", "column": "cutlass/offsets", "error": "RuntimeError()"},
                {"shape": "s", "m": 0, "routing": "empty", "column": "auto", "ok": False}]
    report = {"device": "gpu", "torch": "2", "triton": "3", "packages": {}, "command": "python -m benchmarks.moe",
              "moe_plans": {}, "notes": [], "numerics": numerics, "timing": timing, "summary": moe.summarize(timing),
              "seconds": 1.0}
    text = moe.kept(report)
    kept = json.loads(text)
    assert kept["numerics_worst"] == {"triton/sorted": {"rel_err": 0.006, "rel_err_vs_bf16_gemm_outputs": 0.0123,
                                                        "cases": 2},
                                      "cutlass/offsets": {"rel_err": 0.0, "rel_err_vs_bf16_gemm_outputs": 0.0,
                                                          "cases": 0, "errors": 1}}
    assert kept["m0_ok"] is False and kept["timing"] == timing
    assert kept["summary"]["auto_vs_fastest_geomean"] == 1.05 and kept["summary"]["points"][0]["fastest"] == "triton/sorted"
    assert sum(line.startswith('  {"shape"') for line in text.splitlines()) == len(timing)


@pytest.mark.parametrize(("args", "message"), [
    (["--shapes", "deepseek-v3-e32,nope"], "--shapes: unknown nope; known: deepseek-v3-e8,"),
    (["--m", "1,0"], "--m: expected a comma list of positive integers, found '1,0'"),
])
def test_moe_refuses_unknown_shapes_and_bad_ms_before_looking_for_a_gpu(args, message, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from benchmarks import moe

    with pytest.raises(SystemExit) as info:
        moe.main(["--out", str(tmp_path), *args])
    assert info.value.code == 2 and message in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_the_kept_moe_report_is_what_the_tool_writes() -> None:
    """benchmarks/results/moe.json has the keys and summary benchmarks.moe writes (docs/moe.md quotes them)."""
    from benchmarks import moe

    kept = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "moe.json").read_text())
    assert kept["summary"] == moe.summarize(kept["timing"])
    assert set(kept) == {"device", "torch", "triton", "packages", "command", "moe_plans", "notes", "numerics_worst",
                         "m0_ok", "summary", "seconds", "timing"}


def test_the_kept_pdl_points_are_the_rows_their_summary_was_made_from() -> None:
    """moe_pdl.json keeps a point per line (benchmarks.moe.pdl_points); the flat rows they stand for give its
    summary back."""
    from benchmarks import moe

    kept = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "moe_pdl.json").read_text())
    rows = [{"shape": p["shape"], "m": p["m"], "routing": p["routing"], "config": p["config"], "column": column,
             "median_us": p["off_us"] if column == "off" else p["off_us"] * p["vs_off"][column],
             "vs_off": p["vs_off"].get(column, 1.0), "hbm_fraction": fraction, "same_bits": p["same_bits"]}
            for p in kept["pdl"] for column, fraction in p["hbm_fraction"].items()]
    assert moe.pdl_summary(rows) == kept["summary"]
    assert moe.pdl_points(rows) == kept["pdl"]
    assert len(kept["pdl"]) == 2 * len(moe.PDL_M) * 2 * 2  # shapes, M, two structures, two routings


def test_the_shipped_moe_rows_are_one_timing_of_every_route_under_both_routings() -> None:
    """Every MoE row of the H200 table holds its skewed time (the plan ranks by both); moe-measurements.md and
    moe.md quote what benchmarks.moe_routes makes of them, and moe.md the whole run's figures (moe_all.json)."""
    from benchmarks import moe_routes

    root = Path(__file__).resolve().parent.parent
    table = json.loads((root / "fp8select" / "data" / "tuning-nvidia-h200.json").read_text())
    rows = [row for g in table["moe"] for buckets in g["shapes"].values() for row in buckets.values()]
    assert len(rows) == 272 and all(row["skewed_us"] > 0 for row in rows)
    summary = moe_routes.distil([{"environment": {}, "table": table, "rows": []}], "")["summary"]
    docs = (root / "docs" / "moe-measurements.md").read_text(encoding="utf-8")
    moe = (root / "docs" / "moe.md").read_text(encoding="utf-8")
    first = summary["first_by_ranking"]
    assert (f"Triton first at {first['triton/sorted']} of the {summary['points']} points, CUTLASS at "
            f"{first['cutlass/offsets']}, DeepGEMM masked\n  at {first['deepgemm/masked']}, DeepGEMM contiguous at "
            f"{first['deepgemm/contiguous']}") in docs
    assert f"{len(summary['moved_by_skew'])} of the 70 points" in docs
    ratios = summary["triton_speed_over_deepgemm_contiguous"]
    assert f"{summary['triton_at_least_0.8x']} points; the misses at M 8192: {ratios['32,7168,2048,8 M 8192']:.3f} (32 " \
           f"experts) and {ratios['8,7168,2048,8 M 8192']:.3f} (8 experts)" in moe
    whole = json.loads((root / "benchmarks" / "results" / "moe_all.json").read_text())["summary"]
    assert whole["points"] == 140
    assert f"**{whole['auto_vs_fastest_geomean']:.3f} / {whole['auto_vs_fastest_worst']:.3f}** over the 140" in moe
