"""``python -m fp8select probe`` / ``explain``: output, exit codes, one-line errors."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from matrix import MATRIX

import fp8select
from fp8select import Capabilities, cli
from fp8select.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["explain", "--no-plugins", *argv] if argv and argv[0] != "probe" else list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_probe_prints_a_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "probe")
    assert code == 0
    assert Capabilities.from_json(out).torch_version


def test_explain_replays_a_snapshot_and_shows_every_backend(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "h200.json"
    path.write_text(MATRIX["h200-torch2.11"][0].to_json())
    code, out, _ = run(capsys, "--capabilities", str(path))
    assert code == 0
    assert "chose 'cuda-scaled-mm'" in out
    for name in ("deepgemm", "flashinfer", "cutlass", "aiter", "npu", "xpu-scaled-mm", "triton", "reference"):
        assert name in out
    assert "chain: cuda-scaled-mm -> triton -> reference" in out


def test_explain_what_if_xpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "arc.json"
    path.write_text(MATRIX["arc-b580-torch2.13"][0].to_json())
    code, out, _ = run(capsys, "--capabilities", str(path), "--set", "torch_version=2.11.0", "--json")
    data = json.loads(out)
    assert code == 0 and data["backend"] == "triton"
    xpu = next(v for v in data["verdicts"] if v["backend"] == "xpu-scaled-mm")
    assert not xpu["accepted"] and "2.11.0" in xpu["reason"]
    code, out, _ = run(capsys, "--capabilities", str(path), "--json")
    assert json.loads(out)["backend"] == "xpu-scaled-mm"


def test_explain_set_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--set", "device_kind=xpu", "--set", "torch_version=2.11.0", "--set", "packages.triton=3.5.0",
                       "--set", 'triton_backends=["intel"]')
    assert code == 0 and "chose 'triton'" in out


def test_backend_and_disable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--set", "env.TRITON_INTERPRET=1", "--set", "packages.triton=3.9.0", "--disable", "triton")
    assert code == 0 and "chose 'reference'" in out and "disabled by disable=triton" in out
    code, _, err = run(capsys, "--backend", "deepgemm")
    assert code == 1 and "deepgemm" in err and "requires device cuda" in err


@pytest.mark.parametrize("argv, fragment", [
    (["--set", "gpu=h200"], "unknown key"),
    (["--set", "novalue"], "expected KEY=VALUE"),
    (["--set", "compute_capability=[9]"], "compute_capability"),
    (["--backend", "cublas"], "unknown backend 'cublas'"),
    (["--disable", "cublas"], "unknown backend 'cublas'"),
    (["--capabilities", "/nonexistent/snapshot.json"], "cannot read"),
])
def test_malformed_input_gets_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_truncated_snapshot_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text(MATRIX["h200-torch2.11"][0].to_json()[:50])
    code, _, err = run(capsys, "--capabilities", str(path))
    assert code == 2 and "not valid JSON" in err and len(err.strip().splitlines()) == 1


def test_module_entry_point_in_a_subprocess() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FP8SELECT_")}
    proc = subprocess.run([sys.executable, "-m", "fp8select", "explain", "--no-plugins"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0 and "reference" in proc.stdout
    # A rejected explicit choice is one message: the error once and every verdict once, no log line repeating it
    # (a real process, where Python's last-resort log handler would print the library's warning event).
    proc = subprocess.run([sys.executable, "-m", "fp8select", "explain", "--no-plugins", "--backend", "deep_gemm"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "fp8select: error: backend 'deepgemm' was requested (argument) but is rejected: requires device cuda, found cpu"
    assert lines[1] == "all verdicts:" and len(lines) == 2 + 9, proc.stderr
    assert "fp8select.resolved" not in proc.stderr


# --- first contact: version, descriptions, the program's name, names as typed ---------------------------

def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip().endswith(f" {fp8select.__version__}")


def test_every_subcommand_has_a_description() -> None:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"probe", "explain", "bench", "tune"}
    for name, command in sub.choices.items():
        assert command.description and len(command.description) > 40, name


@pytest.mark.parametrize("argv0, prog", [("/usr/local/bin/fp8select", "fp8select"),
                                         ("/site-packages/fp8select/__main__.py", "python -m fp8select")])
def test_usage_names_the_program_as_it_was_run(argv0: str, prog: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [argv0])
    with pytest.raises(SystemExit):
        main(["frobnicate"])
    assert capsys.readouterr().err.startswith(f"usage: {prog} [-h] [--version]")


def test_names_as_engines_type_them(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--backend", " Reference ", "--disable", "TRITON, Deep_GEMM")
    assert code == 0 and "chose 'reference' (argument)" in out and "disabled by disable=triton,deepgemm" in out
    code, out, _ = run(capsys, "--backend", "auto")
    assert code == 0 and "(auto)" in out


def test_snapshot_from_standard_input(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(MATRIX["h200-torch2.11"][0].to_json().encode())))
    code, out, _ = run(capsys, "--capabilities", "-")
    assert code == 0 and "chose 'cuda-scaled-mm'" in out


# --- output paths: a reader that stops early, one message for a rejected choice -------------------------

def test_a_closed_pipe_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written (`| head` that already exited)
    stdout = io.TextIOWrapper(os.fdopen(write_end, "wb"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["explain", "--json", "--no-plugins"]) == 1  # no BrokenPipeError
    stdout.write("x" * 100_000)
    stdout.flush()  # stdout now leads to devnull: the interpreter's final flush cannot fail either
    stdout.close()


# --- tune: an unusable output place fails before measuring; results are never lost -----------------------

def test_tune_with_a_cache_directory_that_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("FP8SELECT_CACHE_DIR", str(blocker))
    assert main(["tune", "--shapes", "256,384", "--m", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the tuning table into the cache directory" in err
    assert "is not a directory" in err and "FP8SELECT_CACHE_DIR" in err  # before the CUDA check: nothing measured


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write into read-only directories")
def test_tune_with_a_read_only_cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path.chmod(0o555)
    try:
        monkeypatch.setenv("FP8SELECT_CACHE_DIR", str(tmp_path))
        assert main(["tune"]) == 2
        assert "cannot write the tuning table into the cache directory" in capsys.readouterr().err
    finally:
        tmp_path.chmod(0o755)


def test_results_are_rescued_when_saving_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    table = {"schema": 1, "entries": {"256,384": {"1": {"backend": "triton", "us": 3.5}}}}

    def save(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)  # fails: the parent is a file
        path.write_text("never")

    assert not cli.save_or_rescue(tmp_path / "file" / "table.json", save, table, "tuning table")
    err = capsys.readouterr().err
    rescued = list(tmp_path.glob("fp8select-tuning-table-*.json"))
    assert len(rescued) == 1 and json.loads(rescued[0].read_text()) == table
    assert str(rescued[0]) in err and "cannot write the tuning table" in err
    assert cli.save_or_rescue(tmp_path / "ok.json", save, table, "tuning table")


def test_explain_shows_the_plan_of_a_layer_shape(capsys: pytest.CaptureFixture[str]) -> None:
    from fp8select.cli import main

    assert main(["explain", "--layer", "256,384", "--layer", "7168x2048"]) == 0
    out = capsys.readouterr().out
    assert "plan for N=256, K=384, block [128, 128]" in out and "plan for N=7168, K=2048" in out
    assert re.search(r"any M +(reference|triton) +rule", out)  # no measurements on a CPU: the priority order
    assert main(["explain", "--json", "--layer", "256,384"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len({r["backend"] for r in data["plans"][0]["routes"]}) == 1 and len(data["plans"][0]["routes"]) == 14
    assert main(["explain", "--layer", "0,5"]) == 2
    assert "--layer '0,5': expected N,K" in capsys.readouterr().err


def test_explain_says_which_buckets_a_shape_no_table_holds_measures_at_load(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """On the H200 (a snapshot) with a writable cache directory: a shape of the shipped table is a table hit;
    one no table holds is measured first where the estimates are close, and explain says where."""
    from fp8select.cli import main

    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    snapshot = json.loads((results / "regret_vendors_unseen_model.json").read_text())["capabilities"]
    snapshot["env"] = {"FP8SELECT_CACHE_DIR": str(tmp_path / "cache")}
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(snapshot))
    assert main(["explain", "--capabilities", str(path), "--no-plugins", "--layer", "7168,2048", "--layer", "6144,3072"]) == 0
    out = capsys.readouterr().out
    assert "load-time measurement: on" in out and out.count("prepare() measures this shape first") == 1
    assert main(["explain", "--capabilities", str(path), "--no-plugins", "--json", "--layer", "7168,2048",
                 "--layer", "6144,3072"]) == 0
    held, unseen = (plan["measured_at_load"] for plan in json.loads(capsys.readouterr().out)["plans"])
    assert held == [] and unseen and set(unseen) <= {2 ** i for i in range(14)}
