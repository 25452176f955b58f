"""fp8select.kernels.gluon_gemm and gluon_moe compiled for sm90 on the CPU host (no GPU: the interpreter cannot run Gluon).

What makes the kernel faster than the ``tl.dot`` tile kernel is the shape of its K loop in the
machine code: one K block's ``wgmma`` left in flight while the previous block is scaled
(``wgmma.wait_group 1``), and nothing that makes ptxas serialise the MMAs (a register copy of an
accumulator whose MMA is in flight: ptxas then reports "wgmma.mma_async instructions are
serialized" and inserts a wait) or spill. Those are checked here for the tiles the search ranks;
the numbers come from the H200 (``tests/test_kernels_gpu.py``). The compiler runs in a child
process: Gluon does not compile in a process that another test module put in interpreter mode.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TILES = [(64, 128, 4, 4, True), (128, 128, 8, 4, True), (128, 64, 4, 4, True), (64, 64, 4, 6, True),
         (64, 64, 4, 4, False)]
GROUPED_TILES = [(64, 128, 4, 4, True, "fp32"), (128, 128, 8, 4, True, "fp32"), (128, 128, 8, 4, True, "bf16"),
                 (64, 256, 8, 4, False, "bf16")]
"""The MoE experts' grouped launches (:func:`fp8select.kernels.gluon_moe.launch_grouped`): the gate-up's
fp32 output and the down GEMM's bf16 one, at the tiles ``tune --moe`` times (64 x 256: two warpgroups side
by side, one weight scale each)."""
PERSISTENT_TILES = [(128, 128, 8, 4, "fp32"), (128, 128, 8, 5, "fp32"), (128, 128, 8, 4, "bf16"),
                    (64, 256, 8, 4, "fp32"), (64, 256, 8, 4, "bf16"), ("gate_up", 3)]
"""The persistent programs (:func:`fp8select.kernels.gluon_moe._persistent_kernel`) at the tiles ``tune --moe``
times (``PERSISTENT`` 1): both GEMMs of the plain structure (fp32 gate-up, bf16 down) and the fused gate-up."""
GATE_UP_STAGES = (3, 4)
"""The fused gate-up (:func:`fp8select.kernels.gluon_moe.launch_gate_up`, 64 rows, 8 warps) at the depths
``tune --moe`` times."""


def _desc(name: str, block: list[int]) -> str:
    """The signature of a TMA descriptor of Gluon dtype ``name`` over ``block``, in its default layout."""
    from triton.experimental.gluon import language as gl

    dtype = {"fp8e4nv": gl.float8e4nv, "bf16": gl.bfloat16, "fp32": gl.float32}[name]
    return f"tensordesc<{name}{block},{gl.NVMMASharedLayout.get_default_for(block, dtype)!r}>"


def _compiled(kernel: object, signature: dict[str, str], constants: dict[str, object]) -> object:
    """``kernel`` compiled for sm90 with ``signature``'s runtime arguments and ``constants`` (``num_warps`` among them)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(signature) + list(constants)
    src = GluonASTSource(kernel, {**signature, **dict.fromkeys(constants, "constexpr")},
                         {(names.index(name),): value for name, value in constants.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": constants["num_warps"]})


def _compile_sm90(block_m: int, block_n: int, warps: int, stages: int, scalar: bool, out: str = "bf16",
                  grouped: bool = False) -> tuple[str, int]:
    """PTX and shared-memory bytes of the kernel for sm90 with an ``out`` output tile; 128x128 weight scales
    when ``scalar``; ``grouped``: the MoE experts' launch (a row block's expert offsets B)."""
    from fp8select.kernels import gluon_gemm

    signature = {
        "a_desc": _desc("fp8e4nv", [block_m, 128]), "as_ptr": "*fp32",
        "b_desc": _desc("fp8e4nv", [block_n, 128]), "bs_ptr": "*fp32", "bias_ptr": "*bf16",
        "c_desc": _desc(out, [block_m, block_n]),
        **dict.fromkeys(("M", "N", "K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "stride_bias"), "i32"),
        "be_ptr": "*i32", "stride_bse": "i32",
    }
    constants = {"SCALE_BN": 128 if scalar else 1, "B_SCALE_SCALAR": scalar, "HAS_BIAS": not grouped, "GROUP_M": 8,
                 "STAGES": stages, "num_warps": warps, "GROUPED": grouped}
    kernel: Any = _compiled(gluon_gemm._wgmma_block_kernel, signature, constants)
    return kernel.asm["ptx"], kernel.metadata.shared


def _compile_gate_up_sm90(stages: int, warps: int | None = None) -> str:
    """PTX of the fused gate-up kernel for sm90 (e4m3 weights and output, 64-row tiles), as
    :func:`~fp8select.kernels.gluon_moe.launch_gate_up` launches it (``warps``: another warp count)."""
    import torch

    from fp8select.kernels import gluon_moe
    from fp8select.kernels.triton_quant import fp8_constexprs

    signature = {"a_desc": _desc("fp8e4nv", [64, 128]), "as_ptr": "*fp32", "b_desc": _desc("fp8e4nv", [128, 128]),
                 "bs_ptr": "*fp32", "q_desc": _desc("fp8e4nv", [64, 128]), "qs_ptr": "*fp32", "be_ptr": "*i32",
                 **dict.fromkeys(("M", "INTER", "K", "stride_asm", "stride_ask", "stride_bse", "stride_bsn", "stride_bsk",
                                  "stride_qsm"), "i32"), "eps": "fp32"}
    constants = {"GROUP_M": 8, "STAGES": stages, "num_warps": warps or gluon_moe.GATE_UP_WARPS,
                 **fp8_constexprs(torch.float8_e4m3fn), "HW_RNE": True}
    kernel: Any = _compiled(gluon_moe._wgmma_gate_up_kernel, signature, constants)
    return str(kernel.asm["ptx"])


def _compile_persistent_sm90(tile: tuple[Any, ...]) -> tuple[str, int]:
    """PTX and shared-memory bytes of the persistent kernel for sm90 at a tile of :data:`PERSISTENT_TILES`
    (``(block_m, block_n, warps, stages, out)``, or ``("gate_up", stages)``), as the launches compile it."""
    import torch

    from fp8select.kernels import gluon_moe
    from fp8select.kernels.triton_quant import fp8_constexprs

    gate_up = tile[0] == "gate_up"
    if gate_up:
        block_m, block_n, warps, stages, out = 64, 128, gluon_moe.GATE_UP_WARPS, tile[1], "fp8e4nv"
    else:
        block_m, block_n, warps, stages, out = tile
    signature = {"a_desc": _desc("fp8e4nv", [block_m, 128]), "as_ptr": "*fp32", "b_desc": _desc("fp8e4nv", [block_n, 128]),
                 "bs_ptr": "*fp32", "c_desc": _desc(out, [block_m, block_n]), "qs_ptr": "*fp32", "be_ptr": "*i32",
                 **dict.fromkeys(("M", "N", "K", "stride_asm", "stride_ask", "stride_bse", "stride_bsn", "stride_bsk",
                                  "stride_qsm"), "i32"), "eps": "fp32"}
    constants: dict[str, object] = {"GROUP_M": 8, "STAGES": stages, "num_warps": warps, "GATE_UP": gate_up,
                                    **fp8_constexprs(torch.float8_e4m3fn), "HW_RNE": True}
    kernel: Any = _compiled(gluon_moe._persistent_kernel, signature, constants)
    return kernel.asm["ptx"], kernel.metadata.shared


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


def _name(tile: tuple[int | bool | str, ...]) -> str:
    return "_".join(v if isinstance(v, str) else str(int(v)) for v in tile)


@pytest.mark.parametrize("tile", TILES + GROUPED_TILES + [("gate_up", s) for s in GATE_UP_STAGES]
                         + [("persistent", *t) for t in PERSISTENT_TILES], ids=_name)
def test_the_scaling_runs_under_the_next_mma_without_serialising_or_spilling(
        ptx_dir: Path, tile: tuple[int | bool | str, ...]) -> None:
    from triton.backends.nvidia.compiler import get_ptxas

    path = ptx_dir / f"{_name(tile)}.ptx"
    ptx = path.read_text()
    assert "wgmma.wait_group.sync.aligned 1;" in ptx  # one MMA in flight during the scaling
    loop = ptx[ptx.index("// =>This Inner Loop Header"):]
    assert loop.count("wgmma.commit_group.sync.aligned") >= 2  # two K blocks per iteration
    report = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(path.with_suffix(".cubin"))],
                            capture_output=True, text=True, check=True).stderr
    assert "serialized" not in report and "warpgroup.wait is injected" not in report, report
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", report), report


@pytest.mark.parametrize("tile", PERSISTENT_TILES, ids=_name)
def test_persistent_programs_fit_the_shared_memory_a_program_may_have(ptx_dir: Path, tile: tuple[int | str, ...]) -> None:
    """The ring, the output tile (and the fused gate-up's exchange of gate and up) live at once: within the
    227 KB of an sm90 block at every tile ``tune --moe`` times; the fused gate-up's 4 stages would not be
    (which is why its configurations stop at 3)."""
    assert int((ptx_dir / f"{_name(('persistent', *tile))}.shared").read_text()) <= 227 * 1024
    assert int((ptx_dir / "persistent_gate_up_4.shared").read_text()) > 227 * 1024


def test_the_fused_gate_up_compiles_only_on_the_warps_its_halves_need(ptx_dir: Path) -> None:
    """Its K loop gives each of two warpgroups one half (gate, up) of 64 rows: on 4 warps it would not compile
    the two halves but fail, and it says why."""
    assert "GATE_UP: 64 rows on 8 warps" in (ptx_dir / "gate_up_4_warps.error").read_text()


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


if __name__ == "__main__":  # the child process of ``ptx_dir``
    for tile in TILES:
        ptx, shared = _compile_sm90(*tile)
        (Path(sys.argv[1]) / f"{_name(tile)}.ptx").write_text(ptx)
        (Path(sys.argv[1]) / f"{_name(tile)}.shared").write_text(str(shared))
    for block_m, block_n, warps, stages, scalar, out in GROUPED_TILES:
        ptx, _ = _compile_sm90(block_m, block_n, warps, stages, scalar, out, grouped=True)
        (Path(sys.argv[1]) / f"{_name((block_m, block_n, warps, stages, scalar, out))}.ptx").write_text(ptx)
    for stages in GATE_UP_STAGES:
        (Path(sys.argv[1]) / f"{_name(('gate_up', stages))}.ptx").write_text(_compile_gate_up_sm90(stages))
    for persistent in [*PERSISTENT_TILES, ("gate_up", 4)]:
        ptx, shared = _compile_persistent_sm90(persistent)
        (Path(sys.argv[1]) / f"{_name(('persistent', *persistent))}.ptx").write_text(ptx)
        (Path(sys.argv[1]) / f"{_name(('persistent', *persistent))}.shared").write_text(str(shared))
    try:
        _compile_gate_up_sm90(GATE_UP_STAGES[0], warps=4)
        error = "compiled"
    except Exception as e:  # noqa: BLE001 - the compiler's errors, whatever their class, are the record
        chain: BaseException | None = e
        error = ""
        while chain is not None:  # the static assert's message is the cause of the call site's error
            error, chain = error + f"{type(chain).__name__}: {chain}\n", chain.__cause__
    (Path(sys.argv[1]) / "gate_up_4_warps.error").write_text(error)
