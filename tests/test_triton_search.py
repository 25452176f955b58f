"""Tests for fp8select.kernels.triton_search: heuristic defaults, candidates, neighbours, search.

Pure Python: nothing here needs triton or a GPU.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fp8select.kernels import triton_search as ts
from fp8select.kernels.triton_config import FIXUP_MAX_SPLIT, TritonConfig, default_fixup

DEEPSEEK_V3 = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048),
               (36864, 7168), (7168, 18432)]
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
REPO = Path(__file__).resolve().parent.parent


def test_import_pulls_in_neither_torch_nor_triton() -> None:
    # fp8select/__init__ imports torch: stand in for the package, as a tool without torch would.
    code = (
        "import sys, types; "
        f"pkg = types.ModuleType('fp8select'); pkg.__path__ = [{str(REPO / 'fp8select')!r}]; "
        "sys.modules['fp8select'] = pkg; "
        "from fp8select.kernels import triton_search as s; s.candidates(7168, 2048, 1); "
        "s.search(7168, 2048, 1, lambda c: 1.0, max_configs=3); "
        "bad = [m for m in ('triton', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("n", "k"), DEEPSEEK_V3)
def test_candidates_are_valid_distinct_and_fit(n: int, k: int) -> None:
    for m in BUCKETS:
        cands = ts.candidates(n, k, m)
        assert 1 <= len(cands) <= 8
        assert len(set(cands)) == len(cands), "duplicates"
        for cfg in cands:
            assert isinstance(cfg, TritonConfig) and TritonConfig.from_dict(cfg.to_dict()) == cfg
            assert ts.smem_bytes(cfg) <= ts.SMEM_LIMIT_BYTES
            assert cfg.FIXUP == default_fixup(cfg.path, cfg.SPLIT_K)
            if m > 512:
                assert cfg.SPLIT_K == 1
        paths = [c.path for c in cands]
        if m <= 16:
            assert paths[0] == "decode" and {"gemm", "decode", "swap", "fused"} <= set(paths)
        if m >= 1024:
            assert paths[0] == "wgmma" and set(paths) == {"gemm", "wgmma"} and any(c.TMA for c in cands)
            tiles = {(c.BLOCK_M, c.BLOCK_N, c.num_warps) for c in ts.candidates(n, k, m, limit=20)}
            assert {(128, 128, 8), (128, 256, 8), (256, 128, 8), (64, 256, 8)} <= tiles


def test_candidates_split_fills_the_sms_at_small_m() -> None:
    (first,) = ts.candidates(7168, 16384, 1, limit=1)
    tiles = math.ceil(7168 / first.BLOCK_N)
    assert first.path == "decode" and tiles * first.SPLIT_K >= 2 * 132
    assert ts.candidates(7168, 16384, 1, sms=1, limit=1)[0].SPLIT_K == 1
    # K too short to split: at least 4 K blocks per split.
    assert all(c.SPLIT_K == 1 for c in ts.candidates(32768, 512, 1))


def test_candidates_paths_filter_and_fallback() -> None:
    assert {c.path for c in ts.candidates(2112, 7168, 1, paths=["gemm", "fused"])} == {"gemm", "fused"}
    # No decode entry is ranked at M = 4096: the filter still yields the path's default config.
    (only,) = ts.candidates(2112, 7168, 4096, paths=["decode"])
    assert only == ts.heuristic_config(2112, 7168, 4096, "decode")
    with pytest.raises(ValueError, match="subset"):
        ts.candidates(2112, 7168, 1, paths=["cublas"])


@pytest.mark.parametrize("m", [1, 16, 64, 512, 8192])
def test_neighbours_are_valid_distinct_and_filtered(m: int) -> None:
    for base in ts.candidates(7168, 16384, m):
        near = ts.neighbours(base, 7168, 16384, m)
        assert near and base not in near and len(set(near)) == len(near)
        for cfg in near:
            assert ts.smem_bytes(cfg) <= ts.SMEM_LIMIT_BYTES
            if cfg.SPLIT_K == 1:
                assert cfg.FIXUP == default_fixup(cfg.path, 1)
            assert not (cfg.path == "fused" and cfg.TMA)
        only_same = ts.neighbours(base, 7168, 16384, m, paths=[base.path])
        assert {c.path for c in only_same} <= {base.path}


def test_neighbours_steps() -> None:
    base = ts.heuristic_config(7168, 16384, 1, "decode")
    near = ts.neighbours(base, 7168, 16384, 1)
    fields = base.to_dict()
    changed = [{k for k, v in cfg.to_dict().items() if v != fields[k]} for cfg in near]
    assert {"SPLIT_K"} in changed and {"num_stages"} in changed and {"num_warps"} in changed
    assert {"FIXUP"} in changed and {"path"} in changed  # two-pass variant, and the swap sibling
    assert replace(base, TMA=1) in near
    assert any(c.path == "swap" and c.BLOCK_N == base.BLOCK_N for c in near)
    large = ts.neighbours(ts.candidates(36864, 7168, 8192)[0], 36864, 7168, 8192)
    assert any(c.GROUP_M == 16 for c in large) and all(c.SPLIT_K == 1 for c in large)
    # a configuration at the edges of the ranges steps only inward
    edge = replace(ts.heuristic_config(256, 512, 1, "swap"), num_stages=1, BLOCK_N=16)
    assert all(c.num_stages >= 1 and c.BLOCK_N >= 16 for c in ts.neighbours(edge, 256, 512, 1))


def test_heuristic_config_per_path() -> None:
    for path in ("gemm", "fused", "decode", "swap"):
        for m in (1, 3, 16, 17, 64, 100, 4096):
            cfg = ts.heuristic_config(4096, 7168, m, path)
            assert cfg.path == path and cfg.TMA == 0 and cfg.FIXUP == default_fixup(path, cfg.SPLIT_K)
    assert ts.heuristic_config(4096, 7168, 3, "decode").BLOCK_M == 16
    assert ts.heuristic_config(4096, 7168, 40, "swap").BLOCK_M == 64
    with pytest.raises(ValueError, match="path"):
        ts.heuristic_config(1, 1, 1, "cublas")


def test_heuristic_splits_k_for_small_m_and_large_weights() -> None:
    small_m = ts.heuristic_config(7168, 16384, 1)
    assert small_m.SPLIT_K > 1 and small_m.BLOCK_M == 16
    assert ts.heuristic_config(7168, 16384, 8192).SPLIT_K == 1
    # M buckets: every M of a bucket gets its bucket's tiles
    assert ts.heuristic_config(2112, 7168, 9) == ts.heuristic_config(2112, 7168, 16)
    assert ts.heuristic_config(2112, 7168, 9000) == ts.heuristic_config(2112, 7168, 8192)


def test_search_finds_the_fastest_and_climbs() -> None:
    first = ts.candidates(7168, 16384, 1, limit=1)[0]
    target = replace(first, num_stages=first.num_stages + 1)  # one step away, not in the first round
    assert target not in ts.candidates(7168, 16384, 1, limit=20)

    def cost(cfg: TritonConfig) -> float:  # a made-up landscape with its minimum at ``target``
        us = 10.0 + sum(v != target.to_dict()[k] for k, v in cfg.to_dict().items())
        return us if cfg.path == "decode" else us + 5

    calls: list[TritonConfig] = []
    best, us, tried = ts.search(7168, 16384, 1, lambda c: calls.append(c) or cost(c), max_configs=12)
    assert len(tried) == len(calls) == 12
    assert us == min(t.us for t in tried if t.us is not None) == cost(target) == 10.0
    assert best == target
    assert len({t.config for t in tried}) == len(tried), "a config was timed twice"


def test_search_failures_errors_and_nothing_working() -> None:
    def flaky(cfg: TritonConfig) -> float | None:
        if cfg.path == "decode":
            raise RuntimeError("compile failed")
        return None if cfg.path == "fused" else 20.0 - cfg.num_stages

    best, us, tried = ts.search(2112, 7168, 8, flaky, max_configs=9)
    assert best is not None and best.path in ("gemm", "swap") and us == min(t.us for t in tried if t.us)
    assert any("compile failed" in (t.error or "") for t in tried)
    assert all(t.us is None for t in tried if t.config.path in ("decode", "fused"))
    none_best, none_us, none_tried = ts.search(2112, 7168, 8, lambda c: None, max_configs=4)
    assert none_best is None and none_us == math.inf and len(none_tried) == 4
    _, _, bad = ts.search(2112, 7168, 8, lambda c: math.nan, max_configs=2)
    assert all(t.us is None and t.error is None for t in bad)


def test_search_deadline_and_paths() -> None:
    best, _, tried = ts.search(2112, 7168, 1, lambda c: 1.0, max_configs=12, deadline=time.monotonic() - 1)
    assert len(tried) == 1 and best == tried[0].config  # at least one config, then the deadline stops it
    _, _, tried = ts.search(2112, 7168, 1, lambda c: float(c.num_stages), max_configs=6, paths=["gemm"])
    assert {t.config.path for t in tried} == {"gemm"}
    _, _, tried = ts.search(2112, 7168, 1, lambda c: 1.0, max_configs=0)
    assert len(tried) == 1


def test_large_m_search_reaches_persistent_launches_and_leaves_them_validly() -> None:
    """At large M the first round holds persistent gemm configs and every gemm TMA config can step
    to its persistent twin; a persistent config's neighbours are all valid (a step off the gemm
    path, off TMA or to split-K drops PERSISTENT instead of raising)."""
    from fp8select.kernels.triton_search import candidates, neighbours

    first = candidates(7168, 2048, 4096, limit=64)
    assert any(c.PERSISTENT for c in first)
    plain = next(c for c in first if c.path == "gemm" and c.TMA and not c.PERSISTENT)
    assert any(c.PERSISTENT and c.BLOCK_M == plain.BLOCK_M for c in neighbours(plain, 7168, 2048, 4096))
    persistent = next(c for c in first if c.PERSISTENT)
    steps = neighbours(persistent, 7168, 2048, 4096)
    assert any(not c.PERSISTENT and c.BLOCK_N == persistent.BLOCK_N for c in steps)
    assert all(c.PERSISTENT == 0 for c in steps if c.path != "gemm" or not c.TMA or c.SPLIT_K > 1)
    assert not any(c.PERSISTENT for c in candidates(7168, 2048, 64, limit=64))


def test_wgmma_path_in_the_search() -> None:
    """The wgmma path: ranked first at M >= 1024, in the first round from M 32, one step from the gemm path's
    tiles above M 16 (and back), never at decode, never split or pointer-fed, and its neighbours stay within its
    limits."""
    assert [c.path for c in ts.candidates(7168, 16384, 4096)[:2]] == ["wgmma", "wgmma"]
    for m in (32, 64, 256):
        assert "wgmma" in {c.path for c in ts.candidates(7168, 16384, m)}
    assert "wgmma" not in {c.path for m in (1, 16) for c in ts.candidates(7168, 16384, m, limit=64)}
    gemm = next(c for c in ts.candidates(5120, 1280, 64) if c.path == "gemm")
    assert "wgmma" in {c.path for c in ts.neighbours(gemm, 5120, 1280, 64)}
    assert "wgmma" not in {c.path for c in ts.neighbours(replace(gemm, BLOCK_M=16), 5120, 1280, 16)}
    for m in (64, 128, 4096):
        heuristic = ts.heuristic_config(7168, 16384, m, "wgmma")
        assert heuristic.path == "wgmma" and heuristic.TMA == 1 and heuristic.SPLIT_K == 1
        near = ts.neighbours(heuristic, 7168, 16384, m)
        assert any(c.path == "gemm" and (c.BLOCK_M, c.BLOCK_N) == (heuristic.BLOCK_M, heuristic.BLOCK_N) for c in near)
        assert all(c.SPLIT_K == 1 and c.TMA == 1 for c in near if c.path == "wgmma")
        assert any(c.path == "wgmma" and c.num_stages != heuristic.num_stages for c in near)
        gemm = replace(heuristic, path="gemm", TMA=0)
        assert replace(heuristic, TMA=1) in ts.neighbours(gemm, 7168, 16384, m)  # the sibling, TMA-fed
    small = ts.neighbours(ts.heuristic_config(7168, 16384, 32, "gemm"), 7168, 16384, 32)
    assert "wgmma" not in {c.path for c in small}
    # 128 x 128 on one warpgroup would need 128 registers per accumulator: the warp step skips it
    two = ts.heuristic_config(7168, 16384, 4096, "wgmma")
    assert (two.BLOCK_M, two.BLOCK_N, two.num_warps) == (128, 128, 8)
    assert not any(c.path == "wgmma" and c.num_warps == 4 and c.BLOCK_M * c.BLOCK_N > 8192
                   for c in ts.neighbours(two, 7168, 16384, 4096))
    assert ts.smem_bytes(two) == 4 * (128 + 128) * 128  # the output tile reuses the ring (tests/test_gluon_gemm.py)


def test_fit_split_keeps_the_measured_launchs_program_count() -> None:
    """A configuration borrowed from another weight keeps its tiles; its split-K changes so that it
    launches as many programs as where it was measured (M rows in ceil(M / BLOCK_M) tiles)."""
    cfg = ts._make("gemm", 16, 64, 2, 3, 4)
    # 7168 x 16384 at M 8: 112 column tiles x 4 splits = 448 programs; 4096 rows have 64 tiles
    assert ts.fit_split(cfg, (7168, 16384), (4096, 14336), 8) == replace(cfg, SPLIT_K=7)
    assert ts.fit_split(cfg, (7168, 16384), (28672, 4096), 8).SPLIT_K == 1  # 448 tiles: no split
    assert ts.fit_split(cfg, (7168, 16384), (7168, 16384), 8) == cfg
    # the split as launched there counts (16 on 7 K blocks launches 7), and the row tiles of M
    wide = replace(cfg, SPLIT_K=16)
    assert ts.fit_split(wide, (1024, 896), (512, 896), 64).SPLIT_K == 14
    whole = ts._make("wgmma", 128, 128, 8, 4)
    assert ts.fit_split(whole, (7168, 2048), (2112, 7168), 4096) is whole  # no split-K: unchanged


def test_default_fixup_sums_in_a_second_kernel_from_split_k_8() -> None:
    """The swap-AB paths sum their splits in the last-arriving program up to FIXUP_MAX_SPLIT, in the
    second kernel beyond (the faster at split-K 8 on the H200); the tile paths always in the second."""
    assert FIXUP_MAX_SPLIT == 4
    assert [default_fixup("decode", s) for s in (1, 2, 4, 8, 16)] == [1, 1, 1, 0, 0]
    assert [default_fixup("swap", s) for s in (1, 4, 8)] == [1, 1, 0]
    assert {default_fixup(p, s) for p in ("gemm", "fused", "wgmma") for s in (1, 4, 8)} == {0}
    row = {"BLOCK_M": 16, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
           "path": "decode"}
    assert TritonConfig.from_dict({**row, "SPLIT_K": 8}).FIXUP == 0
    assert TritonConfig.from_dict({**row, "SPLIT_K": 4}).FIXUP == 1
    assert TritonConfig.from_dict({**row, "SPLIT_K": 8, "FIXUP": 1}).FIXUP == 1  # given: kept
    # The H200's fastest Triton configuration at M 8-16 on 7168 x 16384 (run 42), decode 16x256 by TMA at
    # split-K 8 with the second kernel, is one step (split-K / 2) from a first-round candidate.
    best = TritonConfig.from_dict({**row, "SPLIT_K": 8, "TMA": 1})
    first = [c for c in ts.candidates(7168, 16384, 8) if c.path == "decode" and c.BLOCK_N == 256]
    assert first and first[0].FIXUP == 0 and best in ts.neighbours(first[0], 7168, 16384, 8)
    with pytest.raises(ValueError, match="SPLIT_K"):
        TritonConfig.from_dict({**row, "SPLIT_K": "8"})
