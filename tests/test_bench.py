"""The pure parts of bench and timing (parsing, byte counts, winners, targets, replay order); on a GPU, the
interleaved timer."""

from __future__ import annotations

import math

import pytest
import torch

from fp8select import Fp8SelectError
from fp8select.measure import bench, timing


def test_parse_shapes_mixes_sets_and_pairs() -> None:
    assert bench.parse_shapes("2112,7168 4096x7168") == [(2112, 7168), (4096, 7168)]
    ds = bench.parse_shapes("deepseek-v3")
    assert len(ds) == 8 and (36864, 7168) in ds
    assert bench.parse_shapes("deepseek-v3,12288,7168")[-1] == (12288, 7168)
    for bad in ("", "12", "12,x", "0,128", "llama"):
        with pytest.raises(Fp8SelectError, match="--shapes"):
            bench.parse_shapes(bad)
    assert bench.parse_ms("1, 16,8192") == [1, 16, 8192]
    with pytest.raises(Fp8SelectError, match="--m"):
        bench.parse_ms("0,1")


def test_byte_and_time_floors() -> None:
    from fp8select.roofline import floor_us, floors_us, min_bytes, quant_bytes

    n, k, m = 7168, 16384, 16
    assert min_bytes(n, k, m) == n * k + 56 * 128 * 4 + m * k * 2 + m * n * 2
    hbm_us, flop_us = floors_us(n, k, m)
    assert math.isclose(hbm_us, min_bytes(n, k, m) / 4.3e12 * 1e6) and floor_us(n, k, m) == hbm_us
    assert flop_us < hbm_us  # decode is memory-bound
    assert quant_bytes(1024, 7168) == 1024 * 7168 * 3 + 1024 * 56 * 4  # bf16 read, fp8 and scales written
    assert quant_bytes(2, 200) == 2 * 200 * 3 + 2 * 2 * 4  # a partial last group has its scale
    assert bench.rotation_copies(15 * 2**20) == 12 and bench.rotation_copies(2**30) == 1
    fp8 = torch.zeros(15 * 2**20, dtype=torch.float8_e4m3fn)
    copies = bench.rotated(fp8)
    assert len(copies) == 12 and copies[0] is fp8 and len({c.data_ptr() for c in copies}) == 12
    assert len(bench.rotated(fp8.view(torch.bfloat16))) == 12  # by bytes, not elements


def _row(n: int, k: int, m: int, backend: str, us: float, hbm: float = 0.5) -> dict[str, object]:
    return {"n": n, "k": k, "m": m, "backend": backend, "whole": {"median_us": us, "min_us": us, "max_us": us},
            "hbm_fraction": hbm}


def test_summary_states_the_targets() -> None:
    rows = [
        _row(7168, 16384, 1, "cuda-scaled-mm", 40.0), _row(7168, 16384, 1, "triton", 32.0, 0.8), _row(7168, 16384, 1, "auto", 32.0),
        _row(7168, 16384, 4096, "cuda-scaled-mm", 100.0), _row(7168, 16384, 4096, "triton", 200.0), _row(7168, 16384, 4096, "auto", 103.0),
        _row(7168, 16384, 4096, "bf16-matmul", 50.0),
    ]
    s = bench.summary(rows)
    assert s["points"] == 2
    assert math.isclose(s["auto_vs_fastest"], math.sqrt(1.0 * 1.03), rel_tol=1e-3)
    assert math.isclose(s["triton_vs_auto"], math.sqrt(1.0 * 200 / 103), rel_tol=1e-3)
    assert math.isclose(s["small_m_cublas_vs_triton"], 1.25) and s["small_m_min_hbm_fraction"] == 0.8
    assert math.isclose(s["large_m_triton_speed_vs_cublas"], 0.5)
    assert bench.winners(rows) == {(7168, 16384, 1): "triton", (7168, 16384, 4096): "cuda-scaled-mm"}
    table = bench.format_table([*rows, {"n": 1, "k": 1, "m": 1, "backend": "x", "error": "boom"}])
    assert "WINNER" in table and "boom" in table


def test_replay_order_shuffles_every_step_the_same_way_every_run() -> None:
    names = ["deepgemm", "cuda-scaled-mm", "triton", "auto"]
    orders = timing.replay_order(names, 50)
    assert len(orders) == 50 and all(sorted(o) == sorted(names) for o in orders)  # each column once per step
    assert {o[0] for o in orders} == set(names)  # no column always first
    assert orders == timing.replay_order(names, 50) and orders != timing.replay_order(names, 50, seed=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_time_graphs_times_every_column_and_sets_a_failing_one_aside() -> None:
    t = torch.zeros(1, device="cuda")

    def broken() -> None:
        raise ValueError("no kernel for this shape")

    errors: dict[str, str] = {}
    times = timing.time_graphs({"one": [t.zero_], "two": [t.zero_, t.zero_], "broken": [broken]}, 10, errors=errors)
    assert set(times) == {"one", "two"} and errors == {"broken": "ValueError: no kernel for this shape"}
    assert all(0 < x.min_us <= x.median_us <= x.max_us for x in times.values())
    with pytest.raises(ValueError, match="no kernel"):
        timing.time_graphs({"one": [t.zero_], "broken": [broken]}, 10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_time_graphs_columns_sharing_one_pool_keep_their_own_results() -> None:
    """Each column's temporaries come from the shared pool, and each call adds its product to memory
    outside the pool: after the shuffled replays every column holds a whole number of its own products,
    the same number in every column."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(64, 256, device="cuda", generator=gen)
    weights = [torch.rand(256, 128, device="cuda", generator=gen) for _ in range(3)]
    sums = [torch.zeros(64, 128, device="cuda", dtype=torch.float64) for _ in weights]
    columns = {f"c{i}": [lambda w=w, acc=acc: acc.add_((x @ w).relu())] for i, (w, acc) in enumerate(zip(weights, sums, strict=True))}
    timing.time_graphs(columns, 7)
    counts = []
    for w, acc in zip(weights, sums, strict=True):
        ratio = acc / (x @ w).relu().double()
        counts.append(round(ratio[0, 0].item()))
        assert torch.allclose(ratio, torch.full_like(ratio, counts[-1]), rtol=1e-9)
    assert counts[0] >= 7 and counts == [counts[0]] * 3


def test_a_pinned_column_plans_from_what_auto_measured_at_load_and_measures_nothing() -> None:
    """bench.single_backend: the pinned selection's chain is the one backend, its tables and measurements hold
    every table the selection measured at load time so far, and it measures nothing itself (before, each pinned
    selection measured rows of its own and could run another configuration than auto's plan)."""
    import fp8select
    from fp8select.measured.table import new_table

    selection = fp8select.resolve()
    reference = next(b for b in selection.chain if b.name == "reference")
    plain = bench.single_backend(selection, reference)
    assert plain.chain == (reference,) and not plain.tune_at_load and plain.tables == selection.tables
    table = new_table(selection.capabilities.device_name or "cpu")
    table["groups"] = [{"backend": "reference", "versions": {}, "shapes": {"512,1024": {"64": {"us": 9.0}}}}]
    selection._memo.measured[(512, 1024)] = table
    selection._memo.measured[(1024, 1024)] = {}  # a shape that needed nothing
    pinned = bench.single_backend(selection, reference)
    assert pinned.tables == (*selection.tables, table) and not pinned.tune_at_load
    assert pinned.measurements is not None and pinned.measurements.buckets_held(512, 1024) == {64}
    assert not pinned._memo.measured  # its own memo: it measures nothing, the tables carry the rows
