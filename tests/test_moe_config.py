"""The launch configurations of fp8select's Triton MoE kernels (:mod:`fp8select.kernels.moe_config`, pure
Python): the rule per tokens per expert, the candidates ``tune --moe`` times, each field's validation and
its messages, the short form, and the rows and records written before a field existed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fp8select.kernels.moe_config import MoeTritonConfig, default_config, tuning_configs, without_wgmma
from fp8select.measured.table import SHIPPED_DIR

# the rule's configurations, by tokens per expert (32 experts, k 8: M / 4 per expert)
DECODE, BUSY, NEAR = default_config(1, 8, 32), default_config(32, 8, 32), default_config(64, 8, 32)
PREFILL, WIDE, LARGE = default_config(256, 8, 32), default_config(1024, 8, 32), default_config(4096, 8, 32)


def test_default_configs_are_valid_and_grow_with_tokens_per_expert() -> None:
    # M 1 / 28 / 29 / 60 / 61 / 252 / 253 / 1020 / 1021 / 4092 / 4093 of 32 experts: 1 / 7 / 8 / 15 / 16 / 63 / 64 /
    # 255 / 256 / 1023 / 1024 tokens per expert
    ms = (1, 28, 29, 60, 61, 252, 253, 1020, 1021, 4092, 4093)
    assert [default_config(m, 8, 32).BLOCK_M for m in ms] == [16, 16, 32, 32, 64, 64, 64, 64, 64, 64, 128]
    assert [default_config(m, 8, 32).BLOCK_N for m in ms] == [128] * 8 + [256, 256, 128]
    assert [default_config(m, 8, 32).SWAP_AB for m in ms] == [1, 1, 1, 1] + [0] * 7  # transposed below 16
    assert [default_config(m, 8, 32).FUSED_ACT for m in ms] == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0]
    assert [default_config(m, 8, 32).WGMMA for m in ms] == [0] * 6 + [1] * 5  # wgmma from 64 per expert
    assert [default_config(m, 8, 32).PERSISTENT for m in ms] == [0] * 8 + [1] * 3  # from 256 per expert
    assert {default_config(m, 8, 8).QUANT_IN_KERNEL for m in (1, 64, 4096)} == {0}  # measured slower in the GEMM
    with pytest.raises(ValueError, match="BLOCK_M"):
        MoeTritonConfig(BLOCK_M=8, BLOCK_N=128, GROUP_M=1, num_warps=4, num_stages=2, QUANT_IN_KERNEL=0)
    with pytest.raises(ValueError, match="missing"):
        MoeTritonConfig.from_dict({"BLOCK_M": 16})
    config = default_config(64, 8, 32)
    assert MoeTritonConfig.from_dict(config.to_dict()) == config


def test_triton_tuning_configs_start_from_the_rule_and_are_distinct() -> None:
    # M 1 / 32 / 64 / 128 / 512 / 1024 / 4096 / 8192 of 32 experts: 0.25 / 8 / 16 / 32 / 128 / 256 / 1024 / 2048 per expert
    for m in (1, 32, 64, 128, 512, 1024, 4096, 8192):
        configs = tuning_configs(m, 8, 32)
        assert configs[0] == default_config(m, 8, 32) and len(set(configs)) == len(configs) >= 4
        assert all(16 <= c.BLOCK_M <= 128 for c in configs) and len(configs) <= 10
        # the fused gate-up on the tl.dot kernel's tiles comes last, both placements (measured slower on the H200)
        fused = replace(configs[0], FUSED_ACT=1, WGMMA=0, SWAP_AB=0, PERSISTENT=0, BLOCK_M=min(configs[0].BLOCK_M, 64),
                        BLOCK_N=min(configs[0].BLOCK_N, 128), num_warps=4)
        assert configs[-2:] == [fused, replace(fused, QUANT_IN_KERNEL=1)]
        assert all(c.QUANT_IN_KERNEL == 0 for c in configs if not c.FUSED_ACT)
    # 2048 tokens per expert: the plain structure's persistent 128-row tile, its 64 x 256 one (the rule's at 256-1023),
    # the fused wgmma gate-up's 64-row tile (64-255), the 128-row tile one program per tile
    prefill = tuning_configs(8192, 8, 32)
    assert prefill[0].WGMMA == prefill[0].PERSISTENT == 1 and prefill[0].BLOCK_M == 128 and not prefill[0].FUSED_ACT
    fused = replace(prefill[0], FUSED_ACT=1, PERSISTENT=0, BLOCK_M=64, num_warps=4)
    assert prefill[1:3] == [replace(prefill[0], BLOCK_M=64, BLOCK_N=256, num_warps=4), fused]
    assert prefill[1:3] == [tuning_configs(1024, 8, 32)[0], tuning_configs(1020, 8, 32)[0]]  # 256 and 255 per expert
    assert replace(prefill[0], PERSISTENT=0) in prefill
    assert replace(fused, WGMMA=0, FUSED_ACT=0, num_stages=3) in prefill  # the tl.dot kernel's tile
    assert not any(c.SWAP_AB for c in prefill)
    # decode: the transposed 16-row tile, the fused gate-up on it, one stage fewer, half its columns, the busy tile
    decode = tuning_configs(1, 8, 32)
    half = replace(decode[0], BLOCK_N=64, num_stages=3)
    busy = tuning_configs(32, 8, 32)[0]
    assert decode[0].SWAP_AB == 1 and decode[1:7] == [replace(decode[0], FUSED_ACT=1),
                                                      replace(decode[0], FUSED_ACT=1, num_stages=3),
                                                      replace(decode[0], num_stages=3), half, replace(half, FUSED_ACT=1),
                                                      busy]
    assert replace(decode[0], SWAP_AB=0) not in decode  # the normal 16-row tile: never ahead
    # 8 per expert: the fused transposed 32-row tile, its plain structure, the tl.dot tile of 16, the 16-row tile
    assert busy == replace(decode[0], BLOCK_M=32, FUSED_ACT=1, num_stages=3)
    assert tuning_configs(32, 8, 32)[1:4] == [replace(busy, FUSED_ACT=0, num_stages=4), default_config(64, 8, 32),
                                              decode[0]]
    # 16 per expert: the tl.dot kernel's 64-row tile at 128 and 64 columns, the busy tile, the fused wgmma tile
    near = tuning_configs(64, 8, 32)
    assert near[0] == replace(fused, WGMMA=0, FUSED_ACT=0, num_stages=3) and near[1] == replace(near[0], BLOCK_N=64)
    assert near[2:4] == [busy, fused] and decode[0] in near and decode[0] not in tuning_configs(128, 8, 32)


def test_moe_triton_configs_without_fused_act_are_the_fused_kernel_and_round_trip() -> None:
    """FUSED_ACT: 1 when a mapping lacks it (the rows and records written before it), left out of to_dict
    at 1, so every shipped row and record reads back as it is written; validated like the other fields;
    the plain gate-up (0) reads the quantized activation only."""
    old = {"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4, "QUANT_IN_KERNEL": 1}
    fused = MoeTritonConfig.from_dict(old)
    assert fused.FUSED_ACT == 1 and fused.to_dict() == old
    assert fused == MoeTritonConfig.from_dict({**old, "FUSED_ACT": 1}) and fused.describe() == "moe 16x128 w4 s4 qk"
    plain = MoeTritonConfig.from_dict({**old, "QUANT_IN_KERNEL": 0, "FUSED_ACT": 0})
    assert plain != replace(fused, QUANT_IN_KERNEL=0) and plain.to_dict() == {**old, "QUANT_IN_KERNEL": 0, "FUSED_ACT": 0}
    assert MoeTritonConfig.from_dict(plain.to_dict()) == plain and plain.describe() == "moe 16x128 w4 s4 plain"
    assert MoeTritonConfig(16, 128, 1, 4, 4, 1) == fused  # positional construction unchanged
    for bad in (2, -1, True, 1.0):
        with pytest.raises(ValueError, match="FUSED_ACT"):
            MoeTritonConfig(**{**old, "QUANT_IN_KERNEL": 0, "FUSED_ACT": bad})
    with pytest.raises(ValueError, match=r"QUANT_IN_KERNEL.*FUSED_ACT 0"):
        MoeTritonConfig(**{**old, "FUSED_ACT": 0})
    with pytest.raises(ValueError, match="unknown \\['GATE_UP_N'\\]"):
        MoeTritonConfig.from_dict({**old, "GATE_UP_N": 64})  # the split gate-up, removed
    shipped = json.loads((SHIPPED_DIR / "tuning-nvidia-h200.json").read_text(encoding="utf-8"))
    rows = [row["config"] for group in shipped["moe"] for buckets in group["shapes"].values()
            for row in buckets.values() if row.get("config") is not None]
    records = json.loads((SHIPPED_DIR / "invariance-nvidia-h200.json").read_text(encoding="utf-8"))["records"]
    rows += [s["config"] for r in records if r.get("layout") and r["backend"] == "triton" for s in r["schedule"]]
    assert rows and all(MoeTritonConfig.from_dict(c).to_dict() == c for c in rows)  # as written
    assert {MoeTritonConfig.from_dict(c).FUSED_ACT for c in rows if "FUSED_ACT" not in c} == {1}



def test_the_rules_configurations_in_short() -> None:
    assert [c.describe() for c in (DECODE, BUSY, NEAR, PREFILL, WIDE, LARGE)] == [
        "moe 16x128 w4 s4 g8 plain swap", "moe 32x128 w4 s3 g8 swap", "moe 64x128 w4 s3 g8 plain",
        "moe 64x128 w4 s4 g8 wgmma", "moe 64x256 w4 s4 g8 plain wgmma persistent",
        "moe 128x128 w8 s4 g8 plain wgmma persistent"]
    assert replace(NEAR, GROUP_M=1).describe() == "moe 64x128 w4 s3 plain"
    assert default_config(8, 1, 1) == BUSY  # one expert: every token is its own (8 per expert)


def test_each_field_is_validated_and_the_message_names_it() -> None:
    fields = NEAR.to_dict()
    for key in ("GROUP_M", "num_stages"):
        with pytest.raises(ValueError, match=f"^MoeTritonConfig '{key}' must be a positive int, got 0$"):
            MoeTritonConfig(**{**fields, key: 0})
    assert replace(NEAR, num_warps=1).num_warps == 1  # a power of two
    with pytest.raises(ValueError, match=r"^MoeTritonConfig 'num_warps' must be a power of two, got 3$"):
        replace(NEAR, num_warps=3)
    with pytest.raises(ValueError, match=r"^MoeTritonConfig 'QUANT_IN_KERNEL' must be 0 with FUSED_ACT 0 \(the plain "
                                         r"gate-up reads the quantized activation\)$"):
        replace(NEAR, QUANT_IN_KERNEL=1)
    with pytest.raises(ValueError, match=r"^a MoeTritonConfig must come from a mapping, got list$"):
        MoeTritonConfig.from_dict([("BLOCK_M", 16)])  # type: ignore[arg-type]


def test_the_wgmma_tiles_and_the_persistent_programs_are_checked() -> None:
    assert replace(PREFILL, BLOCK_N=64).BLOCK_N == 64 and replace(WIDE, FUSED_ACT=1, num_stages=3).PERSISTENT == 1
    wgmma = (r"^MoeTritonConfig 'WGMMA' 1 needs BLOCK_M 16 \* num_warps \(a warpgroup's 64 rows per 4 warps\), BLOCK_N "
             r"64 or 128 \(256 with BLOCK_M 64\), and with FUSED_ACT 1 BLOCK_M 64 and QUANT_IN_KERNEL 0, got moe 128x256 "
             r"w8 s4 g8 plain wgmma$")
    with pytest.raises(ValueError, match=wgmma):
        replace(LARGE, BLOCK_N=256, PERSISTENT=0)  # 256 columns on 128 rows: shared memory
    with pytest.raises(ValueError, match=r"^MoeTritonConfig 'SWAP_AB' 1 needs WGMMA 0, got moe 64x128 w4 s4 g8 wgmma$"):
        replace(PREFILL, SWAP_AB=1)
    persistent = (r"^MoeTritonConfig 'PERSISTENT' 1 needs WGMMA 1, and with FUSED_ACT 1 num_stages <= 3 \(shared "
                  r"memory\), got moe 64x256 w4 s4 g8 wgmma persistent$")
    with pytest.raises(ValueError, match=persistent):
        replace(WIDE, FUSED_ACT=1)
    with pytest.raises(ValueError, match=r"PERSISTENT' 1 needs WGMMA 1.*got moe 64x128 w4 s3 g8 plain persistent$"):
        replace(NEAR, PERSISTENT=1)
    assert without_wgmma(DECODE) is DECODE and without_wgmma(PREFILL) is PREFILL and without_wgmma(LARGE) == PREFILL


def test_the_candidates_of_each_range_in_the_order_the_docstring_gives() -> None:
    """From 64 tokens per expert: the rule's three configurations from 64 (nearest first), the fused gate-up with
    its down GEMM on 256 columns (persistent with 3 stages, and not), the 128-row tile one program per tile, the
    tl.dot 64-row tiles, then the fused gate-up on the tl.dot tile (and quantizing in its K loop)."""
    tl_dot = replace(PREFILL, WGMMA=0)
    after = [replace(PREFILL, BLOCK_N=256, num_stages=3, PERSISTENT=1), replace(PREFILL, BLOCK_N=256),
             replace(LARGE, PERSISTENT=0), NEAR, replace(NEAR, BLOCK_N=64)]
    assert tuning_configs(256, 8, 32) == [PREFILL, WIDE, LARGE, *after, tl_dot, replace(tl_dot, QUANT_IN_KERNEL=1)]
    assert tuning_configs(4096, 8, 32)[:3] == [LARGE, WIDE, PREFILL]  # 1024 per expert
    assert tuning_configs(4092, 8, 32)[:3] == [WIDE, LARGE, PREFILL]  # 1023
    # below 8: the 64-row tl.dot tile with 4 stages last before the fused tl.dot tiles; 16 to 63: the fused
    # wgmma gate-up on 256 columns last
    assert tuning_configs(1, 8, 32)[-3] == replace(NEAR, num_stages=4)
    assert tuning_configs(252, 8, 32)[:2] == [NEAR, replace(NEAR, BLOCK_N=64)]  # 63 per expert
    assert tuning_configs(64, 8, 32)[-3] == replace(PREFILL, BLOCK_N=256)
