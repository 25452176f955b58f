"""tune and bench on the CPU, with the CUDA-graph timer replaced by a fake clock: what is measured,
what is skipped, what the rows look like, and that a tuned table makes the plan pick the winner."""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from fp8select import Capabilities, hookimpl, resolve
from fp8select.backends.reference import ReferenceBackend
from fp8select.buckets import M_BUCKETS
from fp8select.measure import bench, timing
from fp8select.measure.timing import Timing
from fp8select.measure.tune import tune
from fp8select.measured.table import merge_tables, new_table, validate_table

CPU = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",), device_name="cpu-test")
N, K = 256, 384


class Clocked(ReferenceBackend):
    """Reference math; its 'time' is given per M, so the fake clock can report it."""

    requires = ()
    us: ClassVar[dict[str, Any]] = {}
    last: ClassVar[list[str]] = []

    def run(self, prepared: Any, x: torch.Tensor, **kw: Any) -> torch.Tensor:
        Clocked.last.append(self.name)
        Clocked.last.append(str(x.shape[0]))
        return super().run(prepared, x, **kw)


class Small(Clocked):
    name = "small"


class Large(Clocked):
    name = "large"


TIMES = {"small": lambda m: 1.0 if m <= 8 else 5.0, "large": lambda m: 3.0, "reference": lambda m: 50.0}


def fake_clock(columns: Any, replays: int = 50, **kw: Any) -> dict[str, Timing]:
    """Each column's time as the backend its first call ran says, at that call's M."""
    out = {}
    for column, calls in columns.items():
        calls[0]()
        name, m = Clocked.last[-2], int(Clocked.last[-1])
        t = TIMES.get(name, lambda m: 40.0)(m)
        out[column] = Timing(t, t, t)
    return out


class Plugin:
    @hookimpl
    def fp8select_backends(self) -> list[Any]:
        return [Small, Large]


@pytest.fixture
def clocked(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(timing, "time_graphs", fake_clock)
    monkeypatch.setattr(bench, "rotation_copies", lambda *a, **k: 2)
    return resolve(CPU, plugins=[Plugin()], tuning=False)


def test_tune_measures_every_backend_but_reference_and_only_what_is_missing(clocked: Any) -> None:
    table, rows = tune(clocked, [(N, K)], ms=(1, 8, 64), device="cpu")
    assert validate_table(table) is None
    shapes = {g["backend"]: g["shapes"][f"{N},{K}"] for g in table["groups"]}
    assert set(shapes) == {"small", "large"}
    assert {b: {m: r["us"] for m, r in s.items()} for b, s in shapes.items()} == {
        "small": {"1": 1.0, "8": 1.0, "64": 5.0}, "large": {"1": 3.0, "8": 3.0, "64": 3.0}}
    assert all(g["versions"] == {"torch": "2.13.0+cpu"} for g in table["groups"])
    assert all(r.get("correct") for r in rows if "us" in r)
    # a second run with that table known measures nothing; with force, everything again
    again, _ = tune(clocked, [(N, K)], ms=(1, 8, 64), known=table, device="cpu")
    assert again["groups"] == []
    more, _ = tune(clocked, [(N, K)], ms=(1, 8, 64, 512), known=table, device="cpu")
    assert {g["backend"]: list(g["shapes"][f"{N},{K}"]) for g in more["groups"]} == {"small": ["512"], "large": ["512"]}
    forced, _ = tune(clocked, [(N, K)], ms=(1,), known=table, force=True, device="cpu")
    assert len(forced["groups"]) == 2
    resumed, _ = tune(clocked, [(N, K)], ms=(1, 512), known=table, force=True, done=forced, device="cpu")
    assert {g["backend"]: list(g["shapes"][f"{N},{K}"]) for g in resumed["groups"]} == {"small": ["512"], "large": ["512"]}, \
        "with force, what done holds is not measured again"


def test_a_tuned_table_makes_the_plan_pick_the_measured_winner(clocked: Any) -> None:
    table, _ = tune(clocked, [(N, K)], ms=tuple(2**i for i in range(14)), device="cpu")
    table = merge_tables(new_table("cpu-test"), {**table, "device_name": "cpu-test"})
    sel = resolve(CPU, plugins=[Plugin()], tuning=table)
    w = (torch.randn(N, K) * 50).to(torch.float8_e4m3fn)
    layer = sel.prepare(w, torch.rand(2, 3) + 0.5)
    assert layer.main_plan.summary() == "M 1-8: small, M >= 9: large"
    assert {r.why for r in layer.main_plan.routes} == {"measured"}


def test_bench_times_pinned_backends_and_auto_side_by_side(clocked: Any) -> None:
    table, _ = tune(clocked, [(N, K)], ms=tuple(2**i for i in range(14)), device="cpu")
    sel = resolve(CPU, plugins=[Plugin()], tuning={**table, "device_name": "cpu-test"})
    rows = bench.measure(sel, [(N, K)], [4, 64], device="cpu", gemm_alone=False, bf16=False)
    got = {(r["m"], r["backend"]): r["whole"]["median_us"] for r in rows if "whole" in r}
    assert got == {(4, "small"): 1.0, (4, "large"): 3.0, (4, "auto"): 1.0, (64, "small"): 5.0, (64, "large"): 3.0,
                   (64, "auto"): 3.0}
    assert {(r["m"], r["ran"]) for r in rows if r["backend"] == "auto"} == {(4, "small"), (64, "large")}

    from benchmarks import regret

    points = regret.distill(rows)
    summary = regret.summarize(points)
    assert summary["auto_regret_geomean"] == 1.0 and summary["points_over_8pct"] == 0
    assert summary["ideal_vs_always"] == {"large": pytest.approx(3**0.5, rel=1e-3), "small": pytest.approx((5 / 3) ** 0.5, rel=1e-3)}


def test_the_tune_command_saves_after_every_shape_and_merges_into_the_table(
        clocked: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import json

    from fp8select import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "resolve", lambda **kw: clocked)
    from fp8select.measure import tune as tune_module

    real = tune_module.tune
    saved: list[int] = []

    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        inner = kwargs["on_shape"]
        kwargs["on_shape"] = lambda table: (saved.append(1), inner(table))
        return real(*args, **kwargs, device="cpu")

    monkeypatch.setattr(tune_module, "tune", on_cpu)
    out = tmp_path / "t.json"
    assert cli.main(["tune", "--shapes", "256,384,128,384", "--m", "1,64", "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert len(saved) == 2 and {g["backend"] for g in first["groups"]} == {"small", "large"}
    assert cli.main(["tune", "--shapes", "512,384", "--m", "1", "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    shapes = {s for g in merged["groups"] for s in g["shapes"]}
    assert shapes == {"256,384", "128,384", "512,384"}, "a second run adds to the table"


def test_the_tune_command_keeps_what_it_cannot_read_and_what_others_add(
        clocked: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """``--out`` naming another device's table is refused before measuring (it was replaced by the new rows); rows
    another process adds to the table during a run stay (it wrote what it read at the start); ``--out=~/...`` is the
    home directory's file; an empty ``--shapes`` or ``--moe`` is an error, not the default shapes."""
    import json
    import os

    from fp8select import cli
    from fp8select.measure import tune as tune_module
    from fp8select.measured.table import add_rows, new_table

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "resolve", lambda **kw: clocked)
    real = tune_module.tune
    device = clocked.capabilities.device_name

    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        other = {**new_table(device), "groups": [{"backend": "large", "versions": {"torch": "2.13.0+cpu"},
                                                   "shapes": {"999,384": {"1": {"us": 9.0}}}}]}
        add_rows(out, device, other)  # a server's load-time measurement, meanwhile
        return real(*args, **kwargs, device="cpu")

    monkeypatch.setattr(tune_module, "tune", on_cpu)
    foreign = tmp_path / "h100.json"
    foreign.write_text(json.dumps({**new_table("NVIDIA H100 80GB HBM3"), "note": "keep me"}))
    with pytest.warns(Warning, match="another device"):
        assert cli.main(["tune", "--shapes", "256,384", "--m", "1", "--out", str(foreign)]) == 2
    assert json.loads(foreign.read_text())["note"] == "keep me"
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "t.json"
    assert cli.main(["tune", "--shapes", "256,384", "--m", "1", "--out=~/t.json"]) == 0
    assert {s for g in json.loads(out.read_text())["groups"] for s in g["shapes"]} == {"256,384", "999,384"}
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~_umask()
    for flag in ("--shapes", "--moe"):
        assert cli.main(["tune", flag, "", "--out", str(out)]) == 2


def test_the_tune_command_refuses_backends_it_cannot_measure(
        clocked: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``--backends`` names a backend of the chain (any spelling) or is an error before measuring: a typo measured
    nothing and exited 0."""
    import json

    from fp8select import cli
    from fp8select.measure import tune as tune_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "resolve", lambda **kw: clocked)
    real = tune_module.tune
    monkeypatch.setattr(tune_module, "tune", lambda *a, **kw: real(*a, **kw, device="cpu"))
    out = tmp_path / "t.json"
    for bad in ("cublas", "reference", "small,typo"):
        assert cli.main(["tune", "--shapes", "256,384", "--m", "1", "--backends", bad, "--out", str(out)]) == 2
        assert "--backends:" in capsys.readouterr().err and not out.exists()
    assert cli.main(["tune", "--moe", "deepseek-v3-e8", "--backends", "deep_gemm/masked", "--out", str(out)]) == 2
    assert "deepgemm/masked: not among what tune measures here" in capsys.readouterr().err
    assert cli.main(["tune", "--shapes", "256,384", "--m", "1", "--backends", " SMALL ", "--out", str(out)]) == 0
    assert [g["backend"] for g in json.loads(out.read_text())["groups"]] == ["small"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_load_time_tuning_measures_only_where_the_choice_is_open(clocked: Any, tmp_path: Any) -> None:
    from fp8select.measure import loadtime
    from fp8select.measured.table import load_table, table_path

    # Measured at another shape: small is 3x faster up to M=8, large 1.67x faster above; between
    # M=8 and M=16 the estimates of a new shape are close (a real choice), elsewhere far apart.
    known, _ = tune(clocked, [(N, K)], ms=tuple(2**i for i in range(14)), device="cpu")
    for group in known["groups"]:
        if group["backend"] == "small":
            group["shapes"][f"{N},{K}"]["16"]["us"] = 3.2
    sel = resolve(CPU, plugins=[Plugin()], tuning={**known, "device_name": "cpu-test"})
    todo = loadtime.points_to_measure(sel.chain, CPU, sel.measurements, 512, 768)
    assert todo == [(16, ["small", "large"])]
    assert loadtime.points_to_measure(sel.chain, CPU, sel.measurements, N, K) == []  # measured: nothing to do
    cache = CPU.with_overrides({"env.FP8SELECT_CACHE_DIR": str(tmp_path)})
    sel = resolve(cache, plugins=[Plugin()], tuning={**known, "device_name": "cpu-test"})
    table = loadtime.measure_shape(sel, 512, 768, device="cpu")
    assert table is not None
    assert {g["backend"]: sorted(g["shapes"]["512,768"]) for g in table["groups"]} == {"small": ["16"], "large": ["16"]}
    saved = load_table(table_path(sel.capabilities.env["FP8SELECT_CACHE_DIR"], "cpu-test"), "cpu-test")
    assert saved is not None and any("512,768" in g["shapes"] for g in saved["groups"])
    # the selection keeps what it measured: the layer's plan is measured there, once per shape
    meas = sel._measure_at_load(512, 768, torch.device("cpu"))
    assert meas is not None and meas.estimate("small", 512, 768, 16).source == "measured"  # type: ignore[union-attr]
    assert list(sel._memo.measured) == [(512, 768)]
    assert sel._measure_at_load(N, K, torch.device("cpu")) is sel.measurements  # measured: nothing to do
    assert sel._memo.measured[(N, K)] == {}  # and remembered, not derived again for the next layer


def test_a_load_time_measurement_that_fails_leaves_the_plan_to_the_tables(clocked: Any, tmp_path: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default, so never the reason a model fails to load: an error while measuring (out of memory while
    the engine loads its weights) is logged, nothing is saved, and the layer is planned as without it."""
    from structlog.testing import capture_logs

    from fp8select.measure import loadtime
    from fp8select.measure import tune as tune_module

    known, _ = tune(clocked, [(N, K)], ms=(16,), device="cpu")
    cache = CPU.with_overrides({"env.FP8SELECT_CACHE_DIR": str(tmp_path)})
    sel = resolve(cache, plugins=[Plugin()], tuning={**known, "device_name": "cpu-test"})

    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(tune_module, "tune", out_of_memory)
    with capture_logs() as logs:
        assert loadtime.measure_shape(sel, 512, 768, device="cpu") is None
        assert sel._measure_at_load(512, 768, torch.device("cpu")) is sel.measurements
    failed = [e for e in logs if e["event"] == "fp8select.load_time_tuning_failed"]
    assert len(failed) == 2 and "OutOfMemoryError" in failed[0]["error"] and failed[0]["n"] == 512
    assert not list(tmp_path.iterdir())  # nothing saved


def test_the_vendors_are_loaded_before_the_load_time_budget_starts(clocked: Any, tmp_path: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A vendor's once-per-process import is not paid out of the first shape's budget: the backends to be timed
    have their packages imported before ``tune`` (and its clock) starts."""
    import sys

    from fp8select.measure import loadtime
    from fp8select.measure import tune as tune_module

    known, _ = tune(clocked, [(N, K)], ms=tuple(2**i for i in range(14)), device="cpu")
    for group in known["groups"]:
        if group["backend"] == "small":
            group["shapes"][f"{N},{K}"]["16"]["us"] = 3.2
    monkeypatch.setattr(Clocked, "packages", ("colorsys",), raising=False)  # a module nothing imported yet
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    seen: list[bool] = []
    real = tune_module.tune
    monkeypatch.setattr(tune_module, "tune", lambda *a, **k: seen.append("colorsys" in sys.modules) or real(*a, **k))
    sel = resolve(CPU.with_overrides({"env.FP8SELECT_CACHE_DIR": str(tmp_path)}), plugins=[Plugin()],
                  tuning={**known, "device_name": "cpu-test"})
    assert loadtime.measure_shape(sel, 512, 768, device="cpu") is not None and seen == [True]


def test_jit_processes_compile_the_vendors_points_before_the_budget_starts(clocked: Any, tmp_path: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``FP8SELECT_JIT_PROCESSES=N``: at a shape's first measurement the JIT backends' kernels at every open point are
    compiled in worker processes first (a cold JIT cache would spend the budget compiling), split over the N
    processes; Triton's are not (its search picks the configurations then), nor anyone's without the variable. A
    later start, which measures what the first one's budget left, finds those compiled and starts no worker."""
    from fp8select.jit_processes import JitJob
    from fp8select.measure import loadtime
    from fp8select.measure import tune as tune_module

    known, _ = tune(clocked, [(N, K)], ms=tuple(2**i for i in range(14)), device="cpu")
    for group in known["groups"]:
        if group["backend"] == "small":  # open contests at M 16-64 of a new shape
            for bucket, us in (("16", 3.1), ("32", 3.2), ("64", 3.3)):
                group["shapes"][f"{N},{K}"][bucket]["us"] = us
    monkeypatch.setattr(Small, "jit", True, raising=False)
    events: list[Any] = []
    monkeypatch.setattr(loadtime, "compile_in_processes",
                        lambda jobs, processes, timeout_s: events.append((sorted(jobs, key=lambda j: j.ms), processes))
                        or [{"seconds": 1.0}, {"seconds": 1.0, "error": "exit 1: no GPU"}][:len(jobs)])
    real = tune_module.tune  # a budget that ends after the first bucket
    monkeypatch.setattr(tune_module, "tune", lambda sel, shapes, ms, **k: events.append("tune") or real(sel, shapes, list(ms)[:1], **k))
    split = [JitJob("small", 512, 768, (16,), "bfloat16", "cpu"), JitJob("small", 512, 768, (32, 64), "bfloat16", "cpu")]
    for start, (processes, jobs) in enumerate(((None, None), ("x", None), ("2", split))):
        events.clear()
        env = {"env.FP8SELECT_CACHE_DIR": str(tmp_path / str(start))}  # a fresh cache each time: all open again
        cache = CPU.with_overrides(env if processes is None else {**env, "env.FP8SELECT_JIT_PROCESSES": processes})
        sel = resolve(cache, plugins=[Plugin()], tuning={**known, "device_name": "cpu-test"})
        found = loadtime.measure_shape(sel, 512, 768, device="cpu")
        assert found is not None
        assert events == (["tune"] if jobs is None else [(jobs, 2), "tune"])
    events.clear()  # the next start: M 32 and 64 still open, their kernels compiled by the first start's workers
    later = resolve(cache, plugins=[Plugin()], tuning=merge_tables({**known, "device_name": "cpu-test"}, found))
    assert loadtime.measure_shape(later, 512, 768, device="cpu") is not None and events == ["tune"]


def test_later_starts_measure_what_an_earlier_budget_left(clocked: Any, tmp_path: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget that ends after one bucket (a cold JIT cache spends most of a first start's on compiling) leaves
    the shape's other open contests to the next starts, one each here, closest first, until none is left; the
    plan then runs each of those buckets as measured."""
    from fp8select.measure import loadtime
    from fp8select.measure import tune as tune_module

    known, _ = tune(clocked, [(N, K)], ms=tuple(2**i for i in range(14)), device="cpu")
    for group in known["groups"]:
        if group["backend"] == "small":  # within 1.25x of large's 3.0 at M 16-64: choices to make at a new shape
            for bucket, us in (("16", 3.1), ("32", 3.2), ("64", 3.3)):
                group["shapes"][f"{N},{K}"][bucket]["us"] = us
    real = tune_module.tune
    monkeypatch.setattr(tune_module, "tune", lambda sel, shapes, ms, **kw: real(sel, shapes, list(ms)[:1], **kw))
    cache = CPU.with_overrides({"env.FP8SELECT_CACHE_DIR": str(tmp_path)})
    table: dict[str, Any] = {**known, "device_name": "cpu-test"}
    measured = []
    for _ in range(5):  # each start reads what the ones before it measured
        sel = resolve(cache, plugins=[Plugin()], tuning=table)
        found = loadtime.measure_shape(sel, 512, 768, device="cpu")
        if found is None:
            break
        measured.append(sorted({bucket for g in found["groups"] for bucket in g["shapes"]["512,768"]}))
        table = merge_tables(table, {**found, "device_name": "cpu-test"})
    assert measured == [["16"], ["32"], ["64"]]
    layer = resolve(cache, plugins=[Plugin()], tuning=table).prepare((torch.randn(512, 768) * 50).to(torch.float8_e4m3fn),
                                                                      torch.rand(4, 6) + 0.5)
    assert [r.why for r in layer.main_plan.routes if r.bucket in (16, 32, 64)] == ["measured"] * 3


def test_nothing_is_measured_while_a_graph_is_captured_or_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer prepared at its first call (``Selection.linear``) may be prepared inside an engine's CUDA-graph
    capture or a ``torch.compile`` trace: there its shape is not measured."""
    from fp8select import selection

    assert selection._can_measure_now()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not selection._can_measure_now()
    monkeypatch.undo()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not selection._can_measure_now()


def test_load_time_tuning_spreads_contests_equally_close_over_m() -> None:
    """On a device no table covers every estimate is missing: the ends first, then the middles, so that the
    buckets a budget leaves lie between measured ones (which the model interpolates), never above them."""
    from fp8select.measure import loadtime

    order = [bucket for bucket, _ in loadtime.by_closeness({m: {"a": None, "b": None} for m in reversed(M_BUCKETS)})]
    assert order == [1, 8192, 64, 8, 512, 2, 16, 128, 2048, 4, 32, 256, 1024, 4096]
    for level in range(4):  # each level of middles halves the widest span left between measured buckets
        measured = sorted(M_BUCKETS.index(b) for b in order[:2**level + 1])
        widest = max(b - a for a, b in itertools.pairwise(measured))
        assert widest == -(-(len(M_BUCKETS) - 1) // 2**level), (level, measured)
    # closer contests still come first, wherever they lie
    assert [b for b, _ in loadtime.by_closeness({4: {"a": None, "b": None}, 4096: {"a": None, "b": None},
                                                  2: {"a": SimpleNamespace(us=1.0), "b": SimpleNamespace(us=1.1)}})] == [
        4, 4096, 2]


def test_load_time_tuning_times_the_closest_contests_first_and_a_bucket_once() -> None:
    """A budget that ends early has settled the buckets where the estimates are nearest (a missing estimate
    counts as a tie); a bucket with a measured row of the shape (a table's, or an earlier start's partial
    measurement) is planned from it, not measured again; the next start measures the open ones left."""
    from fp8select.measure import loadtime
    from fp8select.measured.model import Measurements

    def est(us: float) -> Any:
        return SimpleNamespace(us=us)

    contests = {1: {"a": est(10.0), "b": est(12.0)}, 2: {"a": est(10.0), "b": est(20.0)},
                64: {"a": est(10.0), "b": est(10.2), "c": est(11.0)}, 128: {"a": est(10.0), "b": None},
                256: {"a": est(10.0)}}
    assert loadtime.by_closeness(contests) == [(128, ["a", "b"]), (64, ["a", "b", "c"]), (1, ["a", "b"])]
    assert loadtime.by_closeness({1: {"a": est(10.0), "b": est(10.0 * loadtime.CLOSE)}}) == [(1, ["a", "b"])]
    table = {**new_table("cpu-test"), "groups": [{"backend": "small", "versions": {}, "shapes": {
        "512,768": {"16": {"us": 5.0}}, f"{N},{K}": {"16": {"us": 5.0}, "32": {"us": 6.0}}}}]}
    partly = Measurements("cpu-test", [table], {"small": {}})
    assert partly.buckets_held(512, 768) == {16} and partly.buckets_held(N, K) == {16, 32}
    assert partly.buckets_held(768, 512) == frozenset()
    sel = resolve(CPU, plugins=[Plugin()], tuning={**table, "device_name": "cpu-test"})
    for (n, k), held in (((512, 768), {16}), ((N, K), {16, 32}), ((768, 512), set())):
        todo = [bucket for bucket, _ in loadtime.points_to_measure(sel.chain, CPU, partly, n, k)]
        assert sorted(todo) == [b for b in M_BUCKETS if b not in held], (n, k)  # "large" has no rows: all open


def test_load_time_tuning_is_on_by_default_where_its_rows_can_be_kept(tmp_path: Any) -> None:
    """Unset, a CUDA device measures at load time when its cache directory can be written (once per machine);
    ``load`` forces it, any other value turns it off, and without the device's own tables it is off."""
    import os

    from fp8select.measured.sources import wants_load_time_tuning

    cuda = CPU.with_overrides({"device_kind": "cuda", "env.FP8SELECT_CACHE_DIR": str(tmp_path / "new" / "cache")})
    assert wants_load_time_tuning(cuda)  # a folder still to be created, in one that can be written
    assert not wants_load_time_tuning(cuda, by_default=False)
    assert not wants_load_time_tuning(CPU.with_overrides({"env.FP8SELECT_CACHE_DIR": str(tmp_path)}))  # not CUDA
    for value, wanted in ((" Load ", True), ("off", False), ("0", False)):
        assert wants_load_time_tuning(cuda.with_overrides({"env.FP8SELECT_TUNE": value}), by_default=False) is wanted
    (tmp_path / "file").write_text("")
    assert not wants_load_time_tuning(cuda.with_overrides({"env.FP8SELECT_CACHE_DIR": str(tmp_path / "file" / "x")}))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        if not os.access(locked, os.W_OK):  # (root may write anywhere)
            assert not wants_load_time_tuning(cuda.with_overrides({"env.FP8SELECT_CACHE_DIR": str(locked / "cache")}))
            assert wants_load_time_tuning(cuda.with_overrides({"env.FP8SELECT_CACHE_DIR": str(locked / "cache"),
                                                               "env.FP8SELECT_TUNE": "load"}))
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("runs", [False, True])
def test_the_triton_search_tries_the_wgmma_path_only_where_it_runs(monkeypatch: pytest.MonkeyPatch, runs: bool) -> None:
    """Where the wgmma path would fall back to the gemm path's kernel, tuning does not time it again."""
    pytest.importorskip("triton")
    from fp8select.kernels import triton_device
    from fp8select.measure.tune import _search_triton

    monkeypatch.setattr(triton_device, "wgmma_runs", lambda device: runs)
    timed: list[Any] = []
    best = _search_triton(None, lambda cfg: timed.append(cfg) or 10.0 - len(timed), 7168, 16384, 4096, sms=132,
                          max_configs=6, deadline=float("inf"), rows=[], seeds=None, device=torch.device("cpu"))
    paths = {cfg.path for cfg in timed}
    assert len(timed) == 6 and best == timed[-1]
    assert ("wgmma" in paths) == runs and "gemm" in paths


def test_the_triton_search_starts_from_the_nearest_shapes_configuration_fitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape no table holds: the first configuration timed is the nearest measured shape's, with its split-K
    fitted to this weight's column tiles, as the plan would run it."""
    pytest.importorskip("triton")
    from fp8select.backends.triton import TritonBackend
    from fp8select.kernels import triton_device
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.measure.tune import _search_triton
    from fp8select.measured.model import Measurements

    monkeypatch.setattr(triton_device, "wgmma_runs", lambda device: False)
    measured = TritonConfig.from_dict({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 4,
                                       "num_warps": 2, "num_stages": 3, "path": "gemm"})
    table = new_table("cpu")
    table["groups"].append({"backend": "triton", "versions": {"torch": "2.13.0+cpu"},
                            "shapes": {"7168,16384": {"8": {"us": 38.0, "config": measured.to_dict()}}}})
    seeds = Measurements("cpu", [table], {"triton": {"torch": "2.13.0+cpu"}})
    timed: list[Any] = []
    _search_triton(TritonBackend(), lambda cfg: timed.append(cfg) or 10.0, 4096, 14336, 8, sms=132, max_configs=1,
                   deadline=float("inf"), rows=[], seeds=seeds, device=torch.device("cpu"))
    assert timed == [TritonConfig.from_dict({**measured.to_dict(), "SPLIT_K": 7})]  # 112 column tiles x 4, 64 x 7


def test_the_triton_search_picks_among_its_fastest_configurations_timed_again_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The search times one configuration after another; its three fastest are timed again interleaved, and the
    fastest there is the pick (a finalist that fails there is passed over); the finalists' times are a row."""
    pytest.importorskip("triton")
    from fp8select.kernels import triton_device
    from fp8select.measure.tune import FINALISTS, _search_triton

    monkeypatch.setattr(triton_device, "wgmma_runs", lambda device: False)
    timed: list[Any] = []
    again: list[list[Any]] = []

    def together(configs: Any, errors: dict[str, str]) -> list[float | None]:
        again.append(list(configs))
        errors["0"] = "RuntimeError: capture"
        return [None, 7.0, 6.0][:len(configs)]  # the fastest alone fails; the third is the fastest together

    rows: list[dict[str, Any]] = []
    best = _search_triton(None, lambda cfg: timed.append(cfg) or 10.0 - len(timed), 7168, 16384, 4096, sms=132,
                          max_configs=6, deadline=float("inf"), rows=rows, seeds=None, device=torch.device("cpu"),
                          together=together)
    assert again == [timed[::-1][:FINALISTS]] and best == timed[-3]
    assert [f["us"] for f in rows[-1]["finalists"]] == [None, 7.0, 6.0]
    assert [f.get("error") for f in rows[-1]["finalists"]] == ["RuntimeError: capture", None, None]
    lone = _search_triton(None, lambda cfg: 5.0, 7168, 16384, 4096, sms=132, max_configs=1, deadline=float("inf"),
                          rows=[], seeds=None, device=torch.device("cpu"), together=together)
    assert lone is not None and len(again) == 1  # one configuration: nothing to time again
