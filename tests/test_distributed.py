"""One decision across ranks: two gloo processes on CPU resolve, agree, disagree and share tables.

Every scenario runs in the same two spawned processes (one start-up), each rank writing what
it got to a JSON file that the test then reads. A rank that hangs fails the test through the
process-group timeout and the join deadline instead of blocking CI.
"""

from __future__ import annotations

import datetime
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fp8select import Capabilities, InvalidInputError, resolve
from fp8select.distributed import agree, broadcast_table, measure_on_one_rank
from fp8select.errors import RankMismatchError

WORLD = 2
PG_TIMEOUT_S = 30
JOIN_DEADLINE_S = 90

F8 = ("float8_e4m3fn", "float8_e5m2")
CPU = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=F8)
CPU_TRITON = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=F8, packages={"triton": "3.9.0"},
                          env={"TRITON_INTERPRET": "1"})


def _outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What a call returned, as JSON: the selection's choice and chain, or the error raised."""
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects whatever was raised
        return {"error": type(exc).__name__, "message": str(exc), "bases": [c.__name__ for c in type(exc).__mro__]}
    if hasattr(value, "backend"):
        return {"backend": value.backend.name, "chain": [b.name for b in value.chain],
                "verdicts": {c.name: [c.accepted, c.reason] for c in value.verdicts}, "notes": list(value.notes),
                "tuning_sources": list(value.tuning_sources)}
    return {"value": value}


def _scenarios(rank: int) -> dict[str, Callable[[], Any]]:
    """name -> what this rank does; both ranks run every scenario, in the same order."""
    table = _table({"triton": 1.0, "reference": 2.0})
    other = _table({"triton": 3.0, "reference": 2.0})

    def failing_measure() -> dict[str, Any]:
        raise RuntimeError("out of memory while tuning")

    return {
        "same": lambda: resolve(CPU_TRITON, plugins=False, group="world"),
        "differ-common": lambda: resolve(CPU_TRITON, plugins=False, disable="triton" if rank == 1 else (), group="world"),
        "differ-raise": lambda: resolve(CPU_TRITON, plugins=False, disable="triton" if rank == 1 else (), group="world",
                                        on_mismatch="raise"),
        "differ-explicit": lambda: resolve(CPU_TRITON, plugins=False, backend="triton" if rank == 0 else None,
                                           disable="triton" if rank == 1 else (), group="world"),
        "no-common": lambda: resolve(CPU_TRITON, plugins=False, disable="reference" if rank == 0 else "triton",
                                     group="world"),
        "one-rank-fails": lambda: resolve(CPU, plugins=False, backend="cublas" if rank == 1 else None, group="world"),
        "snapshots-differ": lambda: resolve(CPU if rank == 0 else CPU_TRITON, plugins=False,
                                            disable="triton" if rank == 1 else (), group="world"),
        "agree-directly": lambda: agree(resolve(CPU_TRITON, plugins=False, disable="triton" if rank == 0 else ()), None),
        "broadcast": lambda: broadcast_table(table if rank == 0 else None, None, src=0),
        "broadcast-from-1": lambda: broadcast_table(table if rank == 1 else None, None, src=1),
        "broadcast-invalid": lambda: broadcast_table({"schema": 9} if rank == 0 else None),
        "measure-fails": lambda: measure_on_one_rank(failing_measure if rank == 0 else (lambda: {}), None, src=0),
        "still-in-step": lambda: resolve(CPU, plugins=False, group="world"),
        "tuning-from-rank-0": lambda: resolve(CPU, plugins=False, group="world", tuning=table if rank == 0 else True),
        # each rank holds its own table; with a group, rank 0's decides every rank's plan
        "plans-with-group": lambda: _plan(resolve(CPU_TRITON, plugins=False, group="world",
                                                  tuning=table if rank == 0 else other)),
        "plans-without-group": lambda: _plan(resolve(CPU_TRITON, plugins=False, tuning=table if rank == 0 else other)),
    }


def _table(us: dict[str, float]) -> dict[str, Any]:
    """Measurements of a 256x384 layer: each backend at every M bucket (Triton with its configuration)."""
    config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
    return {"schema": 2, "device_name": "cpu", "groups": [
        {"backend": name, "versions": {"torch": "2.13.0+cpu"},
         "shapes": {"256,384": {str(2**i): {"us": t, **({"config": config} if name == "triton" else {})} for i in range(14)}}}
        for name, t in us.items()]}


def _plan(selection: Any) -> dict[str, Any]:
    """The plan of one layer (same weights on every rank), as JSON."""
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(256, 384, generator=gen) * 50).to(torch.float8_e4m3fn)
    layer = selection.prepare(w, torch.rand(2, 3, generator=gen) + 0.5)
    return {"fingerprint": layer.main_plan.fingerprint(), "plan": layer.main_plan.to_dict(), "backends": list(layer.backends)}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    results: dict[str, Any] = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
        try:
            for name, fn in _scenarios(rank).items():
                results[name] = _outcome(fn)
        finally:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent through the results file
        results["worker-crash"] = traceback.format_exc()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    tmp = tmp_path_factory.mktemp("dist")
    ctx = mp.start_processes(_worker, args=(str(tmp / "init"), str(tmp)), nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + JOIN_DEADLINE_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} ranks did not finish within {JOIN_DEADLINE_S} s (a collective hung)")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    out = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, res in enumerate(out):
        assert "worker-crash" not in res, f"rank {r} crashed:\n{res['worker-crash']}"
    return out


def _both(results: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return results[0][name], results[1][name]


def test_agreeing_ranks_proceed(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "same")
    assert r0["backend"] == r1["backend"] == "triton"
    assert r0["chain"] == r1["chain"] == ["triton", "reference"]
    assert not any("disagreed" in n or "differ" in n for n in r0["notes"])


def test_differing_ranks_take_the_best_common_backend(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "differ-common")
    assert r0["backend"] == r1["backend"] == "reference"
    assert r0["chain"] == r1["chain"] == ["reference"]
    accepted, reason = r0["verdicts"]["triton"]
    assert not accepted and "rejected on another" in reason and "rank 1: disabled by disable=triton" in reason
    assert any("ranks disagreed (rank 0: triton, rank 1: reference)" in n for n in r0["notes"])


def test_differing_ranks_raise_with_each_ranks_verdicts(results: list[dict[str, Any]]) -> None:
    for res in _both(results, "differ-raise"):
        assert res["error"] == "RankMismatchError" and "RuntimeError" in res["bases"]
        message = res["message"]
        assert "rank 0 (snapshot" in message and "chose 'triton'" in message
        assert "rank 1 (snapshot" in message and "chose 'reference'" in message
        assert "triton: rejected: disabled by disable=triton" in message


def test_an_explicit_choice_is_never_substituted_across_ranks(results: list[dict[str, Any]]) -> None:
    for res in _both(results, "differ-explicit"):
        assert res["error"] == "RankMismatchError" and "explicit" in res["message"]


def test_no_backend_common_to_all_ranks_raises(results: list[dict[str, Any]]) -> None:
    for res in _both(results, "no-common"):
        assert res["error"] == "RankMismatchError" and "no backend is accepted by every rank" in res["message"]


def test_a_rank_that_fails_does_not_leave_the_others_waiting(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "one-rank-fails")
    assert r1["error"] == "UnknownBackendError" and "cublas" in r1["message"]
    assert r0["error"] == "RankMismatchError" and "rank 1: failed: UnknownBackendError" in r0["message"]
    still0, still1 = _both(results, "still-in-step")
    assert still0["backend"] == still1["backend"] == "reference", "the ranks fell out of step after a failure"


def test_different_snapshots_with_the_same_choice_proceed_with_a_note(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "snapshots-differ")
    assert r0["backend"] == r1["backend"] == "reference"
    assert any(n.startswith("snapshots differ across ranks") for n in r0["notes"])


def test_agree_called_directly(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "agree-directly")
    assert r0["backend"] == r1["backend"] == "reference"


def test_tables_are_broadcast_from_one_rank(results: list[dict[str, Any]]) -> None:
    for name in ("broadcast", "broadcast-from-1"):
        r0, r1 = _both(results, name)
        assert r0["value"] == r1["value"]
        assert r0["value"]["groups"][0]["shapes"]["256,384"]["8"]["us"] == 1.0


def test_an_invalid_table_is_not_spread(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "broadcast-invalid")
    assert r0["error"] == "InvalidInputError" and "schema" in r0["message"]
    assert r1["error"] == "RankMismatchError" and "rank 0" in r1["message"]


def test_a_failed_measurement_is_raised_everywhere(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "measure-fails")
    assert r0["error"] == "RuntimeError" and "out of memory" in r0["message"]
    assert r1["error"] == "RankMismatchError" and "out of memory" in r1["message"]


def test_without_an_initialised_group_the_error_is_typed() -> None:
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(InvalidInputError, match=r"group: expected an initialised torch\.distributed process group"):
        resolve(CPU, plugins=False, group="world")
    with pytest.raises(InvalidInputError, match=r"group: expected a torch\.distributed process group, 'world' or None"):
        resolve(CPU, plugins=False, group="everyone")
    with pytest.raises(InvalidInputError, match="on_mismatch: expected 'common' or 'raise', found 'vote'"):
        resolve(CPU, plugins=False, group="world", on_mismatch="vote")


def test_rank_mismatch_error_is_exported() -> None:
    import fp8select

    assert fp8select.RankMismatchError is RankMismatchError and issubclass(RankMismatchError, RuntimeError)


def test_resolve_with_a_group_uses_rank_0s_tuning_table_everywhere(results: list[dict[str, Any]]) -> None:
    r0, r1 = _both(results, "tuning-from-rank-0")
    assert r0["backend"] == r1["backend"] == "reference"
    assert r0["tuning_sources"] == r1["tuning_sources"] == ["given (rank 0)"]


def test_every_rank_ends_with_rank_0s_plan(results: list[dict[str, Any]]) -> None:
    r0, r1 = (r["value"] for r in _both(results, "plans-with-group"))
    assert r0 == r1 and r0["backends"] == ["triton"]  # rank 0 measured Triton faster at every M
    assert {route["why"] for route in r0["plan"]["routes"]} == {"measured"}
    alone0, alone1 = (r["value"] for r in _both(results, "plans-without-group"))
    assert alone0["backends"] == ["triton"] and alone1["backends"] == ["reference"]  # the test can tell them apart
    assert alone0["fingerprint"] != alone1["fingerprint"]


def test_tune_on_one_rank_measures_on_the_source_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from fp8select import distributed
    from fp8select.measure import tune as tuning

    calls: list[Any] = []
    monkeypatch.setattr(tuning, "tune", lambda selection, shapes, **kw: (calls.append((shapes, kw)) or {"groups": []}, []))
    monkeypatch.setattr(distributed, "measure_on_one_rank", lambda measure, group, src: {"src": src, **measure()})
    assert tuning.tune_on_one_rank(object(), [(256, 384)], None, src=1, replays=5) == {"src": 1, "groups": []}
    assert calls == [([(256, 384)], {"replays": 5})]
