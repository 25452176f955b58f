"""fp8select's Triton MoE grouped GEMM compiled for sm90 on the CPU host (no GPU; the interpreter cannot say).

What ``SWAP_AB`` is for shows in the machine code: at decode's 16- and 32-row tiles the normal orientation
multiplies on the older ``mma.sync`` path, the transposed tile (the weight's rows on the MMA's wide side) on
``wgmma``. With ``PDL`` the kernel, and the fused gate-up, asks L2 for its weights before it waits for the
previous launch. The compiler runs in a child process, outside the interpreter mode other test modules set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TILES = [(16, 128), (16, 64), (32, 128)]


def _compile() -> dict[str, dict[str, bool]]:
    import torch

    from fp8select.kernels import moe_triton_kernels as kernels
    from fp8select.kernels.moe_triton import PREFETCH_K
    from fp8select.kernels.triton_quant import fp8_constexprs

    gemm = {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "slot_ids_ptr": "*i32",
            "block_expert_ptr": "*i32", "out_ptr": "*bf16",
            **dict.fromkeys(("slots", "num_blocks", "N", "K", "stride_am", "stride_asm", "stride_ask", "stride_we",
                             "stride_wn", "stride_wse", "stride_wsn", "stride_om"), "i32")}
    out = {}
    for swap, pdl in ((False, False), (True, False), (True, True)):
        for block_m, block_n in TILES:
            constants = {"A_ROWS": 0, "OUT_SORTED": False, "BLOCK_M": block_m, "BLOCK_N": block_n, "GROUP_M": 8,
                         "TOP_K": 1, "SWAP_AB": swap, "PDL": pdl, "PREFETCH_K": PREFETCH_K if pdl else 0}
            out[f"{int(swap)}_{block_m}_{block_n}{'_pdl' if pdl else ''}"] = _facts(
                _ptx(kernels._grouped_gemm_kernel, gemm, constants, stages=4))
    # the fused gate-up on the transposed 16-row tile, without and with PDL
    gate_up = {"x_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "slot_ids_ptr": "*i32",
               "block_expert_ptr": "*i32", "q_ptr": "*fp8e4nv", "qs_ptr": "*fp32",
               **dict.fromkeys(("slots", "num_blocks", "H", "INTER", "stride_xm", "stride_xsm", "stride_we", "stride_wn",
                                "stride_wse", "stride_wsn", "stride_qm", "stride_qsm"), "i32"), "eps": "fp32"}
    for pdl in (False, True):
        constants = {"TOP_K": 8, "QUANT_IN_KERNEL": False, "BLOCK_M": 16, "GROUP_M": 8, "SWAP_AB": True, "PDL": pdl,
                     "PREFETCH_K": PREFETCH_K if pdl else 0, **fp8_constexprs(torch.float8_e4m3fn), "HW_RNE": True}
        out[f"gate_up{'_pdl' if pdl else ''}"] = _facts(_ptx(kernels._gate_up_kernel, gate_up, constants, stages=3))
    return out


def _ptx(fn: object, arguments: dict[str, str], constants: dict[str, object], stages: int) -> str:
    """``fn`` compiled for sm90 with 4 warps: its runtime ``arguments``' types and its ``constants``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)  # type: ignore[attr-defined]
    src = ASTSource(fn, {**arguments, **dict.fromkeys(constants, "constexpr")},
                    {(names.index(n),): v for n, v in constants.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": stages}).asm["ptx"]


def _facts(ptx: str) -> dict[str, bool]:
    return {"wgmma": "wgmma.mma_async" in ptx, "mma_sync": "mma.sync" in ptx,
            "prefetches": ptx.count("prefetch.global.L2"), "waits": "griddepcontrol.wait" in ptx,
            "launches_dependents": "griddepcontrol.launch_dependents" in ptx,
            "prefetch_before_wait": 0 <= ptx.find("prefetch.global.L2") < ptx.find("griddepcontrol.wait")}


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, bool]]:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], env=env, check=True, capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("block_m", "block_n"), TILES)
def test_decode_tiles_multiply_on_wgmma_only_when_transposed(compiled: dict[str, dict[str, bool]], block_m: int,
                                                             block_n: int) -> None:
    assert {k: compiled[f"0_{block_m}_{block_n}"][k] for k in ("wgmma", "mma_sync")} == {"wgmma": False, "mma_sync": True}
    assert {k: compiled[f"1_{block_m}_{block_n}"][k] for k in ("wgmma", "mma_sync")} == {"wgmma": True, "mma_sync": False}


@pytest.mark.parametrize(("block_m", "block_n"), TILES)
def test_a_pdl_launch_asks_l2_for_its_weights_before_it_waits(compiled: dict[str, dict[str, bool]], block_m: int,
                                                               block_n: int) -> None:
    plain, pdl = compiled[f"1_{block_m}_{block_n}"], compiled[f"1_{block_m}_{block_n}_pdl"]
    assert (plain["prefetches"], plain["waits"], plain["launches_dependents"]) == (0, False, False)
    assert pdl["waits"] and pdl["launches_dependents"] and pdl["prefetch_before_wait"]
    assert pdl["prefetches"] >= 1
    assert pdl["wgmma"] and not pdl["mma_sync"]


def test_the_fused_gate_up_with_pdl_asks_l2_for_gate_and_up_rows_before_it_waits(
        compiled: dict[str, dict[str, bool]]) -> None:
    plain, pdl = compiled["gate_up"], compiled["gate_up_pdl"]
    assert (plain["prefetches"], plain["waits"], plain["launches_dependents"]) == (0, False, False)
    assert pdl["waits"] and pdl["launches_dependents"] and pdl["prefetch_before_wait"]
    assert pdl["prefetches"] >= 2  # the gate rows and the up rows
    assert pdl["wgmma"] and plain["wgmma"] and not pdl["mma_sync"]


if __name__ == "__main__":  # the child process of ``compiled``
    print(json.dumps(_compile()))
