"""The maintained tools of benchmarks/ (no GPU): each imports as ``benchmarks.NAME`` without touching ``sys.path``,
those that time kernels stop with one line and exit status 2 on a machine without CUDA (writing nothing), and the
distilled results they keep stay small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

# Tool name -> the smallest arguments with which it would start measuring on a GPU (output under OUT).
NEEDS_CUDA = {
    "regret": ["--out", "OUT/regret.json"],
    "limits": ["--out", "OUT/limits.json"],
    "decode_anatomy": ["--out", "OUT/anatomy.json"],
    "decode_ab": ["--out", "OUT/ab.json"],
    "fewer_rows": ["--out", "OUT/fewer_rows.json"],
    "gpu_check": ["--out", "OUT/check"],
    "h200_checks": ["--out", "OUT/checks.json"],
    "host_overhead": ["--out", "OUT/host"],
    "invariance": ["--out", "OUT/invariance"],
    "jit_warm": ["--out", "OUT/warm.json"],
    "moe": ["--out", "OUT/moe"],
    "moe_gate_up": ["--out", "OUT/gate_up"],
    "moe_host": ["--out", "OUT/moe_host"],
    "moe_host_split": ["--out", "OUT/moe_host_split"],
    "moe_peer": ["--out", "OUT/peer"],
    "sweep_triton": ["--out", "OUT/sweep.json"],
}
ON_CPU = ("summarize_regret", "distill_limits", "merge_tuning", "model_check", "moe_model_check", "moe_routes", "moe_brief")


def _tools() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))


def test_every_tool_is_sorted_into_gpu_or_cpu() -> None:
    assert sorted([*NEEDS_CUDA, *ON_CPU]) == _tools()


def test_no_tool_patches_the_import_path() -> None:
    for path in BENCHMARKS.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "sys.path" not in text and "PYTHONPATH" not in text, path.name


@pytest.mark.parametrize("tool", sorted(NEEDS_CUDA))
def test_a_gpu_tool_without_cuda_says_so_in_one_line_and_exits_2(
        tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    module = importlib.import_module(f"benchmarks.{tool}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [a.replace("OUT", str(tmp_path)) for a in NEEDS_CUDA[tool]]
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{tool}: error: needs a CUDA GPU"), err
    assert not any(tmp_path.iterdir())  # nothing written


def test_run_as_a_module_without_cuda() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.regret", "--out", os.devnull], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_the_distilled_results_are_json_and_small() -> None:
    files = sorted((BENCHMARKS / "results").iterdir())
    assert files and all(p.suffix == ".json" and p.is_file() for p in files), files
    assert sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files) < 2000


def test_the_results_summarize_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import summarize_regret

    summarize_regret.main([str(BENCHMARKS / "results")])
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == list(summarize_regret.SETS)  # every set has its kept file


@pytest.mark.parametrize("name", ["moe_gate_up.json", "moe_gate_up_h200.json"])
def test_the_kept_gate_up_run_summarizes_as_its_points_say(name: str) -> None:
    """``benchmarks.moe_gate_up``'s summary, recomputed from the kept points (an H100 SXM's and an H200's): the
    fused tile against the plain ones, and the count at 0.8 of DeepGEMM contiguous's speed from M 1024."""
    from benchmarks import moe_gate_up

    kept = json.loads((BENCHMARKS / "results" / name).read_text())
    summary = moe_gate_up.summary(kept["points"])
    assert summary == kept["summary"]
    large = [p for p in kept["points"] if p["m"] >= 1024]
    fused = sum(p["us"]["deepgemm/contiguous"] / p["us"]["fused64"] >= 0.8 - 5e-4 for p in large)
    assert summary["at_least_0.8_of_deepgemm_from_m_1024"]["fused64"] == f"{fused} of {len(large)}"
    ratios = [p["us"]["fused64"] / p["us"]["plain64"] for p in kept["points"]]
    assert summary["fused64_vs_plain64"]["max"] == round(max(ratios), 3)
    assert summary["fused64_vs_plain64"]["geomean"] < 1  # faster in geomean (on the H100 at every point)


@pytest.mark.parametrize(("name", "expected"), [
    ("moe_gate_up.json", {"rule": (1.0019, 1.023, 15), "before": (1.0421, 1.099, 11)}),
    ("moe_gate_up_h200.json", {"rule": (1.0113, 1.066, 15), "before": (1.0563, 1.136, 12)})])
def test_the_moe_prefill_rule_scores_on_the_kept_gate_up_runs_as_its_docstring_says(
        name: str, expected: dict[str, tuple[float, float, int]]) -> None:
    """``moe_config.default_config`` from 64 tokens per expert (each point's column the rule's configuration)
    against the fastest Triton structure of each point of ``moe_gate_up.json`` (the H100 run it was chosen on)
    and ``moe_gate_up_h200.json`` (an H200's, checked afterwards), and the points from M 1024 where it reaches
    0.8 of DeepGEMM contiguous's speed: the figures its docstring quotes, for the rule and for the fused 64-row
    tile it replaced from 256 tokens."""
    from benchmarks import moe_gate_up
    from benchmarks._stats import geomean
    from fp8select.kernels.moe_config import default_config
    from fp8select.measured.moe import MOE_SHAPES

    kept = json.loads((BENCHMARKS / "results" / name).read_text())
    structures = moe_gate_up.configs()
    column = {config: name for name, config in structures.items()}
    figures = {}
    for rule, pick in (("rule", lambda m, k, e: column[default_config(m, k, e)]), ("before", lambda m, k, e: "fused64")):
        ratios, met = [], 0
        for p in (p for p in kept["points"] if p["tokens_per_expert"] >= 64):
            e, _, _, k = MOE_SHAPES[p["shape"]]
            us = p["us"][pick(p["m"], k, e)]
            ratios.append(us / min(p["us"][name] for name in structures))
            met += p["m"] >= 1024 and p["us"]["deepgemm/contiguous"] / us >= 0.8 - 5e-4
        figures[rule] = (geomean(ratios), round(max(ratios), 3), met)
    assert figures == expected


def test_the_moe_rule_scores_on_the_kept_candidate_timings_as_its_docstring_says() -> None:
    """``moe_config.default_config`` at each kept point's M bucket (what a plan runs there) against the fastest
    candidate timed there under either routing: the figures its docstring quotes for the
    points it was chosen on and those it was checked on."""
    from benchmarks._stats import geomean
    from fp8select.buckets import m_bucket
    from fp8select.kernels.moe_config import default_config

    kept = json.loads((BENCHMARKS / "results" / "moe_rule_h100.json").read_text())
    figures = {}
    for which in ("chosen on", "checked on"):
        ratios = []
        for p in (p for p in kept["points"] if p["set"] == which):
            experts, _, _, top_k = (int(v) for v in p["shape"].split(","))
            uniform, skewed = p["us"][default_config(m_bucket(p["m"]), top_k, experts).describe()]
            ratios.append((uniform / min(u for u, _ in p["us"].values()), skewed / min(s for _, s in p["us"].values())))
        figures[which] = (round(geomean([u for u, _ in ratios]), 3), round(geomean([s for _, s in ratios]), 3),
                          round(max(max(r) for r in ratios), 3))
    assert figures == {"chosen on": (1.03, 1.017, 1.1), "checked on": (1.029, 1.024, 1.073)}


def test_a_point_timed_with_another_configuration_than_todays_is_stale(tmp_path: Path) -> None:
    """A run records the configuration each pinned backend ran; where today's plan picks that backend with
    another one, the kept time is not the pick's: --replan lists the point as stale, not as a regret. A run
    that recorded none (the kept one) ran the table's own rows: stale where today's plan takes a larger
    bucket's configuration."""
    from benchmarks import summarize_regret
    from benchmarks.merge_tuning import unfold
    from fp8select import Capabilities, resolve

    run = json.loads((BENCHMARKS / "results" / "regret_novendors_served.json").read_text())
    table = json.loads((ROOT / "fp8select" / "data" / "tuning-nvidia-h200.json").read_text())
    selection = resolve(Capabilities.from_dict(run["capabilities"]), plugins=False, order=run["chain"],
                        tuning=unfold(table, run))  # as --replan plans it: the run's own timings taken out
    todays = {}
    for p in run["points"]:
        route = selection.plan_for(p["n"], p["k"]).route(p["m"])
        if route.backend == "triton":
            todays[(p["n"], p["k"], p["m"])] = route.config.to_dict()
    taken = [f"{n}x{k} M {m}: triton" for (n, k, m), config in todays.items()
             if summarize_regret._own_config(table, "triton", n, k, m) != config]
    kept = summarize_regret.replan(BENCHMARKS / "results")["regret_novendors_served"]
    assert taken and kept["stale"] == taken
    other = next(key for key in sorted(todays) if f"{key[0]}x{key[1]} M {key[2]}: triton" not in taken)
    for p in run["points"]:
        if (p["n"], p["k"], p["m"]) == other:
            p["configs"] = {"triton": {**todays[other], "num_stages": todays[other]["num_stages"] + 1}}
    (tmp_path / "regret_novendors_served.json").write_text(json.dumps(run))
    found = summarize_regret.replan(tmp_path)["regret_novendors_served"]
    assert set(found["stale"]) == {*taken, f"{other[0]}x{other[1]} M {other[2]}: triton"}
    assert found["points"] == kept["points"] - 1


def test_fewer_rows_times_every_row_a_larger_buckets_configuration_stands_in_for() -> None:
    """benchmarks.fewer_rows: the points where the plan takes a larger bucket's Triton configuration, with both
    configurations, the largest gain first; its summary compares only points timed with both."""
    from benchmarks import fewer_rows

    table = {"groups": [{"backend": "triton", "versions": {}, "shapes": {
        "512,1024": {str(m): {"us": us, "config": {"at": m}} for m, us in ((16, 5.0), (32, 9.0), (64, 7.0))},
        "1024,1024": {str(m): {"us": us, "config": {"at": m}} for m, us in ((32, 12.0), (64, 11.9), (128, 8.0))}}},
        {"backend": "vendor", "versions": {}, "shapes": {"512,1024": {"32": {"us": 9.0}, "64": {"us": 1.0}}}}]}
    points = fewer_rows.stand_ins(table)
    assert [(p["n"], p["m"], p["taken_m"]) for p in points] == [(1024, 32, 128), (1024, 64, 128), (512, 32, 64)]
    assert points[2]["configs"] == {"own": {"at": 32}, "taken": {"at": 64}}
    assert points[2]["table_us"] == {"own": 9.0, "taken": 7.0}
    timed = [{"us": {"own": 10.0, "taken": 8.0}}, {"us": {"own": 10.0, "taken": 12.5}}, {"rel_err": {"own": 1.0}}]
    assert fewer_rows.summarize(timed) == {"points": 2, "taken_faster": 1, "taken_over_own_geomean": 1.0,
                                           "taken_over_own_worst": 1.25, "taken_over_own_best": 0.8}
    assert fewer_rows.summarize([]) == {"points": 0}


def test_the_kept_timings_rescore_todays_plan_without_a_gpu() -> None:
    """--replan plans every table-planned H200 run's points with this code and scores the picks with the kept
    pinned timings; on the served shapes' runs (measured with today's plan rules) today's picks stay within the
    shipped-shape targets in geomean (a row re-tuned since a run is scored at the run's time, not its own)."""
    from benchmarks import summarize_regret

    found = summarize_regret.replan(BENCHMARKS / "results")
    kept = {p.stem for p in (BENCHMARKS / "results").glob("regret_*.json")  # not planned from rows measured at load
            if not any(shape["measured"] for shape in json.loads(p.read_text())["load_time_tuning"])}
    assert set(found) == kept and {"regret_vendors_unseen_model", "regret_vendors_shipped_last"} <= kept
    assert "regret_vendors_unseen_default" not in kept
    for figures in found.values():
        assert 1.0 <= figures["now"][0] <= figures["now"][1] and 1.0 <= figures["then"][0] <= figures["then"][1]
    for name in ("regret_vendors_served", "regret_novendors_served"):
        assert found[name]["now"][0] <= 1.02 and len(found[name]["changed"]) <= 0.05 * found[name]["points"], found[name]


def test_the_moe_invariant_cost_takes_the_cheapest_route_a_record_qualifies_for_every_bucket() -> None:
    from benchmarks.invariance import moe_table_cost
    from fp8select.buckets import M_BUCKETS

    def rows(us: Callable[[int], float], config: dict[str, int] | None = None) -> dict[str, dict[str, object]]:
        return {str(b): {"us": us(b)} | ({"config": config} if config else {}) for b in M_BUCKETS}

    cfg = {"BLOCK_M": 16}
    table = {"moe": [
        {"backend": "cutlass", "layout": "offsets", "shapes": {"8,256,128,2": rows(lambda b: 2.0)}},
        {"backend": "deepgemm", "layout": "masked", "shapes": {"8,256,128,2": rows(lambda b: 1.0)}},  # fastest, M <= 2048 only
        {"backend": "triton", "layout": "sorted", "shapes": {"8,256,128,2": rows(lambda b: 1.5, cfg)}},
    ]}
    record = {"invariant": True, "m": [1, 8192]}
    records = {"records": [
        record | {"backend": "cutlass", "layout": "offsets", "schedule": [{"from_m": 1, "config": None}]},
        record | {"backend": "deepgemm", "layout": "masked", "m": [1, 2048], "schedule": [{"from_m": 1, "config": None}]},
        record | {"backend": "triton", "layout": "sorted", "schedule": [{"from_m": 1, "config": {"BLOCK_M": 32}}]},
    ]}
    cost = moe_table_cost(table, records)
    # masked stops at 2048, Triton's record names a configuration the table never timed: CUTLASS, at 2x the fastest
    assert cost["shapes"]["8,256,128,2"]["invariant_route"] == "cutlass/offsets"
    assert cost["geomean_ratio"] == 2.0 and not cost["within_budget"]
    records["records"][2]["schedule"][0]["config"] = cfg
    cost = moe_table_cost(table, records)
    assert cost["shapes"]["8,256,128,2"]["invariant_route"].startswith("triton/sorted")
    assert cost["geomean_ratio"] == 1.5


def test_performance_md_quotes_the_replanned_shipped_shapes_pooled_per_set() -> None:
    """The out-of-sample figures of the folded table in docs/performance.md are --replan's, pooled per set."""
    from benchmarks import summarize_regret

    pooled = summarize_regret.replan_sets(summarize_regret.replan(BENCHMARKS / "results"))
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    for label in ("vendors, every shipped shape (table)", "no vendors, every shipped shape (table)"):
        figures = pooled[label]
        over = f"{figures['over_3pct']} over 3%" if figures["over_3pct"] else "none over 3%"
        assert f"{figures['now'][0]:.4f}, {figures['now'][1]:.3f}; {over}" in performance, (label, figures)
    check = pooled["vendors, decode check of the near-tie rules (table)"]["now"]
    assert f"{check[0]:.4f}, {check[1]:.3f} |" in performance


def test_moe_host_split_counts_each_wrapped_step_and_puts_every_attribute_back() -> None:
    import json as json_module

    import fp8select.backends.moe_cutlass as cutlass
    import fp8select.backends.moe_deepgemm as deepgemm
    from benchmarks import moe_host_split as tool
    from fp8select.kernels import triton_launch

    before = (json_module.dumps, deepgemm.require, cutlass.require, triton_launch.BoundKernel.__call__)
    steps = tool.Steps()
    with tool.wrapped(steps, {"json": ("dumps", "not_there")}):
        assert json_module.dumps is not before[0] and deepgemm.require is not before[1]
        assert json_module.dumps([1]) == "[1]" and not steps.calls  # counted only while on
        steps.on = True
        json_module.dumps([1])
        json_module.dumps([2])
        steps.on = False
    assert (json_module.dumps, deepgemm.require, cutlass.require, triton_launch.BoundKernel.__call__) == before
    assert steps.calls == {"json.dumps": 2} and steps.seconds["json.dumps"] > 0
    steps.clear()
    steps.add("a", 0.002)
    steps.add("a", 0.002)
    steps.add("b", 0.008)
    assert steps.per_call(4) == {"split_us": {"b": 2000.0, "a": 1000.0}, "calls": {"b": 0.25, "a": 0.5}}


def _moe_run(rows: dict[str, dict[int, tuple[float, float]]], errors: dict[str, float], shape: str = "32,7168,2048,8",
             ) -> dict[str, object]:
    """A ``tune --moe --json`` file's content: the table's MoE rows (route -> m -> (us, skewed_us)), the checks."""
    moe = [{"backend": r.split("/")[0], "layout": r.split("/")[1], "versions": {},
            "shapes": {shape: {str(m): {"us": u, "skewed_us": s} for m, (u, s) in by_m.items()}}}
           for r, by_m in rows.items()]
    return {"environment": {"device": "NVIDIA H100 80GB HBM3"}, "table": {"moe": moe},
            "rows": [{"shape": shape, "m": 1, "route": r, "rel_err": e} for r, e in errors.items()]}


def test_moe_routes_ranks_each_point_as_the_plan_does_and_later_runs_win(tmp_path: Path) -> None:
    from benchmarks import moe_routes

    first = _moe_run({"triton/sorted": {128: (100.0, 200.0), 1024: (500.0, 500.0)},
                      "deepgemm/masked": {128: (102.0, 150.0)}, "deepgemm/contiguous": {1024: (300.0, 300.0)}},
                     {"triton/sorted": 0.004, "deepgemm/masked": 0.02})
    second = _moe_run({"triton/sorted": {1024: (360.0, 360.0)}}, {"triton/sorted": 0.006})
    report = moe_routes.distil([first, second], "tune ...")
    by_m = {p["m"]: p for p in report["points"]}
    # M 128: Triton 2% ahead uniform, 33% behind skewed: the ranking runs DeepGEMM masked, as the plan would
    assert (by_m[128]["fastest_uniform"], by_m[128]["ranked_first"]) == ("triton/sorted", "deepgemm/masked")
    assert by_m[1024]["us"]["triton/sorted"] == [360.0, 360.0]  # the second run's row
    summary = report["summary"]
    assert summary["moved_by_skew"] == ["32,7168,2048,8 M 128: triton/sorted -> deepgemm/masked"]
    assert summary["triton_speed_over_deepgemm_contiguous"] == {"32,7168,2048,8 M 1024": 0.833}
    assert summary["triton_at_least_0.8x"] == "1 of 1" and report["device"] == "NVIDIA H100 80GB HBM3"
    assert report["rel_err_worst"]["32,7168,2048,8"] == {"triton/sorted": 0.006, "deepgemm/masked": 0.02}
    runs = []
    for i, run in enumerate((first, second)):
        runs.append(tmp_path / f"run{i}.json")
        runs[-1].write_text(json.dumps(run))
    moe_routes.main([*map(str, runs), "--out", str(tmp_path / "out.json"), "--command", "tune ..."])
    assert json.loads((tmp_path / "out.json").read_text()) == json.loads(json.dumps(report))


def test_moe_routes_reads_a_tables_rows_as_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import moe_routes

    run = _moe_run({"triton/sorted": {128: (100.0, 200.0)}, "deepgemm/masked": {128: (102.0, 150.0)}}, {})
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"device_name": "NVIDIA H200", **run["table"]}))  # type: ignore[dict-item]
    moe_routes.main(["--table", str(table)])
    report = json.loads(capsys.readouterr().out)
    assert report["points"] == moe_routes.distil([run], "")["points"] and report["device"] == "NVIDIA H200"
    assert report["rel_err_worst"] == {} and report["command"] == f"the MoE rows of {table}"
    for argv in ([], ["--table", str(table), str(table)], [str(table)]):  # neither, both, runs without --out
        with pytest.raises(SystemExit):
            moe_routes.main(argv)


def test_moe_routes_writes_a_kept_report_as_the_table_to_ship(tmp_path: Path) -> None:
    """``--report --to-table``: each route's rows at the runs' torch, CUDA and Triton and its own packages'
    releases, Triton's at the rule's configuration (what ``tune --moe --max-configs 1`` timed with no table of
    the device); refused for runs of mixed versions or devices, or a backend's package left out. The shipped
    H100 SXM table is exactly that of its kept report."""
    from benchmarks import moe_routes
    from fp8select.kernels.moe_config import default_config
    from fp8select.measured.table import SHIPPED_DIR, load_table

    run = _moe_run({"triton/sorted": {128: (100.0, 200.0)}, "deepgemm/masked": {128: (102.0, 150.0)}}, {})
    env = {"torch": "2.11.0+cu130", "cuda": "13.0", "triton": "3.6.0", "device": "NVIDIA H100 80GB HBM3"}
    report = moe_routes.distil([{**run, "environment": env}, {**run, "environment": env}], "tune ...")
    table = moe_routes.shippable(report, {"deep_gemm": "2.6.1+local"})
    assert table["device_name"] == "NVIDIA H100 80GB HBM3" and table["groups"] == []
    versions = {f"{e['backend']}/{e['layout']}": e["versions"] for e in table["moe"]}
    assert versions == {"triton/sorted": {"cuda": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0"},
                        "deepgemm/masked": {"cuda": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0",
                                            "deep_gemm": "2.6.1"}}
    triton = next(e for e in table["moe"] if e["backend"] == "triton")["shapes"]["32,7168,2048,8"]["128"]
    assert triton == {"us": 100.0, "skewed_us": 200.0, "config": default_config(128, 8, 32).to_dict()}
    with pytest.raises(ValueError, match="need the version of deep_gemm"):
        moe_routes.shippable(report, {})
    other = moe_routes.distil([{**run, "environment": env}, {**run, "environment": {**env, "torch": "2.10.0"}}], "")
    with pytest.raises(ValueError, match="other torch, CUDA or Triton versions"):
        moe_routes.shippable(other, {"deep_gemm": "2.6.1"})
    two = moe_routes.distil([{**run, "environment": env}, {**run, "environment": {**env, "device": "NVIDIA H200"}}], "")
    with pytest.raises(ValueError, match="a table is one device's"):
        moe_routes.shippable(two, {"deep_gemm": "2.6.1"})
    source = Path(__file__).parents[1] / "benchmarks/results/moe_routes_h100.json"
    kept = json.loads(source.read_text())
    out = tmp_path / "h100.json"
    moe_routes.main(["--report", str(source), "--packages",
                     "deep_gemm=2.6.1,sgl_kernel=0.4.4", "--to-table", str(out)])
    shipped = SHIPPED_DIR / "tuning-nvidia-h100-80gb-hbm3.json"
    assert load_table(out) == load_table(shipped) == moe_routes.shippable(
        kept, {"deep_gemm": "2.6.1", "sgl_kernel": "0.4.4"}, "benchmarks/results/moe_routes_h100.json")
    with pytest.raises(SystemExit):
        moe_routes.main(["--report", str(out)])  # without --to-table


def test_moe_brief_keeps_a_line_per_shape_of_a_whole_run() -> None:
    from benchmarks import moe_brief

    def timing(shape: str, m: int, routing: str, column: str, fraction: float | None) -> dict[str, object]:
        return {"shape": shape, "m": m, "routing": routing, "column": column, "median_us": 1.0, "hbm_fraction": fraction}

    points = [{"shape": "a", "m": 1, "routing": "uniform", "fastest": "triton/sorted", "auto_ratio": 1.0},
              {"shape": "a", "m": 1, "routing": "skewed", "fastest": "triton/sorted", "auto_ratio": 1.21},
              {"shape": "a", "m": 4096, "routing": "uniform", "fastest": "cutlass/offsets", "auto_ratio": 1.0},
              {"shape": "b", "m": 1, "routing": "uniform", "fastest": "deepgemm/masked", "auto_ratio": 0.9}]
    report = {"device": "NVIDIA H200", "command": "python -m benchmarks.moe --out DIR", "m0_ok": True,
              "summary": {"auto_vs_fastest_geomean": 1.0, "auto_vs_fastest_worst": 1.21, "points": points},
              "timing": [timing("a", 1, "uniform", "auto", 0.8), timing("a", 1, "skewed", "auto", 0.7),
                         timing("a", 1, "uniform", "cutlass/offsets", 0.5), timing("a", 4096, "uniform", "auto", None),
                         timing("b", 1, "skewed", "triton/sorted", 0.6)]}
    kept = json.loads(moe_brief.brief(report))
    assert kept["summary"] == {"points": 4, "auto_vs_fastest_geomean": 1.0, "auto_vs_fastest_worst": 1.21}
    assert "timing" not in kept and kept["command"] == report["command"]
    a, b = kept["shapes"]
    assert (a["shape"], a["points"], a["auto_vs_fastest_geomean"], a["auto_vs_fastest_worst"]) == ("a", 3, 1.0656, 1.21)
    assert a["worst_point"] == "M 1 skewed, fastest triton/sorted"
    assert a["fastest"] == {"triton/sorted": 2, "cutlass/offsets": 1}
    assert a["decode_hbm_fraction"] == {"auto": {"1": [0.8, 0.7]}}  # only auto and Triton, only where a floor is
    assert b["decode_hbm_fraction"] == {"triton/sorted": {"1": [None, 0.6]}}
