"""The ``@triton.jit`` kernels of fp8select's Triton MoE experts op (launched by :mod:`.moe_triton`).

Rows are the sorted, block-padded slots of :func:`.moe_routing.route`: block ``b`` of ``BLOCK_M``
rows belongs to expert ``block_expert[b]`` (-1: unused, the program returns at once) and row ``r``
holds slot ``slot_ids[r]`` (token ``slot // TOP_K``; ``slots`` marks a padding row, masked).
BLOCK_K is the 128-element scale group, so each K step is one fp8 ``tl.dot`` rescaled into an fp32
accumulator by the activation's per-row scale times the weight's per-block scale.

* ``_gate_up_kernel`` (the fused structure): ``[BLOCK_M, 128]`` of gate and the same columns of up
  per program (two accumulators), then ``silu(gate) * up`` in fp32 quantized per 1x128 group in
  registers (the tile is exactly one group): the fp8 intermediate and its scales are written at the
  sorted row.
* ``_grouped_gemm_kernel``: the plain grouped GEMM on fp8 rows, one ``[BLOCK_M, BLOCK_N]``
  accumulator. ``A_ROWS`` says which row of ``a_ptr`` a sorted row reads (the sorted row itself, its
  slot, or its token ``slot // TOP_K``), ``OUT_SORTED`` where its output goes (its slot, or the sorted
  row). It runs the down GEMM (sorted rows in, slots out), the plain structure's gate-up over all
  ``2I`` columns (tokens in, sorted rows out, fp32) and the public grouped GEMMs (slots in and out).
* ``_weighted_sum_kernel``: ``y[t] = sum_j w[t, j] * out[row(t * k + j)]`` over the slots routed
  somewhere, in fp32, cast once.
* ``_ids_check_kernel``: whether the ids hold one outside ``[0, E)`` other than -1, or a row repeating
  one (the eager call's input check, in one launch).

Non-finite activations follow :mod:`.quant`: a NaN or inf in a token's group makes its scale and
values NaN, so the token's gate-up rows, their quantized product and its output row are NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_pdl import pdl_enter, prefetch_l2
from .triton_quant import fp8_group_quantize

# The per-call size: one compiled kernel serves every M. The row strides are a layer's (H, I, 2I and the
# scales' groups), so Triton specializes them (divisible by 16): its loads and stores along a row are then
# vectorized. Left unspecialized, as they were, the same kernels took 1.04-1.09x the time with the
# 64 x 128 `tl.dot` tile and 1.2-1.7x with the fused gate-up (H200, DeepSeek-V3 32 experts and
# Qwen3-30B-A3B at M 1-512; the same bits).
_NOT_SPECIALIZED = ["slots"]


@triton.jit
def _block_tile(pid, num_blocks, num_n, GROUP_M: tl.constexpr):
    """(row block, column tile) of program ``pid``: GROUP_M neighbouring row blocks (an expert's, at
    prefill) take each weight column tile in turn while it is in L2."""
    per_group = GROUP_M * num_n
    first = (pid // per_group) * GROUP_M
    rows = tl.minimum(num_blocks - first, GROUP_M)
    return first + (pid % per_group) % rows, (pid % per_group) // rows


@triton.jit
def silu_mul(gate, up):
    """``silu(gate) * up`` in fp32, written once: every gate-up structure (this module's fused and plain ones,
    and :mod:`.gluon_moe`'s fused one) computes it so, and their quantized outputs are the same bits."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _scaled_dot(a, b, a_scale, b_scale, SWAP_AB: tl.constexpr, B_SCALAR: tl.constexpr):
    """``a @ b`` (``[rows, K] x [K, cols]``) times ``a_scale[row] * b_scale`` (one per column, or one for all
    with ``B_SCALAR``). ``SWAP_AB``: computed and returned transposed, ``[cols, rows]`` (the weight's columns
    on the MMA's wide side, as the dense decode kernel does: on Hopper a 16-row tile in the normal
    orientation runs on the older ``mma.sync`` path), the same products and scales per element."""
    if SWAP_AB:
        d = tl.dot(tl.trans(b), tl.trans(a))
        if B_SCALAR:
            scaled = d * (b_scale * a_scale)[None, :]
        else:
            scaled = d * (b_scale[:, None] * a_scale[None, :])
    else:
        d = tl.dot(a, b)
        if B_SCALAR:
            scaled = d * (b_scale * a_scale)[:, None]
        else:
            scaled = d * (a_scale[:, None] * b_scale[None, :])
    return scaled


@triton.jit
def _prefetch_rows(row_ptrs, K, PREFETCH_K: tl.constexpr):
    """Ask L2 for the first ``PREFETCH_K`` K steps (128 fp8 a row each) of the weight rows at ``row_ptrs``."""
    for kb in tl.static_range(PREFETCH_K):
        if kb * 128 < K:
            prefetch_l2(row_ptrs + kb * 128)


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _gate_up_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, slot_ids_ptr, block_expert_ptr, q_ptr, qs_ptr,
    slots, num_blocks, H, INTER,
    stride_xm, stride_xsm, stride_we, stride_wn, stride_wse, stride_wsn, stride_qm, stride_qsm,
    eps,
    TOP_K: tl.constexpr, QUANT_IN_KERNEL: tl.constexpr, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MANT_BITS: tl.constexpr, FP8_MIN_EXP_BIASED: tl.constexpr,
    FP8_NAN_BITS: tl.constexpr, HW_RNE: tl.constexpr, SWAP_AB: tl.constexpr = False, PDL: tl.constexpr = False,
    PREFETCH_K: tl.constexpr = 0,
):
    """``q[r, n] = quant(silu(x_r @ W_gate.T) * (x_r @ W_up.T))`` for one block and 128 columns.
    ``SWAP_AB``: both products on the transposed tile (the weight rows on the MMA's wide side, as
    :func:`_grouped_gemm_kernel` does), transposed back before the activation. ``PDL`` and
    ``PREFETCH_K`` as there (the gate and up rows both; behind the activation's quantizer only, whose
    own wait saw the routing finish: not with ``QUANT_IN_KERNEL``, where the routing is the kernel before).

    ``x_ptr``: the bf16/fp16/fp32 activation ``[M, H]`` (``QUANT_IN_KERNEL``: quantized here, per K
    step) or its fp8 quantization with row-major scales ``xs_ptr``. ``w_ptr``: ``[E, 2I, H]`` fp8,
    K-contiguous; ``ws_ptr``: ``[E, ceil(2I/128), ceil(H/128)]`` with unit stride along K blocks.
    ``q_ptr``: ``[rows, I]`` fp8 with scales ``qs_ptr`` ``[rows, ceil(I/128)]``.
    """
    pid = tl.program_id(0)
    num_n = tl.cdiv(INTER, 128)
    block, pid_n = _block_tile(pid, num_blocks, num_n, GROUP_M)
    expert = tl.load(block_expert_ptr + block)
    lane = tl.arange(0, 128)
    cols = pid_n * 128 + lane
    col_ok = cols < INTER
    gate_rows = tl.where(col_ok, cols, 0).to(tl.int64)
    up_rows = gate_rows + INTER
    w_base = w_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_we
    if PDL:
        if expert >= 0:
            _prefetch_rows(w_base + gate_rows * stride_wn, H, PREFETCH_K)
            _prefetch_rows(w_base + up_rows * stride_wn, H, PREFETCH_K)
        pdl_enter(True)
    if expert < 0:
        return
    offs_r = block * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(slot_ids_ptr + offs_r)
    row_ok = slot < slots
    token = tl.where(row_ok, slot // TOP_K, 0).to(tl.int64)
    ws_base = ws_ptr + expert.to(tl.int64) * stride_wse
    gate_scale_rows = ws_base + (gate_rows // 128) * stride_wsn
    up_scale_rows = ws_base + (up_rows // 128) * stride_wsn
    # the scales one K step ahead, as in _grouped_gemm_kernel
    k_blocks = tl.cdiv(H, 128)
    sg_next = tl.load(gate_scale_rows)
    su_next = tl.load(up_scale_rows)
    if not QUANT_IN_KERNEL:
        a_scale_next = tl.load(xs_ptr + token * stride_xsm)
    acc_gate = tl.zeros((128, BLOCK_M) if SWAP_AB else (BLOCK_M, 128), dtype=tl.float32)
    acc_up = tl.zeros((128, BLOCK_M) if SWAP_AB else (BLOCK_M, 128), dtype=tl.float32)
    for kb in range(0, k_blocks):
        kb_next = tl.minimum(kb + 1, k_blocks - 1)
        sg = sg_next
        su = su_next
        sg_next = tl.load(gate_scale_rows + kb_next)
        su_next = tl.load(up_scale_rows + kb_next)
        offs_k = kb * 128 + lane
        k_ok = offs_k < H
        a_mask = row_ok[:, None] & k_ok[None, :]
        a = tl.load(x_ptr + token[:, None] * stride_xm + offs_k[None, :], mask=a_mask, other=0.0)
        b_mask = k_ok[:, None] & col_ok[None, :]
        wg = tl.load(w_base + gate_rows[None, :] * stride_wn + offs_k[:, None], mask=b_mask, other=0.0)
        wu = tl.load(w_base + up_rows[None, :] * stride_wn + offs_k[:, None], mask=b_mask, other=0.0)
        if QUANT_IN_KERNEL:
            a, a_scale = fp8_group_quantize(a, eps, wg.dtype, False, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED,
                                            FP8_NAN_BITS, HW_RNE)
        else:
            a_scale = a_scale_next
            a_scale_next = tl.load(xs_ptr + token * stride_xsm + kb_next)
        acc_gate += _scaled_dot(a, wg, a_scale, sg, SWAP_AB, False)
        acc_up += _scaled_dot(a, wu, a_scale, su, SWAP_AB, False)
    if SWAP_AB:
        acc_gate = tl.trans(acc_gate)
        acc_up = tl.trans(acc_up)
    act = silu_mul(acc_gate, acc_up)
    act = tl.where(col_ok[None, :], act, 0.0)  # padding lanes are 0, as the group quantizer requires
    q, q_scale = fp8_group_quantize(act, eps, q_ptr.dtype.element_ty, False, FP8_MAX, FP8_MANT_BITS,
                                    FP8_MIN_EXP_BIASED, FP8_NAN_BITS, HW_RNE)
    rows64 = offs_r.to(tl.int64)
    tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :], q, mask=row_ok[:, None] & col_ok[None, :])
    tl.store(qs_ptr + rows64 * stride_qsm + pid_n, q_scale, mask=row_ok)


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def _grouped_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, slot_ids_ptr, block_expert_ptr, out_ptr,
    slots, num_blocks, N, K,
    stride_am, stride_asm, stride_ask, stride_we, stride_wn, stride_wse, stride_wsn, stride_om,
    A_ROWS: tl.constexpr, OUT_SORTED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr, TOP_K: tl.constexpr = 1, SWAP_AB: tl.constexpr = False, PDL: tl.constexpr = False,
    PREFETCH_K: tl.constexpr = 0,
):
    """``out[o] = dequant(a[i]) @ dequant(W[expert]).T`` for one block and BLOCK_N columns.

    ``a_ptr``: fp8 ``[*, K]``, K-contiguous, with fp32 scales ``as_ptr`` (one per 1x128 group). For
    sorted row ``r`` holding slot ``s``: ``i`` is ``r`` (``A_ROWS`` 0), ``s`` (1) or ``s // TOP_K``
    (2), and ``o`` is ``s``, or ``r`` with ``OUT_SORTED``. Padding rows load zeros and store nothing.
    ``SWAP_AB`` computes the transposed tile ``[BLOCK_N, BLOCK_M] = W_tile @ A_tile^T`` (the weight rows on
    the MMA's wide side, as the dense decode kernel does: on Hopper a 16-row tile in the normal
    orientation runs on the older ``mma.sync`` path), the same products and scales per output element.
    ``PDL``: launched with programmatic dependent launch behind a kernel of this op (:mod:`.moe_triton`):
    before its wait the program asks L2 for its weight tile's first ``PREFETCH_K`` K steps, so the
    weights stream while the previous kernel finishes (the expert of its block, read before the wait,
    was written by the routing two or more launches back: the previous kernel let this one launch only
    after its own wait, so the routing had completed; :func:`.triton_pdl.prefetch_l2`).
    """
    pid = tl.program_id(0)
    block, pid_n = _block_tile(pid, num_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + block)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_rows = tl.where(col_ok, cols, 0).to(tl.int64)
    w_base = w_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_we
    if PDL:
        if expert >= 0:
            _prefetch_rows(w_base + w_rows * stride_wn, K, PREFETCH_K)
        pdl_enter(True)
    if expert < 0:
        return
    offs_r = block * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(slot_ids_ptr + offs_r)
    row_ok = slot < slots
    if A_ROWS == 0:
        a_rows = offs_r.to(tl.int64)
    elif A_ROWS == 1:
        a_rows = tl.where(row_ok, slot, 0).to(tl.int64)
    else:
        a_rows = tl.where(row_ok, slot // TOP_K, 0).to(tl.int64)
    ws_base = ws_ptr + expert.to(tl.int64) * stride_wse
    if BLOCK_N <= 128:  # the tile lies in one 128-row scale block: one weight scale per K step
        b_scale_ptr = ws_base + (pid_n * BLOCK_N // 128) * stride_wsn
    else:
        b_scale_ptr = ws_base + (w_rows // 128) * stride_wsn
    a_scale_ptr = as_ptr + a_rows * stride_asm
    lane = tl.arange(0, 128)
    if OUT_SORTED:
        out_rows = offs_r.to(tl.int64)
    else:
        out_rows = tl.where(row_ok, slot, 0).to(tl.int64)
    # The scales are loaded one K step ahead: the pipeliner prefetches the dot operands only, and at
    # decode a step is short enough that an exposed L2 round trip per step is a large share of it.
    k_blocks = tl.cdiv(K, 128)
    b_scale_next = tl.load(b_scale_ptr)
    a_scale_next = tl.load(a_scale_ptr, mask=row_ok, other=0.0)
    # SWAP_AB: the transposed tile, weight rows first (the same products and scales per element)
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, k_blocks):
        kb_next = tl.minimum(kb + 1, k_blocks - 1)
        b_scale = b_scale_next
        a_scale = a_scale_next
        b_scale_next = tl.load(b_scale_ptr + kb_next)
        a_scale_next = tl.load(a_scale_ptr + kb_next * stride_ask, mask=row_ok, other=0.0)
        offs_k = kb * 128 + lane
        k_ok = offs_k < K
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)
        b = tl.load(w_base + w_rows[None, :] * stride_wn + offs_k[:, None], mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)
        acc += _scaled_dot(a, b, a_scale, b_scale, SWAP_AB, BLOCK_N <= 128)
    if SWAP_AB:
        acc = tl.trans(acc)
    tl.store(out_ptr + out_rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["R"])
def _weighted_sum_kernel(
    out_ptr, row_map_ptr, ids_ptr, w_ptr, y_ptr, H, E, R, stride_om, stride_ym,
    TOP_K: tl.constexpr, HAS_MAP: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False,
):
    """``y[t, cols] = sum_j w[t, j] * out[row(t, j), cols]`` over the slots whose id is in ``[0, E)``;
    ``row(t, j)`` is the slot itself or, with ``HAS_MAP``, ``row_map[slot]``, and a slot whose mapped row is
    ``R`` (``out``'s rows) or more is skipped (a masked layout's dropped slot). The token's ``k`` rows are
    one load (their ids, weights and rows loaded together, not one after another: at decode the chain
    of dependent loads was the kernel's time)."""
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    j = tl.arange(0, triton.next_power_of_2(TOP_K))
    slot = token * TOP_K + j
    expert = tl.load(ids_ptr + slot, mask=j < TOP_K, other=-1)
    used = (j < TOP_K) & (expert >= 0) & (expert < E)
    row = slot.to(tl.int64)  # (rows x H passes 2^31 elements from about 300k rows)
    if HAS_MAP:
        row = tl.load(row_map_ptr + slot, mask=used, other=0).to(tl.int64)  # int32 or int64 maps
        used = used & (row < R)
    weight = tl.load(w_ptr + slot, mask=used, other=0.0).to(tl.float32)
    rows = tl.load(out_ptr + row[:, None] * stride_om + cols[None, :], mask=used[:, None] & col_ok[None, :], other=0.0)
    acc = tl.sum(weight[:, None] * rows.to(tl.float32), axis=0)
    tl.store(y_ptr + token * stride_ym + cols, acc.to(y_ptr.dtype.element_ty), mask=col_ok)


# The per-call sizes are not specialized (one compiled kernel serves every M); the strides, fixed by the
# layer's I, are: known multiples of 16, the row loads and stores are vectorized (1.3-1.5x the time
# without, at decode on the H200).
@triton.jit(do_not_specialize=["R", "SCALE_ROWS", "GROUP_ROWS", "GROUP_BLOCKS", "slots"])
def _silu_mul_quant_kernel(
    h_ptr, q_ptr, s_ptr, counts_ptr, slot_ids_ptr, R, INTER, stride_hm, stride_qm, stride_sb, stride_sm, stride_sg,
    SCALE_ROWS, GROUP_ROWS, GROUP_BLOCKS, slots, eps,
    BLOCK_R: tl.constexpr, HAS_COUNTS: tl.constexpr, HAS_SLOTS: tl.constexpr, FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr, FP8_MIN_EXP_BIASED: tl.constexpr, FP8_NAN_BITS: tl.constexpr, HW_RNE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """``q[r, g] , s[r, g] = quant(silu(h[r, gate g]) * h[r, up g])`` for BLOCK_R rows and one 1x128 group of
    a ``[R, 2I]`` GEMM output (a vendor's grouped GEMM, which writes gate and up in bf16). With
    ``HAS_COUNTS`` the rows are groups of ``GROUP_ROWS`` (a multiple of BLOCK_R), of which the programs
    cover the first ``GROUP_BLOCKS`` blocks of BLOCK_R rows each (a bound on every count), and a program
    whose rows start at or past its group's ``counts`` returns at once (a masked layout's unused rows).
    With ``HAS_SLOTS`` the rows are the sorted layout's: a row whose ``slot_ids`` entry is ``slots`` or
    more (padding) is skipped, and a program with none used returns at once. Row ``r``'s scale of group ``g``
    goes to ``s[r // SCALE_ROWS, r % SCALE_ROWS, g]`` through the strides (row-major, MN-major, or MN-major per
    expert: DeepGEMM's layouts)."""
    pdl_enter(PDL)
    if HAS_COUNTS:
        group_of_rows = tl.program_id(0) // GROUP_BLOCKS
        start = (tl.program_id(0) % GROUP_BLOCKS) * BLOCK_R
        if start >= tl.load(counts_ptr + group_of_rows):
            return
        start += group_of_rows * GROUP_ROWS
    else:
        start = tl.program_id(0) * BLOCK_R
    rows = start + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    if HAS_SLOTS:
        row_ok = row_ok & (tl.load(slot_ids_ptr + rows, mask=row_ok, other=slots) < slots)
        if tl.max(row_ok.to(tl.int32), axis=0) == 0:
            return
    group = tl.program_id(1)
    cols = group * 128 + tl.arange(0, 128)
    mask = row_ok[:, None] & (cols < INTER)[None, :]
    base = h_ptr + rows.to(tl.int64)[:, None] * stride_hm + cols[None, :]
    gate = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + INTER, mask=mask, other=0.0).to(tl.float32)
    act = tl.where(mask, silu_mul(gate, up), 0.0)
    q, scale = fp8_group_quantize(act, eps, q_ptr.dtype.element_ty, False, FP8_MAX, FP8_MANT_BITS,
                                  FP8_MIN_EXP_BIASED, FP8_NAN_BITS, HW_RNE)
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_qm + cols[None, :], q, mask=mask)
    _store_scales(s_ptr, rows, group, SCALE_ROWS, stride_sb, stride_sm, stride_sg, scale, row_ok)


@triton.jit
def _store_scales(s_ptr, rows, group, ROWS_PER_BLOCK, stride_sb, stride_sm, stride_sg, scale, mask):
    """Row ``r``'s scale of ``group`` into ``s[r // ROWS_PER_BLOCK, r % ROWS_PER_BLOCK, group]`` (strides in elements)."""
    rows64 = rows.to(tl.int64)
    block = rows64 // ROWS_PER_BLOCK
    tl.store(s_ptr + block * stride_sb + (rows64 - block * ROWS_PER_BLOCK) * stride_sm + group * stride_sg, scale,
             mask=mask)


@triton.jit(do_not_specialize=["TOKENS", "LIMIT", "ROWS_PER_BLOCK"])
def _quant_slots_kernel(
    x_ptr, dest_ptr, slot_ids_ptr, q_ptr, s_ptr, TOKENS, K, LIMIT, stride_xm, stride_qm, stride_sb, stride_sm,
    stride_sg, ROWS_PER_BLOCK, eps,
    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, HAS_SLOTS: tl.constexpr, FP8_MAX: tl.constexpr,
    FP8_MANT_BITS: tl.constexpr, FP8_MIN_EXP_BIASED: tl.constexpr, FP8_NAN_BITS: tl.constexpr, HW_RNE: tl.constexpr,
):
    """For BLOCK_T tokens and one 1x128 group: each token's row of ``x`` quantized once, as :mod:`.triton_quant`
    does, then stored for each of its ``TOP_K`` slots at row ``dest[slot]`` of ``q`` and its scale at
    ``s[dest // ROWS_PER_BLOCK, dest % ROWS_PER_BLOCK, group]``. A slot whose row is ``LIMIT`` or more (routed
    nowhere) is skipped; with ``HAS_SLOTS``, also one the sorted layout's ``slot_ids`` does not hold at that row.
    One launch for what the quantizer, two gathers and a scale re-layout did (quantizing per slot instead
    repeated each token's quantization ``TOP_K`` times: 2-4% of the whole op at prefill)."""
    token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_ok = token < TOKENS
    group = tl.program_id(1)
    cols = group * 128 + tl.arange(0, 128)
    col_ok = (cols < K)[None, :]
    x = tl.load(x_ptr + token.to(tl.int64)[:, None] * stride_xm + cols[None, :], mask=token_ok[:, None] & col_ok,
                other=0.0)
    q, scale = fp8_group_quantize(x, eps, q_ptr.dtype.element_ty, False, FP8_MAX, FP8_MANT_BITS, FP8_MIN_EXP_BIASED,
                                  FP8_NAN_BITS, HW_RNE)
    for j in tl.static_range(TOP_K):
        slot = token * TOP_K + j
        dest = tl.load(dest_ptr + slot, mask=token_ok, other=LIMIT)
        ok = token_ok & (dest < LIMIT)
        if HAS_SLOTS:
            ok = ok & (tl.load(slot_ids_ptr + dest, mask=ok, other=-1) == slot)
        tl.store(q_ptr + dest.to(tl.int64)[:, None] * stride_qm + cols[None, :], q, mask=ok[:, None] & col_ok)
        _store_scales(s_ptr, dest, group, ROWS_PER_BLOCK, stride_sb, stride_sm, stride_sg, scale, ok)


@triton.jit(do_not_specialize=["M", "E"])
def _ids_check_kernel(ids_ptr, out_ptr, M, E, stride_m, stride_k, TOP_K: tl.constexpr, K_POW2: tl.constexpr,
                      BLOCK_M: tl.constexpr):
    """For BLOCK_M rows of the ids ``[M, TOP_K]``: ``out[pid, 0]`` 1 if an id is outside ``[0, E)`` and not -1,
    ``out[pid, 1]`` 1 if a row repeats an id other than -1 (each id against the later ones of its row)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    j = tl.arange(0, K_POW2)
    mask = (rows < M)[:, None] & (j < TOP_K)[None, :]
    ids = tl.load(ids_ptr + rows.to(tl.int64)[:, None] * stride_m + j[None, :] * stride_k, mask=mask, other=-1)
    bad = tl.max(tl.max(((ids < -1) | (ids >= E)).to(tl.int32), axis=1), axis=0)
    twice = tl.zeros([BLOCK_M, K_POW2], dtype=tl.int32)
    for a in tl.static_range(TOP_K - 1):
        id_a = tl.sum(tl.where(j[None, :] == a, ids, 0), axis=1)
        twice |= ((ids == id_a[:, None]) & (j > a)[None, :] & (id_a >= 0)[:, None]).to(tl.int32)
    tl.store(out_ptr + tl.program_id(0) * 2, bad)
    tl.store(out_ptr + tl.program_id(0) * 2 + 1, tl.max(tl.max(twice, axis=1), axis=0))
