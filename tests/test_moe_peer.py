"""benchmarks/moe_peer.py on CPU: its configuration lookup and arguments (no peer needed), and, where the peer has
been fetched into ``.peer/vllm_fused_moe`` (docs/moe.md; never committed), its glue around vLLM's kernel under
the Triton interpreter.

``TRITON_INTERPRET=1`` is set before triton is first imported (see tests/test_moe_triton.py). The interpreter
rounds fp32 -> bf16 by truncation; the peer path rounds twice per slot to bf16 (its GEMMs write bf16 gate/up
and bf16 weighted rows), so on these tiny problems it lands 1-2.5e-2 from the fp64 semantics (fp8select's own
path, which keeps gate/up in fp32, ~6e-3). The glue is held tighter by an independent emulation of what the
peer computes: the fp64 semantics with those bf16 roundings, by truncation or to nearest.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
import torch

pytest.importorskip("triton")

from fp64_moe_reference import _dequant_blocks, _quant_dequant, expected_moe, random_moe, random_routing, rel_err
from interpreted import moe_kernels

from benchmarks import moe_peer
from fp8select.kernels.moe_config import MoeTritonConfig

moe_triton = moe_kernels()

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / moe_peer.DEFAULT_PEER
needs_peer = pytest.mark.skipif(not (PEER / moe_peer.KERNEL_FILE).is_file(),
                                reason=f"the peer is not fetched into {moe_peer.DEFAULT_PEER} (docs/moe.md)")


# -- without the peer ---------------------------------------------------------------------------------------------


def test_nearest_m_is_vllms_choice() -> None:
    keys = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
    assert [moe_peer.nearest_m(keys, m) for m in (1, 3, 5, 20, 40, 100, 700, 1280, 5000)] == \
        [1, 2, 4, 16, 32, 96, 512, 1024, 4096]  # ties (3, 20, 40, 1280) go to the smaller key


def test_peer_config_tuned_default_and_the_launch_meta(tmp_path: Path) -> None:
    name = moe_peer.config_file_name(32, 2048, "NVIDIA_H200")
    assert name == "E=32,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    (tmp_path / "configs").mkdir()
    tuned = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3}
    (tmp_path / "configs" / name).write_text(
        '{"triton_version": "3.4.0", "1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, '
        '"GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4}, "2048": ' + str(tuned).replace("'", '"') + "}")
    configs, file_name = moe_peer.load_configs(tmp_path, 32, 2048, "NVIDIA_H200")
    assert configs is not None and sorted(configs) == [1, 2048] and file_name == name
    config, source = moe_peer.peer_config(configs, 4096, file_name)
    assert config == tuned and "tuned" in source and "M key 2048" in source
    meta = moe_peer.launch_meta(config)
    assert meta["BLOCK_SIZE_K"] == 128 and meta["SPLIT_K"] == 1 and meta["GROUP_SIZE_M"] == 1  # K at most the block's
    missing, other = moe_peer.load_configs(tmp_path, 256, 2048, "NVIDIA_H200")
    assert missing is None
    config, source = moe_peer.peer_config(missing, 16, other)
    assert config == moe_peer.VLLM_DEFAULT_FP8_BLOCK and source.startswith("vLLM default") and "E=256" in source
    with pytest.raises(ValueError, match="lacks"):
        moe_peer.launch_meta({"BLOCK_SIZE_M": 16})


def test_device_names_and_the_grid_rows() -> None:
    assert moe_peer.vllm_device_name("NVIDIA H200") == "NVIDIA_H200"
    assert moe_peer.vllm_device_name("NVIDIA H200 NVL") == "NVIDIA_H200"
    assert moe_peer.vllm_device_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert moe_peer.grid_rows(a_rows=2, sorted_len=400, block_m=64, top_k=2) == 256  # fewer rows than a block
    assert moe_peer.grid_rows(a_rows=100, sorted_len=400, block_m=64, top_k=8) == 400


def test_arguments() -> None:
    args = moe_peer.parse_args(["--out", "x"])
    assert args.peer == moe_peer.DEFAULT_PEER and args.m == moe_peer.DEFAULT_M
    assert list(args.shapes) == list(moe_peer.DEFAULT_SHAPES)
    args = moe_peer.parse_args(["--out", "x", "--peer", "p", "--shapes", "qwen3-30b-a3b,deepseek-v3-e8", "--m", "64,1,64"])
    assert args.peer == Path("p") and args.m == (1, 64) and list(args.shapes) == ["qwen3-30b-a3b", "deepseek-v3-e8"]
    assert moe_peer.parse_shapes("deepseek-v3-e8;16,256,128,2") == {"deepseek-v3-e8": (8, 7168, 2048, 8),
                                                                    "16,256,128,2": (16, 256, 128, 2)}
    assert len(moe_peer.parse_shapes("all")) == 5
    for bad in ("nope", "1,2,3"):
        with pytest.raises(argparse.ArgumentTypeError):
            moe_peer.parse_shapes(bad)
    for bad in ("0,4", "a"):
        with pytest.raises(argparse.ArgumentTypeError):
            moe_peer.parse_ms(bad)


def test_summary_and_checks() -> None:
    rows = [{"shape": "a", "m": 1, "ratio": 0.5}, {"shape": "a", "m": 16, "ratio": 2.0},
            {"shape": "b", "m": 4, "error": "outputs differ"}]
    s = moe_peer.summarize(rows)
    assert s["points"] == 2 and s["geomean_ratio"] == 1.0 and s["worst_ratio"] == 2.0 and s["worst_at"] == "a M 16"
    assert s["at_least_as_fast"] == 1 and s["untimed"] == ["b M 4: outputs differ"]
    assert moe_peer.summarize([])["points"] == 0
    ok = {"rel_err": 0.012, "fp8select": {"rel_err_vs_fp64": 0.004}, "peer": {"rel_err_vs_fp64_bf16_gemm_outputs": 0.006}}
    assert moe_peer.check_failures(ok) == []  # the two 1.2e-2 apart: within 3e-2 (bf16 gate/up), not gated at 1e-2
    bad = {"rel_err": float("inf"), "fp8select": {"rel_err_vs_fp64": 0.02}, "peer": {}}
    assert len(moe_peer.check_failures(bad)) == 3


def test_a_missing_peer_is_named() -> None:
    with pytest.raises(FileNotFoundError, match="no peer kernel"):
        moe_peer.load_peer(ROOT / "no-such-peer")


# -- with the peer ------------------------------------------------------------------------------------------------


def _bf16(v: torch.Tensor, truncate: bool) -> torch.Tensor:
    f = v.to(torch.float32).contiguous()
    if truncate:
        return (f.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.float64)
    return f.to(torch.bfloat16).to(torch.float64)


def _peer_semantics(x, w13, s13, w2, s2, topk_weights, topk_ids, *, truncate: bool) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """What the peer path computes, in fp64 apart from its roundings: per slot, gate/up written as bf16, the
    weighted down row written as bf16; the k rows summed (written independently of the benchmark)."""
    inter = w13.shape[1] // 2
    y = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        a = _quant_dequant(x[t].to(torch.float64))
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            hidden = _bf16(_dequant_blocks(w13[e], s13[e]) @ a, truncate)
            act = torch.nn.functional.silu(hidden[:inter]) * hidden[inter:]
            y[t] += _bf16(float(topk_weights[t, j]) * (_dequant_blocks(w2[e], s2[e]) @ _quant_dequant(act)), truncate)
    return y


PEER_CONFIGS = [
    {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 2, "num_warps": 4, "num_stages": 2},
    {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3},
]


@needs_peer
@pytest.mark.parametrize(("config", "skew"), [(PEER_CONFIGS[0], False), (PEER_CONFIGS[1], True)])
def test_the_peer_path_computes_the_moe_semantics(config, skew) -> None:  # type: ignore[no-untyped-def]
    peer = moe_peer.load_peer(PEER)
    assert type(peer.fused_moe_kernel).__name__ == "InterpretedFunction"
    problem = random_moe(4, 256, 128, seed=0)
    m, k = 40, 2  # several blocks per expert at BLOCK_SIZE_M 16 and 32
    w, ids = random_routing(m, k, 4, seed=1, skew=skew)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = moe_peer.PeerExperts(peer, *problem.weights()).bind(m, k, config)(x, w, ids)
    assert y.shape == (m, 256) and y.dtype == torch.bfloat16 and bool(torch.isfinite(y).all())
    # the glue: what the peer computes, bf16 rounded either way the interpreter may round
    emulated = min(rel_err(y, _peer_semantics(x, *problem.weights(), w, ids, truncate=t)) for t in (True, False))
    assert emulated < 5e-3, emulated
    # the semantics (docs/moe.md), with both GEMMs' outputs rounded to bf16 as the peer writes them
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids, gemm_out=torch.bfloat16)) < 3e-2
    # and fp8select's own Triton path on the same problem
    ours = moe_triton.TritonExperts(*problem.weights())(x, w, ids, MoeTritonConfig(16, 32, 1, 4, 2, 1))
    assert rel_err(y, ours.to(torch.float64)) < 3e-2


@needs_peer
def test_one_token_and_a_tuned_config_from_the_peer_folder() -> None:
    """M 1 (fewer rows than a block: the grid cut), at the configuration the peer's tuned H200 file gives M 1."""
    peer = moe_peer.load_peer(PEER)
    configs, name = moe_peer.load_configs(PEER, 32, 2048, "NVIDIA_H200")
    config, _ = moe_peer.peer_config(configs, 1, name)
    problem = random_moe(8, 256, 128, seed=3)
    w, ids = random_routing(1, 4, 8, seed=4)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    y = moe_peer.PeerExperts(peer, *problem.weights()).bind(1, 4, config)(x, w, ids)
    emulated = min(rel_err(y, _peer_semantics(x, *problem.weights(), w, ids, truncate=t)) for t in (True, False))
    assert emulated < 5e-3, emulated


@needs_peer
def test_a_shape_measured_end_to_end_with_the_clock_faked(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The benchmark's own flow on a tiny shape: configurations, both columns bound on the same weights, the
    checks against the fp64 semantics, the rows and their summary (the interpreter has no CUDA graphs)."""
    import dataclasses
    import time

    from matrix import MATRIX

    from fp8select import resolve
    from fp8select.measure import timing
    from fp8select.measure.timing import Timing

    # the interpreter truncates to bf16: the peer lands up to ~3e-2 from the fp64 semantics with bf16 GEMM outputs
    # (rounded to nearest) on this tiny shape, where a GPU, rounding to nearest, is held to 1e-2
    monkeypatch.setattr(moe_peer, "REL_ERR_MAX", 6e-2)
    monkeypatch.setattr(timing, "time_graphs",
                        lambda cols, replays=30, **kw: {c: Timing(*(2.0 if c == "fp8select" else 4.0,) * 3) for c in cols})
    caps = dataclasses.replace(MATRIX["cpu-only"][0], packages={"triton": "3.9.0"}, env={"TRITON_INTERPRET": "1"})
    selection = resolve(caps, plugins=False, tuning=False)
    peer = moe_peer.load_peer(PEER)
    rows, note = moe_peer.measure_shape(selection, peer, PEER, "tiny", (4, 256, 128, 2), (3, 40), 5,
                                        time.monotonic() + 600, "NVIDIA_H200", device="cpu")
    assert note == "" and [r["m"] for r in rows] == [3, 40]
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["peer"]["config"] == moe_peer.VLLM_DEFAULT_FP8_BLOCK  # no tuned file for E=4, N=128
        assert row["fp8select"]["config_from"].startswith("default rule") and row["ratio"] == 0.5
        assert row["fp8select"]["rel_err_vs_fp64"] < 1e-2 and row["rel_err"] < moe_peer.MUTUAL_ERR_MAX
        assert row["peer"]["rel_err_vs_fp64_bf16_gemm_outputs"] < 6e-2
    assert moe_peer.summarize(rows)["geomean_ratio"] == 0.5
