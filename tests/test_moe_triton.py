"""fp8select's Triton MoE kernels and grouped GEMMs on CPU, under the Triton interpreter.

``TRITON_INTERPRET=1`` is set before triton is first imported (see tests/test_kernels_triton_gemm.py).
Every result is compared with the independent fp64 reference (tests/fp64_moe_reference.py). The
interpreter rounds fp32 -> bf16 by truncation, so errors here run about twice the GPU's; still
well inside 1e-2. Shapes are small: the interpreter runs each program in Python.
"""

from __future__ import annotations

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton in this process

import pytest
import torch
from interpreted import NanEmpty, moe_kernels

pytest.importorskip("triton")

from fp64_moe_reference import expected_moe, grouped_expected, random_moe, random_routing, rel_err, with_strays
from fp64_reference import quantize_groups
from matrix import MATRIX

from fp8select import InvalidDtypeError, InvalidInputError, resolve
from fp8select.grouped import grouped_gemm_contiguous, grouped_gemm_masked
from fp8select.kernels.moe_config import MoeTritonConfig, default_config
from fp8select.kernels.moe_reference import (
    ids_flags_torch,
    quantize_slots_torch,
    silu_mul_quant_torch,
    weighted_sum_torch,
)
from fp8select.kernels.moe_routing import masked_rows, route, row_of_slot
from fp8select.kernels.quant import quantize_per_token_group

moe_triton = moe_kernels()

TOL = 1e-2
CPU_TRITON = dataclasses.replace(MATRIX["cpu-only"][0], packages={"triton": "3.9.0"}, env={"TRITON_INTERPRET": "1"})


def _cfg(block_m: int = 16, quant: int = 1, group_m: int = 1, block_n: int = 32, fused: int = 1) -> MoeTritonConfig:
    return MoeTritonConfig(BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=group_m, num_warps=4, num_stages=2,
                           QUANT_IN_KERNEL=quant if fused else 0, FUSED_ACT=fused)


@pytest.fixture(scope="module")
def problem():  # type: ignore[no-untyped-def]
    return random_moe(4, 256, 128, seed=0)


@pytest.mark.parametrize("fused", [1, 0])
@pytest.mark.parametrize(("config", "skew"), [(_cfg(16, 1), False), (_cfg(32, 0, group_m=8), True)])
def test_experts_match_fp64_with_minus_one_and_idle_experts(problem, config, skew, fused) -> None:  # type: ignore[no-untyped-def]
    config = dataclasses.replace(config, FUSED_ACT=fused, QUANT_IN_KERNEL=config.QUANT_IN_KERNEL * fused)
    experts = moe_triton.TritonExperts(*problem.weights())
    w, ids = random_routing(6, 2, 4, seed=1, skew=skew)
    ids[1, 0] = -1
    x = torch.randn(6, 256).to(torch.bfloat16)
    y = experts(x, w, ids, config)
    assert y.dtype == torch.bfloat16 and rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < TOL


@pytest.mark.parametrize("fused", [1, 0])
def test_ids_outside_the_experts_are_counted_nowhere(problem, fused: int) -> None:  # type: ignore[no-untyped-def]
    """What the layer's ids' check runs after (its read comes after the launches): strays give the -1 result."""
    experts = moe_triton.TritonExperts(*problem.weights())
    w, ids = random_routing(5, 2, 4, seed=5)
    stray, minus = with_strays(ids, 4)
    x = torch.randn(5, 256).to(torch.bfloat16)
    y = experts(x, w, stray, _cfg(16, 0, fused=fused))
    assert rel_err(y, expected_moe(x, *problem.weights(), w, minus)) < TOL


@pytest.mark.parametrize("fused", [1, 0])
def test_partial_groups_and_fp32_input(fused: int) -> None:
    odd = random_moe(3, 200, 96, seed=2)  # H and I not multiples of 128: masked K and N tails
    experts = moe_triton.TritonExperts(*odd.weights())
    w, ids = random_routing(3, 2, 3, seed=3)
    x = torch.randn(3, 200)
    y = experts(x, w, ids, _cfg(16, 0, fused=fused))
    assert y.dtype == torch.float32 and rel_err(y, expected_moe(x, *odd.weights(), w, ids)) < 1e-5 * 100


def test_nan_token_row_and_the_layer_through_the_selection(problem) -> None:  # type: ignore[no-untyped-def]
    moe = resolve(CPU_TRITON, plugins=False).prepare_moe(*problem.weights(), top_k=2)
    assert moe.main_plan.backends == ("triton",)
    w, ids = random_routing(3, 2, 4, seed=4)
    x = torch.randn(3, 256).to(torch.bfloat16)
    x[1, 0] = float("inf")
    y = moe(x, w, ids)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    x[1, 0] = 0.0
    assert rel_err(moe(x, w, ids), expected_moe(x, *problem.weights(), w, ids)) < TOL


@pytest.mark.parametrize(("block_m", "block_n", "group_m"), [(16, 32, 1), (32, 128, 8)])
def test_the_plain_gate_up_is_the_fused_kernels_bits(block_m: int, block_n: int, group_m: int) -> None:
    """FUSED_ACT 0: the grouped GEMM over the 2I columns of w13 (token rows in, fp32 at the sorted rows),
    then silu(gate) * up quantized per 1x128 group by its own kernel. The same fp32 sums and the same
    quantizer as the fused kernel: the same fp8 intermediate and scales at every used row, the same
    output. I = 320 is two and a half groups (a column tile across gate and up at BLOCK_N 128); one
    expert idle, one taking every token; a -1 id; M 0; a token with an inf gets a NaN row."""
    p = random_moe(3, 256, 320, seed=6)
    experts = moe_triton.TritonExperts(*p.weights())
    plain = _cfg(block_m, 0, group_m, block_n, fused=0)
    fused = dataclasses.replace(plain, FUSED_ACT=1)
    ids = torch.tensor([[0, 2], [2, -1], [2, 0], [0, 2], [2, 0]], dtype=torch.int32)  # expert 1 idle, 2 in every token
    w = torch.rand(5, 2, generator=torch.Generator().manual_seed(6))
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    y = experts(x, w, ids, plain)
    assert rel_err(y, expected_moe(x, *p.weights(), w, ids)) < TOL
    assert torch.equal(y, experts(x, w, ids, fused))
    routing = route(ids, 3, block_m)
    used = routing.slot_ids < routing.slots
    (q, scale), (fq, fscale) = experts.gate_up(x, routing, 2, plain), experts.gate_up(x, routing, 2, fused)
    assert q.shape == fq.shape == (routing.rows, 320) and q.dtype == fq.dtype == torch.float8_e4m3fn
    assert torch.equal(q[used].view(torch.uint8), fq[used].view(torch.uint8)) and torch.equal(scale[used], fscale[used])
    x[3, 7] = float("inf")
    y = experts(x, w, ids, plain)
    assert torch.isnan(y[3]).all() and torch.isfinite(y[[0, 1, 2, 4]]).all()
    empty = experts(x[:0], w[:0], ids[:0], plain)
    assert empty.shape == (0, 256) and empty.dtype == torch.bfloat16


def test_the_plain_gate_up_with_every_token_on_one_expert_and_every_id_minus_one(problem) -> None:  # type: ignore[no-untyped-def]
    """40 tokens on expert 1 alone: three blocks of 16 rows of one expert (the last half padding), the
    other experts idle; then every id -1: zeros."""
    experts = moe_triton.TritonExperts(*problem.weights())
    config = _cfg(16, 0, 8, 64, fused=0)
    ids = torch.ones((40, 1), dtype=torch.int32)
    w = torch.rand(40, 1, generator=torch.Generator().manual_seed(8))
    x = torch.randn(40, 256, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    y = experts(x, w, ids, config)
    assert rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < TOL
    assert torch.equal(y, experts(x, w, ids, dataclasses.replace(config, FUSED_ACT=1)))
    assert torch.equal(experts(x, w, torch.full_like(ids, -1), config), torch.zeros_like(x))


@pytest.mark.parametrize("fused", [1, 0])
def test_nan_in_the_padding_rows_never_reaches_an_output(problem, monkeypatch, fused: int) -> None:  # type: ignore[no-untyped-def]
    """Every buffer the op allocates starts as NaN: the rows it leaves unset (the sorted layout's padding,
    and with the plain gate-up their fp32 sums, silu and quantization) stay out of every output."""
    experts = moe_triton.TritonExperts(*problem.weights())
    config = _cfg(16, 0, fused=fused)
    w, ids = random_routing(6, 2, 4, seed=7)
    ids[2, 1] = -1
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    want = experts(x, w, ids, config)
    monkeypatch.setattr(moe_triton, "torch", NanEmpty())
    got = experts(x, w, ids, config)
    assert torch.isfinite(got).all() and torch.equal(got, want)
    h, _ = experts.gate_up(x, route(ids, 4, 16), 2, config)
    assert h.float().isnan().any()  # the padding rows were NaN indeed


def test_silu_mul_quant_and_weighted_sum_agree_with_torch() -> None:
    h = (torch.randn(5, 2 * 192) * 3).to(torch.bfloat16)
    q, s = moe_triton.silu_mul_quant(h, torch.float8_e4m3fn)
    q_ref, s_ref = silu_mul_quant_torch(h, torch.float8_e4m3fn)
    assert torch.allclose(s, s_ref, rtol=1e-5)
    assert (q.float() - q_ref.float()).abs().le(q_ref.float().abs() * 0.07 + 1e-6).all()  # at most one fp8 step
    out = torch.randn(7, 64)
    ids = torch.tensor([[0, -1], [2, 1], [9, 0]], dtype=torch.int32)  # 9: outside E=3
    weights = torch.rand(3, 2)
    row_map = torch.tensor([6, 5, 4, 3, 2, 1], dtype=torch.int64)
    for mapping in (None, row_map, row_map.to(torch.int32)):  # the CUTLASS path passes its int32 map as it is
        got = moe_triton.weighted_sum(out, mapping, ids, weights, 3, torch.float32)
        assert torch.allclose(got, weighted_sum_torch(out, mapping, ids, weights, 3, torch.float32), atol=1e-6)


def test_weighted_sum_skips_a_slot_mapped_past_the_last_row() -> None:
    """A masked layout's dropped slot (a repeated id beyond M slots of one expert) maps one past the end: it adds nothing,
    where reading a clamped row added whatever another slot or unset memory held."""
    out = torch.randn(4, 64)
    ids = torch.tensor([[1, 1], [0, 2]], dtype=torch.int32)
    weights = torch.rand(2, 2)
    row_map = torch.tensor([0, 4, 2, 3], dtype=torch.int64)  # token 0's second slot dropped
    want = torch.stack([weights[0, 0] * out[0], weights[1, 0] * out[2] + weights[1, 1] * out[3]])
    for fn in (moe_triton.weighted_sum, weighted_sum_torch):
        assert torch.allclose(fn(out, row_map, ids, weights, 3, torch.float32), want, atol=1e-6), fn


def test_silu_mul_quant_of_a_masked_layout_computes_each_groups_used_rows() -> None:
    """With counts (a masked [G, group_rows] layout), each group's used rows are the same bits as without;
    the rows past a count are skipped (unset), and a group size the programs cannot tile is refused."""
    groups, group_rows = 3, 32
    h = (torch.randn(groups * group_rows, 2 * 128) * 3).to(torch.bfloat16)
    full_q, full_s = moe_triton.silu_mul_quant(h, torch.float8_e4m3fn)
    counts = torch.tensor([0, 17, 32], dtype=torch.int32)
    q, s = moe_triton.silu_mul_quant(h, torch.float8_e4m3fn, counts, group_rows)
    for g, count in enumerate(counts.tolist()):
        used = slice(g * group_rows, g * group_rows + count)
        assert torch.equal(q[used].view(torch.uint8), full_q[used].view(torch.uint8)) and torch.equal(s[used], full_s[used])
    # A bound on the counts launches programs for that many rows of each group: the used rows the same bits.
    small = torch.tensor([0, 3, 17], dtype=torch.int32)
    for most in (17, 20, 64):
        q, s = moe_triton.silu_mul_quant(h, torch.float8_e4m3fn, small, group_rows, most)
        for g, count in enumerate(small.tolist()):
            used = slice(g * group_rows, g * group_rows + count)
            assert torch.equal(q[used].view(torch.uint8), full_q[used].view(torch.uint8)), (most, g)
            assert torch.equal(s[used], full_s[used]), (most, g)
    with pytest.raises(ValueError, match="group_rows"):
        moe_triton.silu_mul_quant(h, torch.float8_e4m3fn, counts, 24)


def test_silu_mul_quant_of_a_sorted_layout_computes_the_rows_holding_a_slot() -> None:
    """With slot_ids (the sorted layout's), the rows holding a slot are the same bits as without; the
    padding rows (slot_ids == slots) are left unset, whole programs of them skipped."""
    routing = route(torch.tensor([[2, 0], [2, -1], [2, 2]], dtype=torch.int32), 3, 16)
    h = (torch.randn(routing.rows, 2 * 200) * 3).to(torch.bfloat16)
    full_q, full_s = moe_triton.silu_mul_quant(h, torch.float8_e4m3fn)
    q, s = moe_triton.silu_mul_quant(h, torch.float8_e4m3fn, slot_ids=routing.slot_ids, slots=routing.slots)
    used = routing.slot_ids < routing.slots
    assert 0 < int(used.sum()) < routing.rows - 16  # partial blocks, and a block (program) of padding alone
    assert torch.equal(q[used].view(torch.uint8), full_q[used].view(torch.uint8)) and torch.equal(s[used], full_s[used])


def _filled(shape: tuple[int, ...], dtype: torch.dtype, strides: tuple[int, ...] | None = None) -> torch.Tensor:
    """A tensor every element of which is a sentinel (fp8 bits 0x11, scales -7): rows left unset stay so."""
    t = torch.empty_strided(shape, strides or torch.empty(shape).stride(), dtype=dtype)
    if dtype == torch.float32:
        return t.fill_(-7.0)
    t.view(torch.uint8).fill_(0x11)
    return t


@pytest.mark.parametrize("quantize_slots", [moe_triton.quantize_slots, quantize_slots_torch], ids=["triton", "torch"])
def test_quantize_slots_writes_each_slots_token_at_its_row_in_the_vendors_scale_layout(quantize_slots) -> None:  # type: ignore[no-untyped-def]
    """The bits of the quantizer at each slot's row: masked rows with scales MN-major per expert, and sorted rows
    (row_of_slot, checked against slot_ids) with MN-major TMA-aligned scales; -1 and stray ids and the rows no
    slot names are left as they were. NaN in a token's group makes that group's scale and values NaN."""
    x = (torch.randn(5, 300) * 4).to(torch.bfloat16)
    x[3, 140] = float("nan")
    ids = with_strays(torch.tensor([[0, 2], [2, -1], [1, 2], [2, 0], [3, 1]], dtype=torch.int32), 3)[0]
    x_q, x_s = quantize_per_token_group(x, 128, dtype=torch.float8_e4m3fn)
    k, experts, max_m = 2, 3, 4
    flat = ids.reshape(-1)
    # Masked: [E, max_m] rows, scales [E, max_m, G] MN-major per expert.
    routing = route(ids, experts, 1, max_m=max_m, kernel=False)
    rows = masked_rows(routing, experts, max_m)
    q = _filled((experts * max_m, 300), torch.float8_e4m3fn)
    scale = _filled((experts, 3, max_m), torch.float32).transpose(1, 2)
    quantize_slots(x, rows, k, q, scale)
    written = set()
    for slot, expert in enumerate(flat.tolist()):
        if 0 <= expert < experts:
            row = int(rows[slot])
            written.add(row)
            assert torch.equal(q[row].view(torch.uint8), x_q[slot // k].view(torch.uint8))
            assert torch.allclose(scale[row // max_m, row % max_m], x_s[slot // k], rtol=0, atol=0, equal_nan=True)
    assert 0 < len(written) < experts * max_m
    for row in set(range(experts * max_m)) - written:
        assert bool((q[row].view(torch.uint8) == 0x11).all()) and bool((scale[row // max_m, row % max_m] == -7).all())
    # Sorted rows, as DeepGEMM's contiguous layout reads them: scales [R, G] MN-major (R a multiple of 8 here: TMA-aligned).
    routing = route(ids, experts, 8, kernel=False)
    slot_row = row_of_slot(routing)
    q = _filled((routing.rows, 300), torch.float8_e4m3fn)
    scale = _filled((routing.rows, 3), torch.float32, (1, routing.rows))
    quantize_slots(x, slot_row, k, q, scale, slot_ids=routing.slot_ids)
    held = routing.slot_ids < routing.slots
    for row in range(routing.rows):
        if bool(held[row]):
            token = int(routing.slot_ids[row]) // k
            assert torch.equal(q[row].view(torch.uint8), x_q[token].view(torch.uint8))
            assert torch.allclose(scale[row], x_s[token], rtol=0, atol=0, equal_nan=True)
        else:  # padding, and row 0's namesakes: the slots routed nowhere (row_of_slot gives them 0)
            assert bool((q[row].view(torch.uint8) == 0x11).all()) and bool((scale[row] == -7).all())
    assert bool(scale[slot_row[6]].isnan()[1]) and not bool(scale[slot_row[6]].isnan()[0])  # token 3's group 1


def test_quantize_slots_tile_heights_write_what_the_torch_twin_does() -> None:
    """Every tile height the launch picks (1 to 16 tokens a program) and more than one program: the same bits as
    :func:`quantize_slots_torch`, the rows no slot names left as they were."""
    gen = torch.Generator().manual_seed(11)
    for tokens in (1, 2, 3, 9, 33):
        k, experts = 3, 5
        x = (torch.randn(tokens, 256, generator=gen) * 3).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)]).to(torch.int32)
        ids[tokens - 1, 0] = -1
        routing = route(ids, experts, 1, max_m=tokens, kernel=False)
        rows = masked_rows(routing, experts, tokens)
        outs = []
        for fn in (moe_triton.quantize_slots, quantize_slots_torch):
            q = _filled((experts * tokens, 256), torch.float8_e4m3fn)
            scale = _filled((experts, 2, tokens), torch.float32).transpose(1, 2)
            fn(x, rows, k, q, scale)
            outs.append((q.view(torch.uint8), scale))
        assert torch.equal(outs[0][0], outs[1][0]), tokens
        assert torch.equal(outs[0][1], outs[1][1]), tokens
        assert bool((outs[0][0] != 0x11).any()), tokens


@pytest.mark.parametrize("ids_flags", [moe_triton.ids_flags, ids_flags_torch], ids=["triton", "torch"])
def test_ids_flags_find_ids_outside_the_experts_and_repeats_within_a_row(ids_flags) -> None:  # type: ignore[no-untyped-def]
    """The eager check's flags (any block's): an id outside ``[0, E)`` other than -1, and a row repeating an id
    other than -1, wherever they are (a later block of rows, the last column, strided ids); -1 repeated is not."""
    def flags(ids: torch.Tensor) -> tuple[bool, bool]:
        out = ids_flags(ids, 16)
        assert out.dtype == torch.int32 and out.shape[1] == 2
        return bool(out[:, 0].any()), bool(out[:, 1].any())

    gen = torch.Generator().manual_seed(5)
    for m, k, dtype in ((1, 1, torch.int32), (3, 2, torch.int64), (300, 6, torch.int32), (130, 8, torch.int64)):
        ids = torch.stack([torch.randperm(16, generator=gen)[:k] for _ in range(m)]).to(dtype)
        ids[0, k - 1] = -1
        assert flags(ids) == (False, False)
        for bad in (16, -2, 1 << 40 if dtype == torch.int64 else 1 << 30):
            wrong = ids.clone()
            wrong[m - 1, k - 1] = bad  # the last block's last row and column
            assert flags(wrong) == (True, False), (m, k, bad)
        if k > 1:
            twice = ids.clone()
            twice[m - 1, k - 1] = twice[m - 1, 0]
            assert flags(twice) == (False, True)
            minus = ids.clone()
            minus[m - 1, :2] = -1
            assert flags(minus) == (False, False)
            strided = torch.stack([ids, ids], dim=2).reshape(m, 2 * k)[:, ::2]  # each id twice; every other one
            assert not strided.is_contiguous() and flags(strided) == (False, False)
    assert flags(torch.empty((0, 8), dtype=torch.int32)) == (False, False)


@pytest.mark.parametrize("silu", [moe_triton.silu_mul_quant, silu_mul_quant_torch], ids=["triton", "torch"])
def test_silu_mul_quant_writes_its_scales_into_the_layout_given(silu) -> None:  # type: ignore[no-untyped-def]
    """The same bits as row-major scales, written MN-major per group of rows (the masked layout) or MN-major over
    all rows; the returned scale is the tensor given."""
    groups, group_rows = 2, 16
    h = (torch.randn(groups * group_rows, 2 * 256) * 3).to(torch.bfloat16)
    full_q, full_s = silu(h, torch.float8_e4m3fn)
    counts = torch.tensor([group_rows, group_rows], dtype=torch.int32)
    per_expert = torch.empty((groups, 2, group_rows)).transpose(1, 2)
    q, s = silu(h, torch.float8_e4m3fn, counts, group_rows, scale=per_expert)
    assert s is per_expert and torch.equal(s.reshape(-1, 2), full_s)
    assert torch.equal(q.view(torch.uint8), full_q.view(torch.uint8))
    mn_major = torch.empty_strided((groups * group_rows, 2), (1, groups * group_rows))
    q, s = silu(h, torch.float8_e4m3fn, scale=mn_major)
    assert s is mn_major and torch.equal(s, full_s) and torch.equal(q.view(torch.uint8), full_q.view(torch.uint8))


def _rows(e: int, n: int, k: int, rows: int, seed: int = 5):  # type: ignore[no-untyped-def]
    p = random_moe(e, k, n // 2, seed=seed)  # w13 [E, n, k]
    a_q, a_s = quantize_groups(torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)))
    return p.w13, p.s13, a_q.contiguous(), a_s.to(torch.float32)


def test_public_grouped_gemms_match_fp64() -> None:
    w, s, a, a_s = _rows(3, 64, 256, 10)
    expert_of_row = torch.tensor([2, 0, -1, 2, 1, 1, 0, 2, -1, 0], dtype=torch.int32)  # any order, padding rows
    want = grouped_expected(a, a_s, w, s, expert_of_row)
    used = expert_of_row >= 0
    for backend in ("triton", "reference", "auto"):
        got = grouped_gemm_contiguous(a, a_s, w, s, expert_of_row, backend=backend)
        assert rel_err(got[used], want[used]) < TOL, backend
    masked_m = torch.tensor([2, 0, 3], dtype=torch.int32)
    a3, s3 = a[:9].reshape(3, 3, 256), a_s[:9].reshape(3, 3, 2)
    rows = torch.tensor([0, 0, -1, -1, -1, -1, 2, 2, 2])
    want = grouped_expected(a3.reshape(9, 256), s3.reshape(9, 2), w, s, rows).view(3, 3, -1)
    for backend in ("triton", "reference"):
        got = grouped_gemm_masked(a3, s3, w, s, masked_m, backend=backend, out_dtype=torch.float32)
        assert rel_err(got[0, :2], want[0, :2]) < TOL and rel_err(got[2], want[2]) < TOL, backend


def test_public_grouped_gemms_check_their_arguments() -> None:
    w, s, a, a_s = _rows(2, 64, 256, 4)
    rows = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(InvalidDtypeError, match="a: expected dtype float8_e4m3fn"):
        grouped_gemm_contiguous(a.float(), a_s, w, s, rows)
    with pytest.raises(InvalidInputError, match="a_scale: expected shape"):
        grouped_gemm_contiguous(a, a_s[:, :1], w, s, rows)
    with pytest.raises(InvalidInputError, match="backend: expected one of"):
        grouped_gemm_contiguous(a, a_s, w, s, rows, backend="cublas")
    with pytest.raises(InvalidInputError, match="expert_of_row: expected shape"):
        grouped_gemm_contiguous(a, a_s, w, s, rows[:2])


def test_pdl_launches_only_the_transposed_tiles_at_decode_behind_the_quantizer() -> None:
    rule = default_config(1, 8, 32)
    assert moe_triton.launches_with_pdl(rule, 1) and moe_triton.launches_with_pdl(rule, 16)
    assert not moe_triton.launches_with_pdl(rule, 17)  # prefill-sized launches: not measured with it
    assert not moe_triton.launches_with_pdl(dataclasses.replace(rule, SWAP_AB=0), 1)  # 1.02-1.03x at M 1 (H100)
    fused = dataclasses.replace(rule, FUSED_ACT=1, num_stages=3)
    assert moe_triton.launches_with_pdl(fused, 1)
    # the activation quantized in the gate-up's K loop: the routing is the launch before, which the gate-up's
    # reads before its wait (the block's expert) would race
    assert not moe_triton.launches_with_pdl(dataclasses.replace(fused, QUANT_IN_KERNEL=1), 1)
    assert not moe_triton.launches_with_pdl(default_config(64, 8, 32), 16)  # the wgmma tile
    p = random_moe(4, 256, 128)
    experts = moe_triton.TritonExperts(p.w13, p.s13, p.w2, p.s2)
    assert not experts._pdl  # nowhere but compiled kernels on CUDA sm90+


def test_a_wgmma_config_is_checked_and_runs_the_tl_dot_kernels_where_the_gluon_one_cannot(problem) -> None:  # type: ignore[no-untyped-def]
    """``WGMMA`` 1 needs a warpgroup's rows per 4 warps (and 64-row tiles with the fused gate-up); off Hopper
    (here: the interpreter) the same tiles run on the ``tl.dot`` kernels, bit for bit the ``WGMMA`` 0 op; rows
    written before the key read back as ``WGMMA`` 0, and ``tune --moe`` times the wgmma tiles."""
    from fp8select.kernels.moe_config import tuning_configs

    wgmma = MoeTritonConfig(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                            FUSED_ACT=0, WGMMA=1)
    for bad in ({"FUSED_ACT": 1, "BLOCK_M": 128, "num_warps": 8}, {"FUSED_ACT": 1, "QUANT_IN_KERNEL": 1},
                {"BLOCK_M": 128}, {"BLOCK_N": 32}):
        with pytest.raises(ValueError, match="WGMMA"):
            MoeTritonConfig(**{**wgmma.to_dict(), **bad})
    fused = MoeTritonConfig(**{**wgmma.to_dict(), "FUSED_ACT": 1})  # the fused gate-up on 64-row tiles
    assert wgmma.describe().endswith(" wgmma") and MoeTritonConfig.from_dict(wgmma.to_dict()) == wgmma
    assert "WGMMA" not in default_config(1, 8, 32).to_dict()  # the old rows' form
    assert wgmma in tuning_configs(64, 8, 32) and fused == tuning_configs(512, 8, 32)[0]
    assert dataclasses.replace(wgmma, BLOCK_M=128, num_warps=8) in tuning_configs(4096, 8, 32)
    x, w, ids = _inputs_for(problem, 5)
    experts = moe_triton.TritonExperts(*problem.weights())
    plain = dataclasses.replace(wgmma, WGMMA=0)
    assert torch.equal(experts(x, w, ids, wgmma), experts(x, w, ids, plain))
    assert torch.equal(experts(x, w, ids, fused), experts(x, w, ids, plain))  # the plain structure there


def test_a_persistent_config_is_checked_and_runs_the_rules_prefill_tiles_where_the_gluon_kernels_cannot(problem) -> None:  # type: ignore[no-untyped-def]
    """``PERSISTENT`` 1 needs the ``wgmma`` kernels, and the fused gate-up at most 3 stages (its shared memory);
    rows without the key read back as 0. Off Hopper (here: the interpreter) its tiles, chosen for the ``wgmma``
    kernels, would not fit some GPUs' shared memory on the ``tl.dot`` ones: the op runs the rule's configuration
    at 64-255 tokens per expert instead, bit for bit."""
    from fp8select.kernels.moe_config import tuning_configs, without_wgmma

    rule = default_config(8192, 8, 8)
    assert rule.PERSISTENT and rule.describe().endswith(" wgmma persistent")
    assert MoeTritonConfig.from_dict(rule.to_dict()) == rule
    below = default_config(255, 8, 8)  # 255 tokens per expert
    assert "PERSISTENT" not in below.to_dict()  # the rows before the key
    for bad in ({"WGMMA": 0}, {"FUSED_ACT": 1, "BLOCK_M": 64, "num_warps": 4, "num_stages": 4}):
        with pytest.raises(ValueError, match="PERSISTENT"):
            MoeTritonConfig(**{**rule.to_dict(), **bad})
    MoeTritonConfig(**{**rule.to_dict(), "FUSED_ACT": 1, "BLOCK_M": 64, "num_warps": 4, "num_stages": 3})
    assert without_wgmma(rule) == below and without_wgmma(default_config(256, 8, 8)) == below
    assert without_wgmma(below) == below
    assert all(c.PERSISTENT for c in tuning_configs(8192, 8, 8)[:2])  # load-time measurement's two
    x, w, ids = _inputs_for(problem, 5)
    experts = moe_triton.TritonExperts(*problem.weights())
    assert torch.equal(experts(x, w, ids, rule), experts(x, w, ids, below))


def test_on_gfx942_the_experts_become_e4m3fnuz_and_match_fp64_on_that_grid(problem) -> None:  # type: ignore[no-untyped-def]
    """gfx942's Triton multiplies e4m3fnuz: the backend converts e4m3fn experts at prepare (the same values,
    scales doubled) and the kernels quantize the activations onto e4m3fnuz (``amax / 240``), as the dense
    Triton backend does there: within 1e-2 of the fp64 semantics on that grid, and of the e4m3fn semantics
    within the two grids' difference (about 6e-2 here, as AITER's on gfx942); -1 ids contribute nothing."""
    from fp8select.backends.moe import MoeProblem, MoeWeights, TritonMoe
    from fp8select.kernels.moe_config import default_config as rule

    mi300x = MATRIX["mi300x"][0]
    backend = TritonMoe()
    assert backend.supports(MoeProblem(problem.experts, problem.hidden, problem.inter, 2), mi300x, "sorted").ok
    prepared = backend.prepare(MoeWeights(*problem.weights(), (128, 128)), mi300x)
    assert prepared.w13.dtype == prepared.w2.dtype == torch.float8_e4m3fnuz
    assert torch.equal(prepared.w13_scale, problem.weights()[1] * 2)
    for m in (1, 7):
        x, w, ids = _inputs_for(problem, m)
        ids[0, -1] = -1
        y = backend.bind(prepared, "sorted", dataclasses.replace(rule(m, 2, problem.experts), BLOCK_N=32), mi300x)(x, w, ids)
        on_grid = expected_moe(x, *problem.weights(), w, ids, fp8=torch.float8_e4m3fnuz)
        assert rel_err(y, on_grid) < TOL
        assert rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < 10 * TOL


@pytest.mark.parametrize(("block_m", "block_n"), [(16, 32), (32, 64)])
def test_the_transposed_tile_is_the_plain_structure_and_within_1e2(problem, block_m: int, block_n: int) -> None:  # type: ignore[no-untyped-def]
    """``SWAP_AB`` 1: both GEMMs on ``[BLOCK_N, BLOCK_M]`` tiles (weights on the MMA's wide side), of the plain
    structure and of the fused one (whose gate-up tile is 128 columns of gate and of up; also quantizing its
    tokens in the K loop), the same products
    and scales as the normal tiles (the interpreter sums K in another order: within 1e-3 of them) and within
    1e-2 of fp64, under skew with -1 ids; a NaN token's row NaN; checked as a config."""
    plain = MoeTritonConfig(BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=8, num_warps=4, num_stages=2,
                            QUANT_IN_KERNEL=0, FUSED_ACT=0)
    fused = dataclasses.replace(plain, FUSED_ACT=1)
    for normal in (plain, fused, dataclasses.replace(fused, QUANT_IN_KERNEL=1)):
        swap = dataclasses.replace(normal, SWAP_AB=1)
        assert swap.describe().endswith(" swap") and MoeTritonConfig.from_dict(swap.to_dict()) == swap
        with pytest.raises(ValueError, match="SWAP_AB"):
            MoeTritonConfig(**{**plain.to_dict(), "SWAP_AB": 1, "WGMMA": 1, "BLOCK_M": 64, "BLOCK_N": 128})
        experts = moe_triton.TritonExperts(*problem.weights())
        for m, skew in ((1, False), (9, True)):
            w, ids = random_routing(m, 2, problem.experts, seed=m, skew=skew)
            ids[0, -1] = -1
            x = torch.randn(m, problem.hidden, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
            y = experts(x, w, ids, swap)
            assert rel_err(y, expected_moe(x, *problem.weights(), w, ids)) < TOL
            assert rel_err(y, experts(x, w, ids, normal)) < 1e-3
        x[m - 1, 3] = float("nan")
        y = experts(x, w, ids, swap)
        assert torch.isnan(y[m - 1]).all() and torch.isfinite(y[: m - 1]).all()


def _inputs_for(problem, m: int):  # type: ignore[no-untyped-def]
    w, ids = random_routing(m, 2, problem.experts, seed=m)
    return torch.randn(m, problem.hidden, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16), w, ids


def test_tune_moe_times_the_triton_configurations_through_the_real_kernels(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The tuner binds each candidate configuration of the rule's neighbourhood, checks it against the
    reference and keeps the fastest (the clock faked: the interpreter has no CUDA graphs)."""
    from fp8select.kernels.moe_config import tuning_configs
    from fp8select.measure import timing, tune_moe
    from fp8select.measure.timing import Timing

    candidates = {"0": 5.0, "1": 3.0}  # timed together under each routing; then the routes, at 1.0
    monkeypatch.setattr(timing, "time_graphs",
                        lambda cols, replays=50, **kw: {c: Timing(*(candidates.get(c, 1.0),) * 3) for c in cols})
    sel = resolve(CPU_TRITON, plugins=False, tuning=False)
    table, rows = tune_moe.tune_moe(sel, [(4, 256, 128, 2)], ms=(1,), max_configs=2, device="cpu")
    checked = [r for r in rows if "rel_err" in r]
    assert len(checked) == 2 and all(r["rel_err"] < 1e-2 for r in checked)
    assert table["moe"][0]["shapes"]["4,256,128,2"]["1"]["config"] == tuning_configs(1, 2, 4)[1].to_dict()
