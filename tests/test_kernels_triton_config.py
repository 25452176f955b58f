"""Tests for fp8select.kernels.triton_config: the one Triton launch-configuration type (pure Python)."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, replace
from typing import Any

import pytest

from fp8select.kernels.triton_config import LAUNCH_KEYS, OPTIONAL_KEYS, PATHS, TritonConfig

LAUNCH = {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3}


def test_from_dict_fills_optional_keys_with_fixed_defaults() -> None:
    assert TritonConfig.from_dict(LAUNCH) == TritonConfig(**LAUNCH, path="gemm", FIXUP=0, TMA=0)
    for path in (p for p in PATHS if p != "wgmma"):  # wgmma: TMA always (its limits below)
        cfg = TritonConfig.from_dict({**LAUNCH, "path": path})
        assert cfg.FIXUP == (1 if path in ("decode", "swap") else 0) and cfg.TMA == 0
    explicit = TritonConfig.from_dict({**LAUNCH, "path": "decode", "FIXUP": 0, "TMA": 1})
    assert (explicit.FIXUP, explicit.TMA) == (0, 1)


def test_to_dict_writes_every_key_and_round_trips_through_json() -> None:
    cfg = TritonConfig.from_dict({**LAUNCH, "path": "swap", "TMA": 1})
    data = cfg.to_dict()
    assert list(data) == [*LAUNCH_KEYS, *(k for k in OPTIONAL_KEYS if k != "PERSISTENT")]  # only when set
    assert TritonConfig.from_dict(json.loads(json.dumps(data))) == cfg
    persistent = TritonConfig.from_dict({**LAUNCH, "SPLIT_K": 1, "TMA": 1, "PERSISTENT": 2})
    assert persistent.to_dict()["PERSISTENT"] == 2
    assert TritonConfig.from_dict(json.loads(json.dumps(persistent.to_dict()))) == persistent
    # a missing optional key never inherits another configuration's value
    without_tma = {k: v for k, v in data.items() if k != "TMA"}
    assert TritonConfig.from_dict(without_tma).TMA == 0


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"BLOCK_K": 64}, "'BLOCK_K' must be 128"),
        ({"BLOCK_M": 8}, "'BLOCK_M' must be >= 16"),
        ({"BLOCK_N": 48}, "'BLOCK_N' must be a power of two"),
        ({"num_warps": 3}, "'num_warps' must be a power of two"),
        ({"SPLIT_K": 0}, "'SPLIT_K' must be a positive int"),
        ({"GROUP_M": 2.0}, "'GROUP_M' must be a positive int"),
        ({"num_stages": True}, "'num_stages' must be a positive int"),
        ({"path": "cublas"}, "'path' must be one of"),
        ({"FIXUP": 2}, "'FIXUP' must be 0 or 1"),
        ({"TMA": True}, "'TMA' must be 0 or 1"),
        ({"TILE": 1}, r"unknown \['TILE'\]"),
    ],
)
def test_from_dict_names_the_bad_key(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TritonConfig.from_dict({**LAUNCH, **change})


def test_missing_launch_keys_and_non_mappings_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"missing \['BLOCK_N'"):
        TritonConfig.from_dict({"BLOCK_M": 16})
    with pytest.raises(ValueError, match="mapping"):
        TritonConfig.from_dict([("BLOCK_M", 16)])  # type: ignore[arg-type]


def test_frozen_hashable_and_validated_on_replace() -> None:
    cfg = TritonConfig.from_dict(LAUNCH)
    with pytest.raises(FrozenInstanceError):
        cfg.SPLIT_K = 2  # type: ignore[misc]
    assert len({cfg, TritonConfig.from_dict(LAUNCH), replace(cfg, SPLIT_K=2)}) == 2
    with pytest.raises(ValueError, match="SPLIT_K"):
        replace(cfg, SPLIT_K=0)


def test_prequantized_maps_in_kernel_quantizing_paths_only() -> None:
    base = TritonConfig.from_dict({**LAUNCH, "FIXUP": 1, "TMA": 1})
    for given, runs in (("fused", "gemm"), ("decode", "swap"), ("gemm", "gemm"), ("swap", "swap")):
        cfg = replace(base, path=given)
        assert cfg.prequantized() == replace(base, path=runs)
    wgmma = replace(base, BLOCK_M=64, SPLIT_K=1, FIXUP=0, path="wgmma")
    assert wgmma.prequantized() == wgmma and not wgmma.quantizes_in_kernel and not wgmma.swap
    four = PATHS[:4]
    assert [replace(base, path=p).quantizes_in_kernel for p in four] == [False, True, True, False]
    assert [replace(base, path=p).swap for p in four] == [False, False, True, True]


WGMMA = {**LAUNCH, "BLOCK_M": 128, "BLOCK_N": 128, "SPLIT_K": 1, "num_warps": 8, "path": "wgmma", "TMA": 1}


def test_wgmma_limits() -> None:
    """The wgmma path: 64 rows per warpgroup, one MMA wide, three accumulators in registers, TMA, no split-K."""
    ok = TritonConfig.from_dict(WGMMA)
    assert ok.describe() == "wgmma 128x128 sk1 w8 s3 tma"
    assert TritonConfig.from_dict(json.loads(json.dumps(ok.to_dict()))) == ok
    for fine in ({"BLOCK_M": 64, "num_warps": 4}, {"BLOCK_M": 256, "BLOCK_N": 64}, {"BLOCK_N": 16}):
        TritonConfig.from_dict({**WGMMA, **fine})
    bad = {
        "BLOCK_M": ({"BLOCK_M": 64}, "BLOCK_M >= 16 per warp"),  # two warpgroups need 128 rows
        "warps": ({"num_warps": 2, "BLOCK_M": 64, "BLOCK_N": 64}, "4 or 8 warps"),
        "registers": ({"num_warps": 4}, "per warp"),  # 128x128 on one warpgroup: 128 registers an accumulator
        "wide": ({"BLOCK_M": 128, "BLOCK_N": 512, "num_warps": 8}, "BLOCK_N <= 256"),
        "split": ({"SPLIT_K": 2}, "SPLIT_K 1"),
        "tma": ({"TMA": 0}, "TMA 1"),
        "persistent": ({"PERSISTENT": 1}, "PERSISTENT"),
    }
    for change, message in bad.values():
        with pytest.raises(ValueError, match=message):
            TritonConfig.from_dict({**WGMMA, **change})


def test_describe() -> None:
    cfg = TritonConfig.from_dict({**LAUNCH, "path": "decode", "TMA": 1, "GROUP_M": 16})
    assert cfg.describe() == "decode 16x128 sk4f w4 s3 g16 tma"
    assert TritonConfig.from_dict({**LAUNCH, "SPLIT_K": 1}).describe() == "gemm 16x128 sk1 w4 s3"


def test_split_for_caps_at_the_k_blocks_and_leaves_no_split_empty() -> None:
    cfg = TritonConfig.from_dict({**LAUNCH, "SPLIT_K": 16})
    assert cfg.split_for(7168) == 14  # 56 K blocks: 4 per split, 14 splits (16 would leave two empty)
    assert cfg.split_for(512) == 4  # only 4 K blocks
    assert replace(cfg, SPLIT_K=1).split_for(7168) == 1
    assert replace(cfg, SPLIT_K=64).split_for(7200) == 57  # the partial last block counts
