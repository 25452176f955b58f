"""``python -m fp8select probe`` / ``explain``: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from matrix import MATRIX

from fp8select import Capabilities
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
    proc = subprocess.run([sys.executable, "-m", "fp8select", "explain", "--no-plugins", "--set", "device_kind=tpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "device_kind" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "fp8select", "explain", "--no-plugins"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "reference" in proc.stdout
