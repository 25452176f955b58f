"""``explain``'s MoE section and ``--moe E,H,I,k`` plans (text and JSON), on replayed snapshots."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from matrix import MATRIX

from fp8select.cli import main
from fp8select.measured.table import backend_versions, new_table

DG_MOE = dataclasses.replace(MATRIX["h200-deepgemm"][0], package_symbols={
    "deep_gemm": ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked")})


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["explain", "--no-plugins", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def h200(tmp_path: Path) -> Path:
    path = tmp_path / "h200.json"
    path.write_text(DG_MOE.to_json())
    return path


def test_explain_lists_every_moe_backend_with_its_verdict(capsys: pytest.CaptureFixture[str], h200: Path) -> None:
    code, out, _ = run(capsys, "--capabilities", str(h200))
    assert code == 0
    section = out[out.index("MoE experts backends"):]
    rows = {line.split()[1]: line for line in section.splitlines() if line[:4].strip().isdigit()}
    assert set(rows) == {"deepgemm", "cutlass", "flashinfer", "cuda-scaled-grouped-mm", "aiter", "npu", "triton",
                         "reference"}
    assert "requires device rocm, found cuda" in rows["aiter"] and "requires device npu, found cuda" in rows["npu"]
    assert "rejected" in rows["cutlass"] and "sgl_kernel" in rows["cutlass"]
    assert " ok " in rows["deepgemm"] and "contiguous/masked" in rows["deepgemm"]
    assert "rejected" in rows["cuda-scaled-grouped-mm"] and "functional" in rows["cuda-scaled-grouped-mm"].lower()
    assert "MoE chain: deepgemm -> triton -> reference" in section
    # the shipped H200 table's MoE rows, at versions this snapshot does not have: listed, not used
    assert "MoE measurements: " in section and "deepgemm/masked: 5 MoE shapes measured, other versions" in section
    code, out, _ = run(capsys)  # this machine (a CPU): DeepGEMM rejected, saying why
    assert code == 0 and "requires device cuda, found cpu" in out[out.index("MoE experts backends"):]


def test_explain_moe_prints_a_plan_per_m_range_with_the_reason(capsys: pytest.CaptureFixture[str], h200: Path) -> None:
    # E=16: a shape the shipped table does not hold, so its plan is modelled from the shapes it holds
    code, out, _ = run(capsys, "--capabilities", str(h200), "--moe", "16,7168,2048,8", "--moe", "8,7168,200,8")
    assert code == 0
    plan = out[out.index("MoE plan for E=16, H=7168, I=2048, k=8"):out.index("MoE plan for E=8")]
    routes = plan.splitlines()[1:-1]
    assert routes and all(" model " in line for line in routes), plan
    # the nearest measured shapes (same experts, 8 and 32 of them) carry most of the weight and are named
    assert "from 5 measured shapes E,H,I,k (8,7168,2048,8 42%, 32,7168,2048,8 42%" in routes[0]
    odd = out[out.index("MoE plan for E=8, H=7168, I=200"):]
    assert "triton/sorted" in odd and "not for this layer: deepgemm: requires I % 128 == 0" in odd
    code, out, _ = run(capsys, "--capabilities", str(h200), "--moe", "16,7168,2048,8", "--json")
    data = json.loads(out)["moe"]
    assert data["chain"] == ["deepgemm", "triton", "reference"]
    assert {r["why"] for r in data["plans"][0]["routes"]} == {"model"}
    # a device no table holds: the rule
    code, out, _ = run(capsys, "--capabilities", str(h200), "--set", "device_name=NVIDIA H100 PCIe",
                       "--moe", "16,7168,2048,8")
    assert code == 0 and "MoE measurements: none for this device" in out
    assert "M 1-64         deepgemm/masked            rule" in out
    assert "M >= 65        deepgemm/contiguous        rule" in out
    code, out, _ = run(capsys, "--capabilities", str(h200), "--set", "device_name=NVIDIA H100 PCIe",
                       "--moe", "16,7168,2048,8", "--json")
    routes = json.loads(out)["moe"]["plans"][0]["routes"]
    assert [r["layout"] for r in routes[:7]] == ["masked"] * 7 and routes[7]["layout"] == "contiguous"
    assert {r["why"] for r in routes} == {"rule"}


def test_an_h100_sxm_plans_moe_layers_from_its_shipped_rows(capsys: pytest.CaptureFixture[str], h200: Path) -> None:
    """The H100 SXM's table holds MoE rows only (every route of the five shapes at M 1-8192 but 2 and 8): a shipped
    shape's plan is measured where a row is, modelled from the buckets on either side where none is (M 2 and
    5-8); another shape's is modelled from them; the dense layers still follow the priority order, and explain
    says their tables hold no dense rows."""
    h100 = ("--capabilities", str(h200), "--set", "device_name=NVIDIA H100 80GB HBM3")
    code, out, _ = run(capsys, *h100, "--moe", "deepseek-v3-e32", "--moe", "16,7168,2048,8", "--layer", "7168,2048")
    assert code == 0
    assert "measurements: none for this device (its tables hold MoE rows only: " in out
    assert "tuning-nvidia-h100-80gb-hbm3.json), so plans follow the priority order" in out
    assert "MoE measurements: " in out and "tuning-nvidia-h100-80gb-hbm3.json" in out
    shipped = out[out.index("MoE plan for E=32, H=7168, I=2048, k=8"):out.index("MoE plan for E=16")]
    assert "M 1            triton/sorted              measured" in shipped  # 1.08x DeepGEMM masked's time
    assert "M 2            triton/sorted              model" in shipped and "at M 1 and 4 (none measured at M 2)" in shipped
    assert "M 5-8          triton/sorted              model" in shipped and "at M 4 and 16 (none measured at M 8)" in shipped
    modelled = out[out.index("MoE plan for E=16"):]
    assert " model " in modelled and "from 5 measured shapes E,H,I,k (8,7168,2048,8" in modelled


def test_explain_moe_reads_the_tables_moe_rows(capsys: pytest.CaptureFixture[str], h200: Path, tmp_path: Path) -> None:
    table = new_table(DG_MOE.device_name or "")
    triton = {"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4, "QUANT_IN_KERNEL": 1}
    # at this snapshot's versions, so these rows win over the shipped table's (measured at other versions)
    versions = backend_versions(DG_MOE)
    table["moe"] = [{"backend": "triton", "layout": "sorted", "versions": versions,
                     "shapes": {"32,7168,2048,8": {"1": {"us": 50.0, "config": triton}, "2": {"us": 90.0, "config": triton}}}},
                    {"backend": "deepgemm", "layout": "masked", "versions": backend_versions(DG_MOE, ["deep_gemm"]),
                     "shapes": {"32,7168,2048,8": {"1": {"us": 60.0}, "2": {"us": 61.0}}}}]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    code, out, _ = run(capsys, "--capabilities", str(h200), "--set", f"env.FP8SELECT_TUNING_TABLE={path}",
                       "--moe", "deepseek-v3-e32")
    assert code == 0
    assert "triton/sorted: 1 MoE shapes measured, installed versions" in out
    plan = out[out.index("MoE plan for"):]
    assert "M 1            triton/sorted              measured  [moe 16x128 w4 s4 qk] measured 50.0 us" in plan
    assert "M 2            deepgemm/masked            measured" in plan
    # M 3 on: only the shipped table's rows (other versions) of a route this table does not hold
    assert "M >= 3         deepgemm/contiguous        measured" in plan


def test_an_explicit_choice_runs_every_bucket(capsys: pytest.CaptureFixture[str], h200: Path) -> None:
    code, out, _ = run(capsys, "--capabilities", str(h200), "--backend", "triton", "--moe", "4,256,128,2")
    assert code == 0 and "MoE plan for E=4, H=256, I=128, k=2 (explicit choice: triton)" in out
    routes = out[out.index("MoE plan for"):].splitlines()[1:]
    assert routes and all("triton/sorted" in line and " explicit " in line for line in routes)


@pytest.mark.parametrize("text", ["1,2,3", "a,b,c,d", "4,256,128,8", "deepseek-v4", "0,256,128,2"])
def test_malformed_moe_shapes_get_one_line(capsys: pytest.CaptureFixture[str], text: str) -> None:
    code, out, err = run(capsys, "--moe", text)
    assert code == 2 and out == "" and err.startswith("fp8select: error: --moe") and len(err.splitlines()) == 1


def test_no_moe_backend_is_an_error_with_every_verdict(capsys: pytest.CaptureFixture[str], h200: Path) -> None:
    off = ("--capabilities", str(h200), "--disable", "reference,triton,deepgemm")
    code, out, err = run(capsys, *off, "--moe", "4,256,128,2")
    assert code == 1 and "MoE experts layers" in err and "disabled" in err
    code, out, _ = run(capsys, *off)
    assert code == 0 and "MoE chain: none" in out


def test_explain_batch_invariant_says_which_moe_routes_qualify(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """At the shipped H200 records' versions each MoE route says whether its record qualifies it (masked:
    measured to M 2048 only), and the plan runs one qualifying route for every M, saying so."""
    caps = dataclasses.replace(DG_MOE, packages={**DG_MOE.packages, "deep_gemm": "2.6.1", "triton": "3.6.0"})
    path = tmp_path / "h200.json"
    path.write_text(caps.to_json())
    code, out, _ = run(capsys, "--capabilities", str(path), "--batch-invariant", "--moe", "deepseek-v3-e32")
    assert code == 0
    section = out[out.index("MoE batch-invariance"):]
    assert "deepgemm/contiguous: deepgemm/contiguous measured batch-invariant at M 1-8192" in section
    assert "deepgemm/masked: not used: measured invariant only at M 1-2048" in section
    assert "reference/sorted: not used: invariant by construction, but the pure-torch path" in section
    plan = section[section.index("MoE plan for E=32, H=7168, I=2048, k=8"):]
    assert "batch-invariant: a token's output depends only on that token" in plan
    assert "any M " in plan and "invariant one kernel for every M" in plan
    code, out, _ = run(capsys, "--capabilities", str(path), "--batch-invariant", "--moe", "deepseek-v3-e32", "--json")
    routes = json.loads(out)["moe"]["plans"][0]["routes"]
    assert len({(r["backend"], r["layout"], json.dumps(r["config"])) for r in routes}) == 1
    assert {r["why"] for r in routes} == {"invariant"}


@pytest.mark.parametrize(("snapshot", "backend", "layout", "chain"), [
    ("mi300x-aiter", "aiter", "fused", "aiter -> triton -> reference"),
    ("ascend-950-npu-moe", "npu", "grouped", "npu -> reference"),
])
def test_explain_moe_lists_the_platform_backends(capsys: pytest.CaptureFixture[str], tmp_path: Path, snapshot: str,
                                                 backend: str, layout: str, chain: str) -> None:
    """AITER's fused MoE on an MI300X and torch_npu's grouped GEMM on an Ascend A5 (each opted in by its
    snapshot's environment): accepted, first in the MoE chain, and planned."""
    path = tmp_path / "caps.json"
    path.write_text(MATRIX[snapshot][0].to_json())
    assert main(["explain", "--no-plugins", "--capabilities", str(path), "--moe", "32,7168,2048,8"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("MoE experts backends"):]
    row = next(line for line in section.splitlines() if line[:4].strip().isdigit() and line.split()[1] == backend)
    assert " ok " in row and layout in row
    assert f"MoE chain: {chain}" in section
    assert f"{backend}/{layout}" in out[out.index("MoE plan for E=32"):]
