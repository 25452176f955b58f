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


def test_jobs_are_the_distinct_jit_calls(interpreted: None) -> None:
    triton = _layer("triton")
    calls = [(triton, 1), (triton, 1), (triton, 64), (_layer("reference"), 1)]
    assert jit_jobs(calls, torch.bfloat16) == [JitJob("triton", 256, 256, (1,), "bfloat16", "cpu"),
                                               JitJob("triton", 256, 256, (64,), "bfloat16", "cpu")]


def test_workers_run_their_calls_and_failures_are_reported_not_raised(interpreted: None) -> None:
    jobs = [JitJob("triton", 256, 256, (3, 40), "bfloat16", "cpu"), JitJob("deepgemm", 256, 256, (3,), "bfloat16", "cpu")]
    ok, failed = compile_in_processes(jobs, processes=2)
    assert ok["backend"] == "triton" and "error" not in ok and ok["seconds"] > 0
    assert failed["backend"] == "deepgemm" and failed["error"].startswith("exit 1:") and "deepgemm" in failed["error"]
    (late,) = compile_in_processes(jobs[:1], processes=1, timeout_s=0.01)
    assert late["error"] == "timed out after 0 s"


def test_warmup_with_processes_compiles_first_then_calls(interpreted: None) -> None:
    layer = _layer("triton")
    report = warmup(layer, ms=[2, 17], processes=2)
    assert report.calls == 2 and sorted(w["ms"] for w in report.workers) == [(2,), (17,)]
    assert all("error" not in w for w in report.workers)
    assert warmup(layer, ms=[2]).workers == ()  # none unless asked
    with pytest.raises(InvalidInputError, match="processes"):
        warmup(layer, processes=-1)
