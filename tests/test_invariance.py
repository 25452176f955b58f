"""Batch-invariant plans: the records (fp8select.measured.invariance), the plan they allow, the flag's
path from the environment and ``resolve()`` to every layer, and the reference's rows bitwise equal
whatever the batch (the Triton kernels under the interpreter: test_invariance_triton.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from batch_rows import assert_rows_batch_invariant
from fp64_reference import random_problem
from matrix import MATRIX
from test_plan import CPU, K, N, _problem, fake, measurements
from test_plan import estimator as plan_estimator

from fp8select import BatchInvariantError, Capabilities, InvalidInputError, resolve
from fp8select.backends.reference import ReferenceBackend
from fp8select.buckets import M_BUCKET_MAX, M_BUCKETS
from fp8select.cli import main
from fp8select.measured.invariance import (
    ENV_BATCH_INVARIANT,
    POSITIONS,
    Invariance,
    Record,
    batch_invariant_from_env,
    find_records,
    merge_records,
    validate_records,
)
from fp8select.measured.table import SHIPPED_DIR, backend_versions
from fp8select.plan import INVARIANT, build_plan

H200 = MATRIX["h200-deepgemm"][0]
MS = (1, 2, 3, 7, 16, 17, 64, 300)
VERSIONS = {"torch": "2.13.0+cpu"}  # what backend_versions gives the fakes on CPU


def record(backend: str, *, versions: dict[str, str] | None = None, m: tuple[int, int] = (1, M_BUCKET_MAX),
           positions: tuple[str, ...] = POSITIONS, invariant: bool = True, schedule: Any = ((1, None),),
           shapes: tuple[tuple[int, int], ...] = ((N, K),), differs: tuple[dict[str, Any], ...] = ()) -> Record:
    return Record(backend, dict(versions or VERSIONS), tuple(schedule), shapes, m, positions, invariant, differs)


def index(*records: Record, backends: Any = (), caps: Capabilities = CPU) -> Invariance:
    data = merge_records(None, records, "cpu")
    assert validate_records(data) is None
    return Invariance(caps, backends, [("test", data)])


def plain(name: str, **attrs: Any) -> Any:
    """A fake backend with no proof of its own (the reference's is not its subclasses')."""
    return fake(name, **attrs)


# -- records ---------------------------------------------------------------------------------------


def test_the_shipped_h200_records_are_valid_and_qualify_every_backend_measured() -> None:
    """benchmarks/invariance.py's records on the H200: every accepted dense backend (Triton at three
    configurations) and every MoE route invariant at M 1-8192 in every position (DeepGEMM's masked layout
    at M 1-2048, its gate's range), so each qualifies at its versions."""
    data = json.loads((SHIPPED_DIR / "invariance-nvidia-h200.json").read_text(encoding="utf-8"))
    assert validate_records(data) is None
    records = [Record.from_dict(r) for r in data["records"]]
    dense = [r for r in records if r.layout is None]
    moe = [r for r in records if r.layout is not None]
    assert {r.backend for r in dense} == {"deepgemm", "flashinfer", "cutlass", "cuda-scaled-mm", "triton", "reference"}
    assert sum(r.backend == "triton" for r in dense) == 3
    for r in dense:
        assert (r.m, r.positions, r.invariant) == ((1, 8192), ("first", "middle", "last"), True), r.backend
        assert r.shortfall() is None and (7168, 2048) in r.shapes
    assert {(r.backend, r.layout) for r in moe} == {("deepgemm", "contiguous"), ("deepgemm", "masked"),
                                                     ("triton", "sorted"), ("cutlass", "offsets")}
    for r in moe:
        assert r.invariant and r.positions == ("first", "middle", "last"), (r.backend, r.layout)
        assert r.m == ((1, 2048) if r.layout == "masked" else (1, 8192)), (r.backend, r.layout)
    assert next(r for r in records if r.backend == "deepgemm").versions["deep_gemm"] == "2.6.1"


def test_a_full_record_qualifies_and_others_say_why_not() -> None:
    a = plain("a")
    assert record("a").shortfall() is None
    assert "only at M 2-8192" in str(record("a", m=(2, M_BUCKET_MAX)).shortfall())
    assert "only at M 1-2048" in str(record("a", m=(1, 2048)).shortfall())
    assert "positions first" in str(record("a", positions=("first",)).shortfall())
    bad = record("a", invariant=False, differs=({"shape": "256,384", "m": 7, "position": "last", "max_rel": 2.2e-3},))
    assert "not batch-invariant: differs at 256x384 M 7 (last, max relative 2.2e-03)" in str(bad.shortfall())
    options, why = index(bad, backends=[a]).options(a)
    assert options == () and "differs at 256x384 M 7" in why
    failed = record("a", invariant=False, differs=({"shape": "256,384", "m": 0, "position": "error", "max_rel": None},))
    assert "differs at 256x384 M 0 (error)" in str(failed.shortfall())  # a call that raised: no number to give


def test_only_the_installed_versions_count() -> None:
    a = plain("a")
    options, why = index(record("a", versions={"torch": "2.12.0"}), backends=[a]).options(a)
    assert options == ()
    assert why == "no batch-invariance record on cpu at torch 2.13.0+cpu (recorded at other versions: torch 2.12.0)"
    options, _ = index(record("a"), backends=[a]).options(a)
    assert [o.backend for o in options] == ["a"]


def test_a_later_file_replaces_a_record_of_the_same_backend_versions_and_schedule() -> None:
    a = plain("a")
    first = merge_records(None, [record("a", invariant=False)], "cpu")
    second = merge_records(None, [record("a")], "cpu")
    assert Invariance(CPU, [a], [("1", first), ("2", second)]).options(a)[0]
    assert not Invariance(CPU, [a], [("2", second), ("1", first)]).options(a)[0]
    assert len(merge_records(first, [record("a")], "cpu")["records"]) == 1


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda d: d.update(schema=2), "schema: expected 1"),
    (lambda d: d["records"][0].update(m=[0, 5]), "m: expected [lo, hi]"),
    (lambda d: d["records"][0].update(positions=["front"]), "positions: expected"),
    (lambda d: d["records"][0].update(schedule=[{"from_m": 2, "config": None}]), "from_m increasing from 1"),
    (lambda d: d["records"][0].update(schedule=[{"from_m": 1, "config": {"BLOCK_M": 16}}]), "configuration"),
    (lambda d: d["records"][0].update(shapes=["7168x2048"]), "shapes: expected"),
    (lambda d: d["records"][0].pop("invariant"), "expected an object with keys"),
    (lambda d: d["records"][0].update(differs=[{"max_rel": "big"}]), "differs: expected"),
    (lambda d: d["records"][0].update(differs=[{"shape": 7168}]), "differs: expected"),
    (lambda d: d["records"][0].update(differs=[{"m": "7"}]), "differs: expected"),
])
def test_malformed_records_are_named(change: Any, fragment: str) -> None:
    data = merge_records(None, [record("triton")], "cpu")
    change(data)
    assert fragment in str(validate_records(data))


def test_records_are_found_for_the_device_in_the_cache_directory_too(tmp_path: Path) -> None:
    caps = Capabilities.from_dict({**H200.to_dict(), "env": {"FP8SELECT_CACHE_DIR": str(tmp_path)}})
    assert [source for source, _ in find_records(caps)] == ["fp8select/data/invariance-nvidia-h200.json"]
    (tmp_path / "invariance-nvidia-h200.json").write_text(json.dumps(merge_records(None, [record("a")], "NVIDIA H200")))
    assert [source for source, _ in find_records(caps)][1] == str(tmp_path / "invariance-nvidia-h200.json")
    (tmp_path / "invariance-nvidia-h200.json").write_text("{")
    with pytest.warns(UserWarning, match="invariance records"):
        assert len(find_records(caps)) == 1


def test_a_proof_is_its_own_class_and_serves_an_accelerator_only_when_explicit() -> None:
    ref = ReferenceBackend()
    assert index(backends=[ref]).options(ref)[0][0].why.startswith("invariant by construction")
    assert plain("a").invariant is not None  # inherited from the reference, whose run it overrides ...
    assert index().options(plain("a"))[0] == ()  # ... so it proves nothing
    gpu = index(backends=[ref], caps=H200)
    assert gpu.options(ref)[0] == () and "chosen only explicitly" in gpu.options(ref)[1]
    assert gpu.options(ref, explicit=True)[0]


# -- the flag --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "flag"), [("1", True), (" On ", True), ("yes", True), ("0", False), ("", False),
                                             ("off", False)])
def test_the_environment_variable(value: str, flag: bool) -> None:
    assert batch_invariant_from_env({ENV_BATCH_INVARIANT: value}) is flag
    caps = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",), env={ENV_BATCH_INVARIANT: value})
    selection = resolve(caps, plugins=False)
    assert selection.batch_invariant is flag
    assert resolve(caps, plugins=False, batch_invariant=not flag).batch_invariant is not flag  # the argument wins
    assert (selection.plan_for(N, K).invariant is not None) is flag


def test_an_unreadable_flag_is_an_error() -> None:
    with pytest.raises(InvalidInputError, match=r"FP8SELECT_BATCH_INVARIANT: expected 1 or 0 .* found 'maybe'"):
        batch_invariant_from_env({ENV_BATCH_INVARIANT: "maybe"})


def test_resolve_refuses_when_no_backend_of_the_chain_qualifies() -> None:
    """The H200 with the shipped seed only: every chain backend named once, with its reason."""
    with pytest.raises(BatchInvariantError) as err:
        resolve(H200, plugins=False, verify=False, batch_invariant=True)
    names = [c.name for c in err.value.candidates]
    assert names == [b.name for b in resolve(H200, plugins=False, verify=False).chain]
    reasons = {c.name: c.reason for c in err.value.candidates}
    assert "need M 1-8192" in reasons["deepgemm"] or "no batch-invariance record" in reasons["deepgemm"]
    assert "chosen only explicitly" in reasons["reference"]
    assert "benchmarks.invariance" in str(err.value)


# -- the plan --------------------------------------------------------------------------------------


def _plan(chain: list[Any], records: tuple[Record, ...], rows: dict[str, Any] | None = None, **kw: Any) -> Any:
    meas = measurements(rows) if rows else None
    return build_plan(_problem(), chain, CPU, plan_estimator(meas), invariance=index(*records, backends=chain), **kw)


def test_one_recorded_backend_for_every_m_even_where_another_is_faster() -> None:
    a, b = plain("a"), plain("b")
    rows = {"a": {(N, K): {m: 10.0 for m in M_BUCKETS}}, "b": {(N, K): {m: 5.0 for m in M_BUCKETS}}}
    normal = build_plan(_problem(), [a, b], CPU, plan_estimator(measurements(rows)))
    assert normal.backends == ("b",)
    plan = _plan([a, b], (record("a"),), rows)
    assert plan.backends == ("a",) and {r.why for r in plan.routes} == {INVARIANT}
    assert plan.invariant is not None and "a measured batch-invariant at M 1-8192" in plan.invariant
    assert "b: no batch-invariance record" in "\n".join(plan.notes)
    assert plan.summary() == "any M: a (batch-invariant)"
    assert "batch-invariant: a row's output depends only on that row" in plan.describe()
    assert plan.to_dict()["batch_invariant"] == plan.invariant


def test_the_cheapest_option_wins_by_the_sum_of_log_times() -> None:
    a, b = plain("a"), plain("b")
    # a is faster at small M, b at large M; b wins on the sum of logs over the 14 buckets
    rows = {"a": {(N, K): {m: (5.0 if m <= 4 else 20.0) for m in M_BUCKETS}},
            "b": {(N, K): {m: (10.0 if m <= 4 else 11.0) for m in M_BUCKETS}}}
    assert _plan([a, b], (record("a"), record("b")), rows).backends == ("b",)
    rows["a"] = {(N, K): {m: 5.0 for m in M_BUCKETS}}
    assert _plan([a, b], (record("a"), record("b")), rows).backends == ("a",)
    assert _plan([a, b], (record("a"), record("b"))).backends == ("a",)  # untimed: the priority order


def test_a_backend_whose_gate_rejects_some_m_cannot_serve_alone() -> None:
    """FlashInfer's sm90 route is gated to M <= 31: a record cannot make it the whole plan."""
    short, b = plain("short", max_m=31), plain("b")
    plan = _plan([short, b], (record("short"), record("b")))
    assert plan.backends == ("b",)
    assert "short: rejects M 17-32 (requires M <= 31, found M=32)" in "\n".join(plan.notes)
    with pytest.raises(BatchInvariantError, match="short: rejected: rejects M 17-32"):
        _plan([short], (record("short"),))


def test_an_explicit_choice_is_the_only_option() -> None:
    a, b = plain("a"), plain("b")
    assert _plan([b, a], (record("a"), record("b")), explicit="b").backends == ("b",)
    with pytest.raises(BatchInvariantError) as err:
        _plan([b, a], (record("a"),), explicit="b")
    assert [(c.name, c.reason) for c in err.value.candidates][1] == ("a", "not the explicit choice (b)")


def test_a_weight_copy_needs_room_in_the_budget() -> None:
    copy = plain("copy", layout_name="requantized")
    assert _plan([copy], (record("copy"),)).weight_copies == 1
    with pytest.raises(BatchInvariantError, match=r"needs a weight copy .*max_weight_copies=0"):
        _plan([copy], (record("copy"),), max_weight_copies=0)


def test_a_configuration_schedule_runs_as_recorded_and_is_timed_only_where_measured() -> None:
    one = {"BLOCK_M": 16}
    two = {"BLOCK_M": 64}
    a = plain("a")
    rows = {"a": {(N, K): {m: 10.0 for m in M_BUCKETS}}}
    table = measurements(rows)
    plan = build_plan(_problem(), [a], CPU, lambda backend, bucket: table.estimate("a", N, K, bucket),
                      invariance=Invariance(CPU, [a], [("t", {"records": [
                          {**record("a").to_dict(), "schedule": [{"from_m": 1, "config": one},
                                                                 {"from_m": 64, "config": two}]}]})]))
    assert [r.config for r in plan.routes] == [one if b < 64 else two for b in M_BUCKETS]
    assert all(r.us is None and "no time measured" in r.detail for r in plan.routes)  # the table's rows have no config


def test_an_unmeasured_shape_is_planned_from_the_record_and_says_so() -> None:
    a = plain("a")
    plan = build_plan(_problem(512, 1024), [a], CPU, plan_estimator(None), invariance=index(record("a"), backends=[a]))
    assert plan.invariant is not None and plan.invariant.endswith("not measured at 512x1024")


# -- the reference's rows, end to end --------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_reference_rows_are_bitwise_the_same_for_any_batch(out_dtype: torch.dtype) -> None:
    w, s = random_problem(N, K, seed=3)[:2]
    layer = resolve(CPU, plugins=False, batch_invariant=True).prepare(w, s, out_dtype=out_dtype)
    assert layer.main_plan.invariant is not None and "batch-invariant" in repr(layer)
    assert_rows_batch_invariant(layer, K, MS, seed=4)


def test_explain_says_what_backs_the_plans(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fp8select.cli.detect_capabilities", lambda: CPU)
    assert main(["explain", "--no-plugins", "--batch-invariant", "--layer", "256,384"]) == 0
    out = capsys.readouterr().out
    assert "plans: per layer one backend and configuration for every M (batch-invariant)" in out
    assert "  reference: invariant by construction" in out
    assert "any M          reference       invariant" in out
    assert main(["explain", "--no-plugins", "--batch-invariant", "--json", "--layer", "256,384"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["batch_invariant"] is True and data["plans"][0]["batch_invariant"].startswith("invariant by construction")


def test_versions_are_the_tuning_tables_keys() -> None:
    deepgemm = resolve(H200, plugins=False, verify=False).chain[0]
    assert backend_versions(H200, deepgemm.packages) == Invariance(H200, [deepgemm], []).installed["deepgemm"]


# -- the GPU tool's pieces that run anywhere -------------------------------------------------------


def test_the_row_check_finds_a_batch_dependent_row_and_passes_the_reference() -> None:
    from benchmarks.invariance import check_rows

    w, s = random_problem(N, K, seed=7)[:2]
    layer = resolve(CPU, plugins=False, batch_invariant=True).prepare(w, s)
    assert check_rows(layer, K, (1, 2, 17), "cpu") == []
    centred = check_rows(lambda x: x - x.float().mean(0).to(x.dtype), K, (1, 2, 17), "cpu")
    assert [(d["m"], d["position"]) for d in centred] == [(2, "first"), (2, "middle"), (2, "last"), (17, "first"),
                                                          (17, "middle"), (17, "last")]
    assert all(d["max_rel"] > 0 for d in centred)


def test_the_tool_merges_its_records_into_a_records_file(tmp_path: Path) -> None:
    from benchmarks.invariance import write_record

    path = tmp_path / "invariance-cpu.json"
    write_record(path, "cpu", [record("a", invariant=False)], [(N, K)], MS)
    write_record(path, "cpu", [record("a"), record("b")], [(N, K)], MS)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert validate_records(data) is None and "benchmarks/invariance.py" in data["note"]
    assert [(r["backend"], r["invariant"]) for r in data["records"]] == [("a", True), ("b", True)]
    with pytest.raises(SystemExit, match="not a records file of NVIDIA H200"):
        write_record(path, "NVIDIA H200", [record("a")], [(N, K)], MS)


# -- MoE records ---------------------------------------------------------------------------------

def test_a_moe_record_names_its_layout_and_is_kept_apart_from_the_dense_backends() -> None:
    """A record of the experts op: layout, ``E,H,I,k`` shapes, a MoE configuration; only a MoE
    backend asking for that layout finds it, and a dense backend of the same name never does."""
    moe_config = {"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4, "QUANT_IN_KERNEL": 0}
    moe = Record("triton", dict(VERSIONS), ((1, moe_config),), ((32, 7168, 2048, 8),), (1, M_BUCKET_MAX), POSITIONS,
                 True, (), "", "sorted")
    assert Record.from_dict(moe.to_dict()) == moe and moe.name == "triton/sorted"
    dense = record("triton")
    idx = index(moe, dense, backends=[plain("triton")])
    assert len(idx.records) == 2  # kept apart: different keys
    options, _ = idx.options(plain("triton"), layout="sorted")
    assert [o.backend for o in options] == ["triton/sorted"] and options[0].config_at(64) == moe_config
    assert options[0].backs(32, 7168, 2048, 8) == options[0].why
    assert "not measured at 8x7168x2048x8" in options[0].backs(8, 7168, 2048, 8)
    assert [o.backend for o in idx.options(plain("triton"))[0]] == ["triton"]
    none, why = idx.options(plain("triton"), layout="other")
    assert none == () and "no batch-invariance record" in why


@pytest.mark.parametrize(("change", "problem"), [
    ({"layout": ""}, "layout"),
    ({"shapes": ["7168,2048"]}, "'E,H,I,k'"),
    ({"schedule": [{"from_m": 1, "config": {"BLOCK_M": 16, "SPLIT_K": 2}}]}, "configuration"),
])
def test_a_moe_record_is_validated_as_one(change: dict[str, Any], problem: str) -> None:
    raw = {"backend": "triton", "layout": "sorted", "versions": VERSIONS, "schedule": [{"from_m": 1, "config": None}],
           "shapes": ["32,7168,2048,8"], "m": [1, M_BUCKET_MAX], "positions": list(POSITIONS), "invariant": True,
           "differs": []}
    assert validate_records({"schema": 1, "device_name": "cpu", "records": [raw]}) is None
    found = validate_records({"schema": 1, "device_name": "cpu", "records": [{**raw, **change}]})
    assert found is not None and problem in found
