"""``tune --moe`` on the CPU, with the CUDA-graph timer replaced by a fake clock: what is measured and
skipped, the ``moe`` rows of the table, and that a table's rows make a MoE layer's plan pick the winner."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import torch
from fp64_moe_reference import random_moe
from matrix import MATRIX

from fp8select import InvalidInputError, resolve
from fp8select import moe_select as moe_select_module
from fp8select.backends.moe import MoeProblem, ReferenceMoe
from fp8select.buckets import M_BUCKETS
from fp8select.kernels.moe_config import default_config
from fp8select.kernels.moe_routing import skewed_routing, uniform_routing
from fp8select.measure import timing, tune_moe
from fp8select.measure.timing import Timing
from fp8select.measured.moe import MOE_SHAPES, MoeMeasurements, parse_moe_shapes
from fp8select.measured.table import merge_tables, new_table, validate_table
from fp8select.moe_plan import MEASURED, build_moe_plan
from fp8select.verdict import Verdict

CPU = MATRIX["cpu-only"][0]
E, H, INTER, K = 4, 256, 128, 2
SHAPE = (E, H, INTER, K)
KEY = "4,256,128,2"
RAN: list[tuple[str, int]] = []
IDS: list[torch.Tensor] = []  # the ids of each launch, in order
SKEWED: list[torch.Tensor] = []  # the ids of the skewed routings drawn, where a test marks them


def _skewed(ids: torch.Tensor) -> bool:
    return any(ids is s for s in SKEWED)


class Clocked(ReferenceMoe):
    """Reference math; the launches record which route ran at which M, so the fake clock can time it."""

    requires = ()
    layouts: ClassVar[tuple[str, ...]] = ("a", "b")
    broken: ClassVar[str] = ""
    skew_broken: ClassVar[str] = ""  # wrong under skewed routing only

    def bind(self, prepared: Any, layout: str, config: Any, caps: Any) -> Any:
        inner = super().bind(prepared, layout, config, caps)

        def launch(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            RAN.append((f"{self.name}/{layout}", x.shape[0]))
            IDS.append(ids)
            y = inner(x, w, ids)
            wrong = f"{self.name}/{layout}" in (self.broken, self.skew_broken if _skewed(ids) else "")
            return y * 2 if wrong else y

        return launch


class Fast(Clocked):
    name = "fast"


class Slow(Clocked):
    name = "slow"
    layouts = ("sorted",)


TIMES = {"fast/a": lambda m: 1.0 if m <= 8 else 9.0, "fast/b": lambda m: 2.0, "slow/sorted": lambda m: 5.0}


def fake_clock(columns: Any, replays: int = 50, **kw: Any) -> dict[str, Timing]:
    out = {}
    for column, calls in columns.items():
        calls[0]()
        name, m = RAN[-1]
        t = TIMES[name](m)
        out[column] = Timing(t, t, t)
    return out


@pytest.fixture
def clocked(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(timing, "time_graphs", fake_clock)
    monkeypatch.setattr(tune_moe, "weight_copies", lambda *a: 2)
    monkeypatch.setattr(tune_moe, "random_experts", lambda e, h, i, device, gen: random_moe(e, h, i, seed=0).weights())
    Clocked.broken = ""
    return resolve(CPU, plugins=False, tuning=False)


CHAIN = (Fast(), Slow(), ReferenceMoe())


def test_tune_moe_times_every_route_but_reference_and_only_what_is_missing(clocked: Any) -> None:
    table, rows = tune_moe.tune_moe(clocked, [SHAPE], ms=(1, 8, 64), chain=CHAIN, device="cpu")
    assert validate_table(table) is None and table["groups"] == []
    got = {(g["backend"], g["layout"]): {b: r["us"] for b, r in g["shapes"][KEY].items()} for g in table["moe"]}
    assert got == {("fast", "a"): {"1": 1.0, "8": 1.0, "64": 9.0}, ("fast", "b"): {"1": 2.0, "8": 2.0, "64": 2.0},
                   ("slow", "sorted"): {"1": 5.0, "8": 5.0, "64": 5.0}}
    assert all(g["versions"] == {"torch": CPU.torch_version} for g in table["moe"])
    assert all(r["rel_err"] < tune_moe.REL_ERR_MAX for r in rows if "rel_err" in r)
    again, _ = tune_moe.tune_moe(clocked, [SHAPE], ms=(1, 8, 64), known=table, chain=CHAIN, device="cpu")
    assert "moe" not in again, "rows the known table holds are not measured again"
    forced, _ = tune_moe.tune_moe(clocked, [SHAPE], ms=(1,), known=table, force=True, chain=CHAIN, device="cpu",
                                  backends=["fast/b"])
    assert [(g["backend"], g["layout"]) for g in forced["moe"]] == [("fast", "b")]


def test_a_wrong_route_is_recorded_and_left_out(clocked: Any) -> None:
    Clocked.broken = "fast/a"
    table, rows = tune_moe.tune_moe(clocked, [SHAPE], ms=(4,), chain=CHAIN, device="cpu")
    assert {(g["backend"], g["layout"]) for g in table["moe"]} == {("fast", "b"), ("slow", "sorted")}
    assert any(r.get("route") == "fast/a" and r.get("correct") is False for r in rows)


def test_a_point_of_several_routes_is_timed_under_skew_too_and_the_plan_weighs_both(
        clocked: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a point has several routes they are timed together under skewed routing too (``skewed_us``), and
    the plan ranks them by the worse of their two standings: ``fast/a``, the fastest under uniform routing, is
    2.7x behind under skew, ``fast/b`` 2% behind under uniform routing. A route wrong under skew alone is left
    out; a point of one route is timed under uniform routing only."""
    SKEWED.clear()

    def marked(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = skewed_routing(*args)
        SKEWED.append(ids)
        return weights, ids

    under = {"fast/a": (1.0, 3.0), "fast/b": (1.02, 1.1), "slow/sorted": (5.0, 5.0)}

    def clock(columns: Any, replays: int = 50, **kw: Any) -> dict[str, Timing]:
        out = {}
        for column, calls in columns.items():
            calls[0]()
            t = under[RAN[-1][0]][_skewed(IDS[-1])]
            out[column] = Timing(t, t, t)
        return out

    monkeypatch.setattr(tune_moe, "skewed_routing", marked)
    monkeypatch.setattr(timing, "time_graphs", clock)
    table, _ = tune_moe.tune_moe(clocked, [SHAPE], ms=(4,), chain=CHAIN, device="cpu")
    assert validate_table(table) is None
    got = {f"{g['backend']}/{g['layout']}": g["shapes"][KEY]["4"] for g in table["moe"]}
    assert got == {name: {"us": us, "skewed_us": skewed_us} for name, (us, skewed_us) in under.items()}
    rows = MoeMeasurements([table], {}).times(*SHAPE)
    route = build_moe_plan(MoeProblem(*SHAPE), list(CHAIN), CPU, measured=rows).route(4)
    assert (route.backend, route.layout, route.us) == ("fast", "b", 1.02)
    assert route.detail == "measured 1.0 us, 1.1 us skewed (others: fast/a 1.0/3.0, slow/sorted 5.0/5.0 us uniform/skewed)"
    # wrong under skewed routing only: recorded, and left out
    monkeypatch.setattr(Clocked, "skew_broken", "fast/b")
    table, rows = tune_moe.tune_moe(clocked, [SHAPE], ms=(4,), chain=CHAIN, device="cpu")
    assert {(g["backend"], g["layout"]) for g in table["moe"]} == {("fast", "a"), ("slow", "sorted")}
    assert any(r.get("route") == "fast/b" and r.get("correct") is False for r in rows)
    # one route: no skewed time
    table, _ = tune_moe.tune_moe(clocked, [SHAPE], ms=(4,), chain=CHAIN, device="cpu", backends=["slow"])
    assert table["moe"][0]["shapes"][KEY]["4"] == {"us": 5.0}


def test_the_budget_stops_new_points(clocked: Any) -> None:
    table, rows = tune_moe.tune_moe(clocked, [SHAPE], ms=(1, 8), chain=CHAIN, device="cpu", budget_s=0.0)
    assert "moe" not in table and any(r.get("skipped") == "budget" for r in rows)


def test_a_tuned_table_makes_the_moe_plan_pick_the_measured_winner(clocked: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    table, _ = tune_moe.tune_moe(clocked, [SHAPE], ms=tuple(2**i for i in range(14)), chain=CHAIN, device="cpu")
    table = merge_tables(new_table("cpu-test"), {**table, "device_name": "cpu-test"})
    monkeypatch.setattr(moe_select_module, "MOE_BACKENDS", (Fast, Slow, ReferenceMoe))
    sel = resolve(CPU, plugins=False, tuning=table)
    moe = sel.prepare_moe(*random_moe(E, H, INTER, seed=0).weights(), top_k=K)
    assert moe.main_plan.summary() == "M 1-8: fast/a, M >= 9: fast/b"
    assert {r.why for r in moe.main_plan.routes} == {MEASURED}
    other_k = moe._plan_for(torch.bfloat16, 1)  # no rows for k=1: modelled from the k=8 rows
    assert {r.why for r in other_k.routes} == {"model"}
    assert all(f"measured shapes E,H,I,k ({','.join(map(str, SHAPE))} 100%)" in r.detail for r in other_k.routes)
    assert sel.moe_plan_for(*SHAPE).summary() == moe.main_plan.summary()


class Tiles(Clocked):
    """Two launch configurations: ``small`` the faster under uniform routing, ``big`` under skewed routing."""

    name = "tiles"
    layouts = ("sorted",)
    wrong_under_skew: ClassVar[str] = ""

    def tuning_configs(self, problem: Any, layout: str, bucket: int) -> list[Any]:
        return ["small", "big"]

    def launch_config(self, config: Any) -> Any:
        assert config in ("small", "big"), "a row's configuration, never None"
        return config

    def bind(self, prepared: Any, layout: str, config: Any, caps: Any) -> Any:
        inner = ReferenceMoe.bind(self, prepared, layout, None, caps)

        def launch(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            skewed = bool((ids == 0).any(1).all())
            RAN.append((f"{config}/{'skewed' if skewed else 'uniform'}", x.shape[0]))
            return inner(x, w, ids) * (2 if skewed and config == self.wrong_under_skew else 1)

        return launch


@pytest.fixture
def tiles(clocked: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Under the fake clock, ``skewed_routing`` replaced by every token on experts 0..k-1 (what ``Tiles`` reads)."""

    def every_token_on_expert_0(m: int, k: int, e: int, device: Any, generator: Any = None) -> Any:
        return torch.full((m, k), 1.0 / k), torch.arange(k, dtype=torch.int32).repeat(m, 1)

    monkeypatch.setattr(tune_moe, "skewed_routing", every_token_on_expert_0)
    monkeypatch.setattr(Tiles, "wrong_under_skew", "")
    return clocked


def test_a_configuration_wrong_under_skew_is_left_out(tiles: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Tiles, "wrong_under_skew", "big")
    monkeypatch.setitem(TIMES, "small/uniform", lambda m: 1.0)
    _, rows = tune_moe.tune_moe(tiles, [SHAPE], ms=(64,), chain=(Tiles(),), device="cpu")
    checked = [r for r in rows if "rel_err" in r]
    assert [r.get("correct", True) for r in checked] == [True, False]  # small, then big: twice the output skewed
    assert [r["route"] for r in rows if r.get("final")] == ["tiles/sorted"]


def test_a_configuration_that_loses_under_skew_is_not_kept(tiles: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Configurations are timed together, interleaved, under uniform and then skewed routing; the one whose worse
    ratio to the fastest is least is kept: ``big`` 1.05x under uniform routing beats ``small`` 3x under skew."""
    times = {"small/uniform": 1.0, "small/skewed": 3.0, "big/uniform": 1.05, "big/skewed": 1.2}
    for name, us in times.items():
        monkeypatch.setitem(TIMES, name, lambda m, us=us: us)
    together: list[list[str]] = []  # per call of the timer, what ran in it

    def timed_clock(columns: Any, replays: int = 50, **kw: Any) -> dict[str, Timing]:
        out, ran = {}, []
        for column, calls in columns.items():
            out.update(fake_clock({column: calls}, replays, **kw))
            ran.append(RAN[-1][0])
        together.append(sorted(ran))
        return out

    monkeypatch.setattr(timing, "time_graphs", timed_clock)
    table, rows = tune_moe.tune_moe(tiles, [SHAPE], ms=(64,), chain=(Tiles(),), device="cpu")
    assert together == [["big/uniform", "small/uniform"], ["big/skewed", "small/skewed"], ["big/uniform"]]
    assert table["moe"][0]["shapes"][KEY]["64"]["us"] == 1.05  # the routes' timing ran ``big``
    assert [(r["uniform_us"], r["skewed_us"]) for r in rows if "skewed_us" in r] == [(1.0, 3.0), (1.05, 1.2)]
    assert [tune_moe._least_loss(t) for t in ([(1.0, 3.0), (1.05, 1.2)], [(1.0, 1.0), (1.0, 1.0)], [(2.0,), (1.0,)])] \
        == [1, 0, 1]


def test_the_known_rows_configuration_is_tried_first(tiles: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-timing (``--force --max-configs 1``) keeps the table's configurations; with more, the table's is
    timed first and the rule's candidates after it, none twice. Another version's row serves where the
    installed versions have none."""
    for name in ("small/uniform", "small/skewed", "big/uniform", "big/skewed"):
        monkeypatch.setitem(TIMES, name, lambda m: 1.0)
    table, _ = tune_moe.tune_moe(tiles, [SHAPE], ms=(64,), chain=(Tiles(),), device="cpu")
    [entry] = table["moe"]
    entry["shapes"][KEY]["64"]["config"] = "big"
    other = {**entry, "versions": {"torch": "0.1"}, "shapes": {KEY: {"64": {"us": 1.0, "config": "small"}}}}

    def tried(known: Any, max_configs: int) -> list[str]:
        RAN.clear()
        tune_moe.tune_moe(tiles, [SHAPE], ms=(64,), known=known, force=True, max_configs=max_configs,
                          chain=(Tiles(),), device="cpu")
        return list(dict.fromkeys(name.split("/")[0] for name, _ in RAN))

    assert tried(table, 1) == ["big"]
    assert tried(table, 2) == ["big", "small"]
    assert tried({**table, "moe": [entry, other]}, 1) == ["big"], "the installed versions' row first"
    assert tried({**table, "moe": [{**other, "shapes": {KEY: {"64": {"us": 1.0, "config": "big"}}}}]}, 1) == ["big"]
    entry["shapes"][KEY]["64"]["config"] = None
    assert tried(table, 2) == ["small", "big"], "without a configuration, the rule's order"


def test_skewed_routing_loads_the_first_experts() -> None:
    weights, ids = skewed_routing(64, 8, 32, "cpu", torch.Generator().manual_seed(1))
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert all(len(set(row)) == 8 for row in ids.tolist())
    counts = torch.bincount(ids.flatten().long(), minlength=32)
    assert counts[:4].min() > 48 and counts[16:].sum() < 8  # 512 slots: uniform would give 16 each
    _, uniform = uniform_routing(64, 8, 32, "cpu", torch.Generator().manual_seed(1))
    assert len(ids.unique()) < len(uniform.unique())


def test_table_moe_rows_are_checked_and_merged() -> None:
    table = new_table("dev")
    table["moe"] = [{"backend": "triton", "layout": "sorted", "versions": {"torch": "2.13"},
                     "shapes": {KEY: {"1": {"us": 3.0, "config": default_config(1, K, E).to_dict()}}}}]
    assert validate_table(table) is None
    bad = json.loads(json.dumps(table))
    bad["moe"][0]["shapes"] = {"256,128": {"1": {"us": 3.0}}}
    assert "expected keys 'E,H,I,k'" in (validate_table(bad) or "")
    bad = json.loads(json.dumps(table))
    bad["moe"][0]["shapes"][KEY]["1"]["config"] = {"BLOCK_M": 16}
    assert "MoeTritonConfig keys" in (validate_table(bad) or "")
    skewed = json.loads(json.dumps(table))
    skewed["moe"][0]["shapes"][KEY]["1"]["skewed_us"] = 4.0
    assert validate_table(skewed) is None
    skewed["moe"][0]["shapes"][KEY]["1"]["skewed_us"] = 0
    assert ".skewed_us: expected a positive finite number of microseconds, found 0" in (validate_table(skewed) or "")
    dense = new_table("dev")
    dense["groups"] = [{"backend": "triton", "versions": {"torch": "2.13"},
                        "shapes": {"256,128": {"1": {"us": 3.0, "skewed_us": 4.0}}}}]
    assert "unknown key(s) 'skewed_us'; expected 'us' and optionally 'config' and 'runs'" in (validate_table(dense) or "")
    bad = json.loads(json.dumps(table))
    del bad["moe"][0]["layout"]
    assert "expected keys 'backend', 'layout'" in (validate_table(bad) or "")
    newer = json.loads(json.dumps(table))
    newer["moe"][0]["shapes"][KEY] = {"1": {"us": 2.0}, "2": {"us": 4.0}}
    newer["moe"][0]["backend"] = "deepgemm"
    newer["moe"][0]["layout"] = "masked"
    merged = merge_tables(merge_tables(table, newer), {**newer, "moe": [{**newer["moe"][0], "shapes": {KEY: {"1": {"us": 1.5}}}}]})
    rows = MoeMeasurements([merged], {}).times(*SHAPE)
    assert {r: {b: v["us"] for b, v in bs.items()} for r, bs in rows.items()} == {
        "triton/sorted": {1: 3.0}, "deepgemm/masked": {1: 1.5, 2: 4.0}}
    assert merge_tables(merged, new_table("dev")) == merged


def test_measurements_prefer_the_installed_versions() -> None:
    old = {"backend": "triton", "layout": "sorted", "versions": {"torch": "2.11"}, "shapes": {KEY: {"1": {"us": 9.0}, "2": {"us": 9.0}}}}
    here = {**old, "versions": {"torch": "2.13"}, "shapes": {KEY: {"1": {"us": 3.0}}}}
    table = {**new_table("dev"), "moe": [old, here]}
    assert MoeMeasurements([table], {"triton": {"torch": "2.13"}}).times(*SHAPE)["triton/sorted"][1]["us"] == 3.0
    other = MoeMeasurements([table], {"triton": {"torch": "2.14"}})
    assert other.times(*SHAPE)["triton/sorted"][1]["us"] == 9.0 and "other versions (torch 2.11)" in other.describe()
    assert MoeMeasurements([table], {}).times(1, 2, 3, 1) == {}


def test_moe_shapes_parse_names_and_groups() -> None:
    assert parse_moe_shapes("all") == list(MOE_SHAPES.values())
    assert parse_moe_shapes("deepseek-v3-e32,64,4096,1024,6;qwen3-30b-a3b") == [
        (32, 7168, 2048, 8), (64, 4096, 1024, 6), (128, 2048, 768, 8)]
    for text in ("", "1,2,3", "4,256,128,8", "kimi", "4,0,128,2", "1234567890,1,1,1"):
        with pytest.raises(InvalidInputError, match=r"^--moe"):
            parse_moe_shapes(text)
    # names one after another, groups of four one after another, x as a separator, any case
    assert parse_moe_shapes("deepseek-v3-e8,qwen3-30b-a3b") == [MOE_SHAPES["deepseek-v3-e8"], MOE_SHAPES["qwen3-30b-a3b"]]
    assert parse_moe_shapes("8,7168,2048,8,1,1,1,1,Qwen3-30B-A3B") == [(8, 7168, 2048, 8), (1, 1, 1, 1),
                                                                       MOE_SHAPES["qwen3-30b-a3b"]]
    assert parse_moe_shapes("all,1,1,1,1") == [*MOE_SHAPES.values(), (1, 1, 1, 1)]
    assert parse_moe_shapes("8X7168x2048x8 123456789,1,1,1") == [(8, 7168, 2048, 8), (123456789, 1, 1, 1)]
    with pytest.raises(InvalidInputError, match=r"^--shapes '1,2,3': .* or one of deepseek-v3-e8, deepseek-v3-e32, "):
        parse_moe_shapes("1,2,3", what="--shapes")
    with pytest.raises(InvalidInputError, match=r"^--shapes: expected MoE shapes \(E,H,I,k or deepseek-v3-e8, deepseek"):
        parse_moe_shapes(" ; ", what="--shapes")


def test_uniform_routing_draws_distinct_experts() -> None:
    gen = torch.Generator().manual_seed(0)
    weights, ids = uniform_routing(512, 8, 32, "cpu", gen)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert all(len(set(row)) == 8 for row in ids.tolist())
    counts = torch.bincount(ids.flatten().long(), minlength=32)
    assert counts.min() > 0.6 * 128 and counts.max() < 1.4 * 128  # 4096 slots over 32 experts: ~128 each
    assert torch.allclose(weights.sum(1), torch.ones(512))



class Gated(Clocked):
    """Layout ``a`` up to M 64 only; layout ``b`` on this snapshot's device kind only."""

    name = "gated"

    def supports(self, problem: MoeProblem, caps: Any, layout: str) -> Verdict:
        if layout == "a" and (problem.m is None or problem.m > 64):
            return Verdict.reject("a: up to M 64")
        if layout == "b" and caps.device_kind != CPU.device_kind:
            return Verdict.reject("b: not on this device")
        return super().supports(problem, caps, layout)


def test_load_time_asks_each_bucket_of_the_routes_gates() -> None:
    """Nothing known: every bucket where two or more routes' gates take it is open, and the gates are asked
    at that bucket on this device."""
    from fp8select.measure import loadtime

    open_buckets = loadtime.moe_buckets_to_measure((Gated(), ReferenceMoe()), CPU, None, SHAPE)
    assert open_buckets == sorted((b for b in M_BUCKETS if b <= 64), key=loadtime.SPREAD.__getitem__)  # ends first
    elsewhere = replace(CPU, device_kind="xpu")
    assert loadtime.moe_buckets_to_measure((Gated(), ReferenceMoe()), elsewhere, None, SHAPE) == []

def test_the_tune_command_writes_moe_rows_and_merges(clocked: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from fp8select import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "resolve", lambda **kw: clocked)
    real = tune_moe.tune_moe
    monkeypatch.setattr(tune_moe, "tune_moe", lambda *a, **kw: real(*a, **kw, chain=CHAIN, device="cpu"))
    out = tmp_path / "t.json"
    assert cli.main(["tune", "--moe", KEY, "--m", "1,64", "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert first["groups"] == [] and {(g["backend"], g["layout"]) for g in first["moe"]} == {
        ("fast", "a"), ("fast", "b"), ("slow", "sorted")}
    assert cli.main(["tune", "--moe", "4,256,256,2", "--m", "1", "--out", str(out)]) == 0
    shapes = {s for g in json.loads(out.read_text())["moe"] for s in g["shapes"]}
    assert shapes == {KEY, "4,256,256,2"}, "a second run adds to the table"
    RAN.clear()
    assert cli.main(["tune", "--moe", KEY, "--m", "1,64,128", "--out", str(out)]) == 0
    assert {m for _, m in RAN} == {128}, "what the output file holds is not measured again"
    RAN.clear()
    assert cli.main(["tune", "--moe", KEY, "--m", "1,64,128,256", "--out", str(out), "--force", "--budget-s", "0"]) == 0
    assert RAN == [], "a forced run cut short before its first point"
    assert cli.main(["tune", "--moe", KEY, "--m", "1,64,128,256", "--out", str(out), "--force", "--resume"]) == 0
    assert {m for _, m in RAN} == {256}, "a forced run resumed measures only what the output file lacks"
    RAN.clear()
    assert cli.main(["tune", "--moe", KEY, "--m", "1,256", "--out", str(out), "--force"]) == 0
    assert {m for _, m in RAN} == {1, 256}, "a forced run measures everything again"
    assert cli.main(["tune", "--moe", "4,256"]) == 2


def test_merge_tuning_folds_moe_rows_in_keeping_only_improvements(tmp_path: Any) -> None:
    from benchmarks import merge_tuning

    def entry(layout: str, rows: dict[str, float]) -> dict[str, Any]:
        return {"backend": "deepgemm", "layout": layout, "versions": {"torch": "2.11"},
                "shapes": {KEY: {b: {"us": us} for b, us in rows.items()}}}

    base = {**new_table("dev"), "moe": [entry("masked", {"1": 10.0, "2": 10.0})]}
    new = {**new_table("dev"), "moe": [entry("masked", {"1": 9.0, "2": 11.0}), entry("contiguous", {"1": 20.0})]}
    paths = [tmp_path / n for n in ("base.json", "new.json", "out.json")]
    paths[0].write_text(json.dumps(base))
    paths[1].write_text(json.dumps(new))
    merge_tuning.main([str(p) for p in paths])
    out = json.loads(paths[2].read_text())
    got = {(g["layout"], b): r["us"] for g in out["moe"] for b, r in g["shapes"][KEY].items()}
    assert got == {("masked", "1"): 9.0, ("masked", "2"): 10.0, ("contiguous", "1"): 20.0}


def test_load_time_tuning_of_a_moe_layer_measures_only_its_open_buckets(clocked: Any, monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Any) -> None:
    """A shape no table holds is measured at load time where its routes' estimates are close (or missing),
    with the layer's own weights first; the rows go to the cache directory and into the layer's plan; a bucket
    with rows is not measured again."""
    from fp8select.measure import loadtime
    from fp8select.measured.table import load_table, table_path
    from fp8select.moe_select import moe_measurements

    known, _ = tune_moe.tune_moe(clocked, [SHAPE], ms=tuple(2**i for i in range(14)), chain=CHAIN, device="cpu")
    rows_at_16 = {(g["backend"], g["layout"]): g["shapes"][KEY]["16"] for g in known["moe"]}
    rows_at_16[("fast", "a")]["us"] = 2.2  # within 1.25x of fast/b's 2.0 there, under uniform routing
    caps = replace(CPU, device_name="cpu-test", env={"FP8SELECT_CACHE_DIR": str(tmp_path)})
    known = {**known, "device_name": "cpu-test"}
    sel = resolve(caps, plugins=False, tuning=known)
    unseen = (8, H, INTER, K)
    # ranked as the plan ranks: fast/a far behind under skewed routing leaves no choice to make ...
    assert rows_at_16[("fast", "a")]["skewed_us"] > 1.25 * rows_at_16[("fast", "b")]["skewed_us"]
    assert loadtime.moe_buckets_to_measure(CHAIN, caps, moe_measurements(sel, CHAIN, [known]), unseen) == []
    rows_at_16[("fast", "a")]["skewed_us"] = rows_at_16[("fast", "b")]["skewed_us"]  # ... close under both: one
    table = moe_measurements(sel, CHAIN, [known])
    assert loadtime.moe_buckets_to_measure(CHAIN, caps, table, unseen) == [16]
    assert loadtime.moe_buckets_to_measure(CHAIN, caps, table, SHAPE) == []  # measured: nothing to do
    assert loadtime.moe_buckets_to_measure(CHAIN, caps, None, unseen) == sorted(M_BUCKETS, key=loadtime.SPREAD.__getitem__)
    partly = {**known, "moe": [{**g, "shapes": {KEY: {"16": g["shapes"][KEY]["16"]}}} for g in known["moe"]]}
    # measured at M 16 only (a budget that ended): the next start measures the other buckets (none has rows
    # anywhere now, so every one is open), never 16 again
    held = moe_measurements(sel, CHAIN, [partly])
    assert sorted(loadtime.moe_buckets_to_measure(CHAIN, caps, held, SHAPE)) == [b for b in M_BUCKETS if b != 16]
    made: list[int] = []
    monkeypatch.setattr(tune_moe, "random_experts",
                        lambda e, h, i, device, gen: made.append(e) or random_moe(e, h, i, seed=1).weights())
    weights = random_moe(8, H, INTER, seed=2).weights()
    found = sel._measure_moe_at_load(CHAIN, table, weights, unseen)
    assert made == []  # the layer's own weights timed (one copy off a GPU: no L2 to rotate past)
    rows = found.times(*unseen)
    assert {route: sorted(buckets) for route, buckets in rows.items()} == {"fast/a": [16], "fast/b": [16],
                                                                        "slow/sorted": [16]}
    saved = load_table(table_path(tmp_path, "cpu-test"), "cpu-test")
    assert saved is not None and any("8,256,128,2" in g["shapes"] for g in saved["moe"])
    calls: list[Any] = []
    monkeypatch.setattr(tune_moe, "tune_moe", lambda *a, **k: calls.append(a) or ({}, []))
    again = sel._measure_moe_at_load(CHAIN, table, weights, unseen)
    assert calls == [] and again.times(*unseen) == rows  # the selection keeps what it measured
    assert list(sel._memo.measured_moe) == [unseen]
