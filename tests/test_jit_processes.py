"""warmup(..., processes=N): the JIT calls of a plan compiled in worker processes first.

On the CPU the real mechanism runs with Triton's interpreter (its "compilation" is trivial, the
workers are real processes resolving, preparing and calling with the backend pinned)."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported in this process; the workers inherit it

import pytest
import torch

import fp8select
from fp8select.errors import InvalidInputError
from fp8select.jit_processes import JitJob, compile_in_processes, jit_jobs
from fp8select.warmup import warmup


@pytest.fixture
def interpreted() -> None:
    pytest.importorskip("triton")


def _layer(backend: str, n: int = 256, k: int = 256) -> fp8select.Fp8Linear:
    w, s = fp8select.quantize_weight(torch.randn(n, k) * 0.05)
    return fp8select.resolve(backend=backend, plugins=False, verify=False).prepare(w, s)


def test_jobs_are_the_jit_calls_one_per_shape_split_while_processes_are_idle(interpreted: None) -> None:
    triton, other = _layer("triton"), _layer("triton", n=128)
    calls = [(triton, 1), (triton, 1), (triton, 64), (triton, 300), (other, 8), (_layer("reference"), 1)]
    job = JitJob("triton", 256, 256, (1, 64, 300), "bfloat16", "cpu")
    assert jit_jobs(calls, torch.bfloat16, processes=1) == [job, JitJob("triton", 128, 256, (8,), "bfloat16", "cpu")]
    assert sorted(j.ms for j in jit_jobs(calls, torch.bfloat16, processes=3)) == [(1,), (8,), (64, 300)]
    assert sorted(j.ms for j in jit_jobs(calls, torch.bfloat16, processes=8)) == [(1,), (8,), (64,), (300,)]


def test_workers_run_their_calls_and_failures_are_reported_not_raised(interpreted: None) -> None:
    jobs = [JitJob("triton", 256, 256, (3, 40), "bfloat16", "cpu"), JitJob("deepgemm", 256, 256, (3,), "bfloat16", "cpu")]
    ok, failed = compile_in_processes(jobs, processes=2)
    assert ok["backend"] == "triton" and "error" not in ok and ok["seconds"] > 0
    assert failed["backend"] == "deepgemm" and failed["error"].startswith("exit 1:") and "deepgemm" in failed["error"]
    (late,) = compile_in_processes(jobs[:1], processes=1, timeout_s=0.01)
    assert late["error"] == "timed out after 0 s"


def test_warmup_with_processes_compiles_first_then_calls(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer("triton")
    report = warmup(layer, ms=[2, 17], processes=2)
    assert report.calls == 2 and sorted(w["ms"] for w in report.workers) == [(2,), (17,)]
    assert all("error" not in w for w in report.workers)
    assert warmup(layer, ms=[2]).workers == ()  # none unless asked
    monkeypatch.setenv("FP8SELECT_JIT_PROCESSES", "2")  # asked where the layers' selection was resolved
    assert warmup(layer, ms=[2, 17]).workers == ()
    asked = _layer("triton")
    assert sorted(w["ms"] for w in warmup(asked, ms=[2, 17]).workers) == [(2,), (17,)]
    assert warmup(asked, ms=[2], processes=0).workers == ()
    with pytest.raises(InvalidInputError, match="processes"):
        warmup(layer, processes=-1)


@pytest.mark.parametrize(("value", "count"), [("4", 4), (" 8 ", 8), ("", 0), ("abc", 0), ("-2", 0), ("²", 0), ("٣", 0)])
def test_the_process_count_is_read_as_an_ascii_count_else_none(value: str, count: int) -> None:
    """FP8SELECT_JIT_PROCESSES: a count of ASCII digits, else 0 (``'²'.isdigit()`` is true, and int() of it raised)."""
    from fp8select import Capabilities
    from fp8select.jit_processes import processes_wanted

    assert processes_wanted(Capabilities(env={"FP8SELECT_JIT_PROCESSES": value})) == count
