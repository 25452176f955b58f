"""fp8select.kernels.gluon_gemm and .gluon_swap compiled for sm90 on the CPU host (no GPU: the interpreter
cannot run Gluon).

What makes the kernel faster than the ``tl.dot`` tile kernel is the shape of its K loop in the
machine code: one K block's ``wgmma`` left in flight while the previous block is scaled
(``wgmma.wait_group 1``), and nothing that makes ptxas serialise the MMAs (a register copy of an
accumulator whose MMA is in flight: ptxas then reports "wgmma.mma_async instructions are
serialized" and inserts a wait) or spill. Those are checked here for the tiles the search ranks;
the numbers come from the H200 (``tests/test_kernels_gpu.py``). The swap-AB decode kernel's point
is the order of its first instructions: the weight's ring filled by TMA before it waits for the
quantizer (``griddepcontrol.wait``), the activation after. The compiler runs in a child process:
Gluon does not compile in a process that another test module put in interpreter mode.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TILES = [(64, 128, 4, 4, True), (128, 128, 8, 4, True), (128, 64, 4, 4, True), (64, 64, 4, 6, True),
         (64, 64, 4, 4, False)]
SWAP_TILES = [(16, 64, 4, 8, True), (16, 128, 8, 4, True), (16, 128, 4, 6, False), (64, 128, 4, 3, True)]
"""(BLOCK_M tokens, BLOCK_N weight rows, warps, stages, 128x128 weight scales) of the swap-AB kernel."""


def _desc(name: str, dtype: object, block: list[int]) -> str:
    from triton.experimental.gluon import language as gl

    return f"tensordesc<{name}{block},{gl.NVMMASharedLayout.get_default_for(block, dtype)!r}>"


def _compile(kernel: object, signature: dict[str, str], constants: dict[str, object], warps: int) -> tuple[str, int]:
    """PTX and shared-memory bytes of a Gluon kernel compiled for sm90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(signature) + list(constants)
    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    src = GluonASTSource(kernel, signature, {(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return compiled.asm["ptx"], compiled.metadata.shared


def _compile_sm90(block_m: int, block_n: int, warps: int, stages: int, scalar: bool) -> tuple[str, int]:
    """PTX and shared-memory bytes of the kernel for sm90 with a bf16 output tile; 128x128 weight scales
    when ``scalar``."""
    from triton.experimental.gluon import language as gl

    from fp8select.kernels import gluon_gemm

    signature = {
        "a_desc": _desc("fp8e4nv", gl.float8e4nv, [block_m, 128]), "as_ptr": "*fp32",
        "b_desc": _desc("fp8e4nv", gl.float8e4nv, [block_n, 128]), "bs_ptr": "*fp32", "bias_ptr": "*bf16",
        "c_desc": _desc("bf16", gl.bfloat16, [block_m, block_n]),
        **dict.fromkeys(("M", "N", "K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "stride_bias"), "i32"),
    }
    constants = {"SCALE_BN": 128 if scalar else 1, "B_SCALE_SCALAR": scalar, "HAS_BIAS": True, "GROUP_M": 8,
                 "STAGES": stages, "num_warps": warps}
    return _compile(gluon_gemm._wgmma_block_kernel, signature, constants, warps)


def _compile_swap_sm90(block_m: int, block_n: int, warps: int, stages: int, scalar: bool) -> tuple[str, int]:
    """PTX and shared-memory bytes of the swap-AB kernel for sm90: bf16 output, split-K summed by the last
    program, PDL."""
    from triton.experimental.gluon import language as gl

    from fp8select.kernels import gluon_swap

    signature = {
        "a_desc": _desc("fp8e4nv", gl.float8e4nv, [block_m, 128]), "as_ptr": "*fp32",
        "b_desc": _desc("fp8e4nv", gl.float8e4nv, [block_n, 128]), "bs_ptr": "*fp32", "bias_ptr": "*bf16",
        "c_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
        **dict.fromkeys(("M", "N", "K", "SPLIT_K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk",
                         "stride_bias", "stride_cm", "stride_cn"), "i32"),
    }
    constants = {"SCALE_BN": 128 if scalar else 1, "B_SCALE_SCALAR": scalar, "IS_SPLIT": True, "FIXUP": True,
                 "HAS_BIAS": True, "PDL": True, "STAGES": stages, "num_warps": warps}
    return _compile(gluon_swap._swap_kernel, signature, constants, warps)


@pytest.fixture(scope="module")
def ptx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every tile of :data:`TILES` compiled (in one child process) into ``<tile>.ptx``."""
    triton = pytest.importorskip("triton")
    from packaging.version import Version

    from fp8select.kernels.triton_gemm import WGMMA_TRITON

    low, high = WGMMA_TRITON
    if not low <= Version(triton.__version__).release[:2] < high:
        pytest.skip(f"the wgmma path does not run its kernel with Triton {triton.__version__}")
    out = tmp_path_factory.mktemp("ptx")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, __file__, str(out)], env=env, check=True, capture_output=True, timeout=300)
    return out


def _name(tile: tuple[int, int, int, int, bool], kernel: str = "wgmma") -> str:
    return kernel + "_" + "_".join(str(int(v)) for v in tile)


def _ptxas_report(path: Path) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(path.with_suffix(".cubin"))],
                          capture_output=True, text=True, check=True).stderr


@pytest.mark.parametrize("tile", TILES, ids=_name)
def test_the_scaling_runs_under_the_next_mma_without_serialising_or_spilling(
        ptx_dir: Path, tile: tuple[int, int, int, int, bool]) -> None:
    path = ptx_dir / f"{_name(tile)}.ptx"
    ptx = path.read_text()
    assert "wgmma.wait_group.sync.aligned 1;" in ptx  # one MMA in flight during the scaling
    loop = ptx[ptx.index("// =>This Inner Loop Header"):]
    assert loop.count("wgmma.commit_group.sync.aligned") >= 2  # two K blocks per iteration
    report = _ptxas_report(path)
    assert "serialized" not in report and "warpgroup.wait is injected" not in report, report
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", report), report


@pytest.mark.parametrize("tile", TILES, ids=_name)
def test_shared_memory_is_what_the_search_budgets(ptx_dir: Path, tile: tuple[int, int, int, int, bool]) -> None:
    """The operands' ring and the pipeline's barriers: the output tile reuses the ring, as
    :func:`fp8select.kernels.triton_search.smem_bytes` assumes when it keeps configurations within
    the 227 KB a program may have."""
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.kernels.triton_search import smem_bytes

    block_m, block_n, warps, stages, _ = tile
    cfg = TritonConfig(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=warps,
                       num_stages=stages, path="wgmma", FIXUP=0, TMA=1)
    shared = int((ptx_dir / f"{_name(tile)}.shared").read_text())
    assert 0 <= shared - smem_bytes(cfg) <= 8 * stages + 16  # one 8-byte barrier per slot, aligned


@pytest.mark.parametrize("tile", SWAP_TILES, ids=lambda tile: _name(tile, "swap"))
def test_the_swap_kernel_streams_its_weight_before_waiting_for_the_quantizer(
        ptx_dir: Path, tile: tuple[int, int, int, int, bool]) -> None:
    path = ptx_dir / f"{_name(tile, 'swap')}.ptx"
    ptx = path.read_text()
    stages = tile[3]
    before, after = ptx.split("griddepcontrol.wait;", 1)
    assert "griddepcontrol.launch_dependents;" in after
    # Only the weight's blocks before the wait: one TMA copy per slot; the activation's after it.
    assert before.count("cp.async.bulk.tensor") == stages
    head = after[:after.index("// =>This Inner Loop Header")]
    assert head.count("cp.async.bulk.tensor") == stages
    assert "ld.global" not in before  # the scales (the quantizer's output) are read after the wait
    report = _ptxas_report(path)
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", report), report


@pytest.mark.parametrize("tile", SWAP_TILES, ids=lambda tile: _name(tile, "swap"))
def test_the_swap_kernels_shared_memory_is_what_the_search_budgets(ptx_dir: Path,
                                                                   tile: tuple[int, int, int, int, bool]) -> None:
    from fp8select.kernels.triton_config import TritonConfig
    from fp8select.kernels.triton_search import smem_bytes

    block_m, block_n, warps, stages, _ = tile
    cfg = TritonConfig(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, GROUP_M=8, SPLIT_K=4, num_warps=warps,
                       num_stages=stages, path="wgmma-swap", FIXUP=1, TMA=1)
    shared = int((ptx_dir / f"{_name(tile, 'swap')}.shared").read_text())
    assert 0 <= shared - smem_bytes(cfg) <= 8 * stages + 16


if __name__ == "__main__":  # the child process of ``ptx_dir``
    for kernel, tiles, compile_ in (("wgmma", TILES, _compile_sm90), ("swap", SWAP_TILES, _compile_swap_sm90)):
        for tile in tiles:
            ptx, shared = compile_(*tile)
            (Path(sys.argv[1]) / f"{_name(tile, kernel)}.ptx").write_text(ptx)
            (Path(sys.argv[1]) / f"{_name(tile, kernel)}.shared").write_text(str(shared))
