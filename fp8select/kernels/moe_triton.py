"""fp8select's Triton MoE experts op and grouped GEMM: launches of :mod:`.moe_triton_kernels`.

One experts call is: route (:func:`.moe_routing.route`, torch, no host synchronisation), quantize
the activation (unless the fused gate-up kernel does it in its K loop), the gate-up GEMM, the down
GEMM writing each slot's row, and the weighted sum over each token's ``k`` rows. The gate-up is the
fused kernel (``silu(gate) * up`` and its 1x128 quantization in its epilogue) or, with
``FUSED_ACT`` 0 (:mod:`.moe_config`), the plain grouped GEMM over the ``2I`` columns writing fp32,
then :func:`silu_mul_quant`. With ``WGMMA`` (:mod:`.moe_config`) both GEMMs run on the Hopper ``wgmma``
kernels (:func:`.gluon_moe.launch_grouped`, and :func:`.gluon_moe.launch_gate_up` for the fused
gate-up), whose operands come by TMA: the quantized activation is first gathered into the sorted rows,
and the down GEMM writes the sorted rows, which the weighted sum reads through each slot's row. Sizes
depend on M only, so a call captures into a CUDA graph. Inputs are checked by the caller (:mod:`fp8select.moe`); these functions
check nothing.
"""

from __future__ import annotations

import torch
import triton

from .call_replay import CallReplays
from .moe_config import MoeTritonConfig, without_wgmma
from .moe_routing import Routing, route, row_of_slot, token_of_row
from .quant import DEFAULT_EPS, ROW_MAJOR
from .triton_device import wgmma_runs
from .triton_launch import Recorded, launch
from .triton_pdl import PDL_MAX_M, pdl_launch, pdl_possible
from .triton_quant import TritonQuantizer, fp8_constexprs, hw_rne

__all__ = ["TritonExperts", "grouped_gemm_rows", "ids_flags", "launches_with_pdl", "quantize_slots", "scale_rows",
           "silu_mul_quant", "weighted_sum"]

_SUM_BLOCK_H = 1024

A_SORTED, A_SLOT, A_TOKEN = 0, 1, 2
"""``A_ROWS`` of ``_grouped_gemm_kernel``: the A row a sorted row reads."""

PREFETCH_K = 2
"""K steps of its weight tile a GEMM program (grouped or fused gate-up) launched with PDL asks L2 for before its wait."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class TritonExperts:
    """The experts op on one layer's weights (``w13`` ``[E, 2I, H]``, ``w2`` ``[E, H, I]`` fp8 with
    contiguous fp32 block scales), bound once: ``experts(x, topk_weights, topk_ids, config)``.

    At most :data:`~.triton_pdl.PDL_MAX_M` tokens, on the transposed tiles (``SWAP_AB`` 1: the rule's at
    decode, and the fused gate-up on it) with the activation quantized by its own kernel, every launch
    uses programmatic dependent launch where it runs (``pdl``: True, where
    :func:`~.triton_pdl.pdl_possible`; False never): each waits for the one before, and a GEMM first asks
    L2 for its weight tile's first ``prefetch_k`` K steps (:data:`PREFETCH_K`), which no launch of the op
    writes. Measured on the H200 against the same launches without it (``benchmarks/results/moe_pdl.json``,
    bit-identical outputs): the plain structure 0.97-1.00x the time at DeepSeek-V3's M 1-16 with 32 experts
    and 0.84-0.96x at Qwen3-30B-A3B's (small experts, where the launches are a larger share), the fused
    gate-up 0.98-0.99x and 0.87-0.97x; on the normal tile (an H100 SXM) 1.02-1.03x at DeepSeek-V3's M 1,
    so it launches as before."""

    def __init__(self, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 pdl: bool = True, prefetch_k: int = PREFETCH_K) -> None:
        from . import moe_triton_kernels as kernels

        self._kernels = kernels
        self.w13, self.w13_scale = w13.contiguous(), w13_scale.contiguous()
        self.w2, self.w2_scale = w2.contiguous(), w2_scale.contiguous()
        self.experts, two_i, self.hidden = w13.shape
        self.inter = two_i // 2
        self.device = w13.device
        self._constexprs = {**fp8_constexprs(w13.dtype), "HW_RNE": hw_rne(kernels._gate_up_kernel, self.device, w13.dtype)}
        # silu*up's quantization in the wgmma gate-up, as silu_mul_quant's
        self._act_fp8 = fp8_constexprs(self.w2.dtype)
        self._act_hw_rne = hw_rne(kernels._silu_mul_quant_kernel, self.device, self.w2.dtype)
        self._quantizer: TritonQuantizer | None = None  # the activation's, [M, H]
        # Whether the wgmma kernel runs here on these weights (the per-call operands it reads are made
        # by this op: contiguous, with the weights' row widths).
        self._wgmma = self.hidden % 16 == 0 and self.inter % 16 == 0 and wgmma_runs(self.device)
        self._wgmma_fused = self._wgmma and self.inter % 128 == 0  # the fused gate-up's tiles: whole groups
        self._pdl = pdl and pdl_possible(kernels._grouped_gemm_kernel, self.device)
        self._prefetch_k = prefetch_k
        self._calls = CallReplays(self.device, (self.w13, self.w13_scale, self.w2, self.w2_scale))

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 config: MoeTritonConfig) -> torch.Tensor:
        """``y`` ``[M, H]``. On CUDA, for contiguous 16-byte-aligned inputs, a call's launches are recorded at
        its second call under its M, k, dtypes and ``config`` and replayed by later ones
        (:class:`~.call_replay.CallReplays`; the wgmma kernels' calls, launched by Gluon, are not)."""
        m, k = topk_ids.shape
        return self._calls((m, k, x.dtype, topk_weights.dtype, topk_ids.dtype, config), (x, topk_weights, topk_ids),
                           (m, self.hidden), x.dtype,
                           lambda record: self._launch(x, topk_weights, topk_ids, config, record))

    def _launch(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, config: MoeTritonConfig,
                record: list[Recorded] | None) -> torch.Tensor:
        """:meth:`__call__`'s launches, each appended to ``record`` when given."""
        k = topk_ids.shape[1]
        if config.WGMMA and not self._wgmma:
            config = without_wgmma(config)
        pdl = self._pdl and launches_with_pdl(config, x.shape[0])
        prefetch = self._prefetch_k if pdl else None
        routing = route(topk_ids, self.experts, config.BLOCK_M, pdl=pdl, record=record)
        if config.WGMMA and self._wgmma and routing.rows:
            if record is not None:
                record.append((None, None, ()))  # Gluon's own launches: not replayable
            return self._wgmma_call(x, topk_weights, topk_ids, routing, config)
        q, q_scale = self.gate_up(x, routing, k, config, prefetch, record)
        out = torch.empty((routing.slots, self.hidden), dtype=x.dtype, device=self.device)
        _grouped_gemm(self._kernels, q, q_scale, self.w2, self.w2_scale, routing, out, config, a_rows=A_SORTED,
                      pdl_prefetch=prefetch, record=record)
        return weighted_sum(out, None, topk_ids, topk_weights, self.experts, x.dtype, pdl=pdl, record=record)

    def gate_up(self, x: torch.Tensor, routing: Routing, top_k: int, config: MoeTritonConfig,
                pdl_prefetch: int | None = None,
                record: list[Recorded] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``silu(gate) * up`` ``[rows, I]`` at the sorted rows, in fp8 with its row-major fp32 scales.
        The sorted layout's padding rows are left unset; nothing reads them. ``pdl_prefetch``: not None,
        the launches after the activation's quantizer use programmatic dependent launch, the GEMM
        prefetching that many K steps (:class:`TritonExperts`). ``record``: each launch appended to it."""
        inter = self.inter
        blocks = routing.rows // config.BLOCK_M
        if not config.FUSED_ACT or config.WGMMA:  # the wgmma tiles where their kernels do not run: plain
            h = torch.empty((routing.rows, 2 * inter), dtype=torch.float32, device=self.device)
            if blocks:
                a, a_scale = self._quantize(x, record)
                _grouped_gemm(self._kernels, a, a_scale, self.w13, self.w13_scale, routing, h, config,
                              a_rows=A_TOKEN, out_sorted=True, top_k=top_k, pdl_prefetch=pdl_prefetch, record=record)
            return silu_mul_quant(h, self.w2.dtype, slot_ids=routing.slot_ids, slots=routing.slots,
                                  pdl=pdl_prefetch is not None, record=record)
        q = torch.empty((routing.rows, inter), dtype=self.w2.dtype, device=self.device)
        q_scale = torch.empty((routing.rows, _ceil_div(inter, 128)), dtype=torch.float32, device=self.device)
        if blocks == 0:
            return q, q_scale
        if config.QUANT_IN_KERNEL:
            a, a_scale = x, q_scale  # (the scale pointer is not read)
        else:
            a, a_scale = self._quantize(x, record)
        launch(self._kernels._gate_up_kernel, (blocks * _ceil_div(inter, 128),), (
            a, a_scale, self.w13, self.w13_scale, routing.slot_ids, routing.block_expert, q, q_scale,
            routing.slots, blocks, self.hidden, inter,
            a.stride(0), a_scale.stride(0), self.w13.stride(0), self.w13.stride(1), self.w13_scale.stride(0),
            self.w13_scale.stride(1), q.stride(0), q_scale.stride(0), DEFAULT_EPS), dict(
            TOP_K=top_k, QUANT_IN_KERNEL=bool(config.QUANT_IN_KERNEL), BLOCK_M=config.BLOCK_M, GROUP_M=config.GROUP_M,
            SWAP_AB=bool(config.SWAP_AB), num_warps=config.num_warps, num_stages=config.num_stages, **self._constexprs,
            **_pdl_launch(pdl_prefetch)), record)
        return q, q_scale

    def _wgmma_call(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, routing: Routing,
                    config: MoeTritonConfig) -> torch.Tensor:
        """Both GEMMs on the wgmma kernels: the activation quantized, gathered into the sorted rows (a
        padding row takes the last token's: finite, never read back), the fused gate-up into quantized
        silu*up (``FUSED_ACT`` 1, where ``I`` allows) or the plain one into fp32 sorted rows and silu*up
        quantized, the down GEMM into sorted rows, the weighted sum by slot row."""
        from .gluon_moe import launch_gate_up, launch_grouped

        tiles = {"block_m": config.BLOCK_M, "block_n": config.BLOCK_N, "group_m": config.GROUP_M,
                 "stages": config.num_stages, "num_warps": config.num_warps}
        persistent = bool(config.PERSISTENT)
        xq, xs = self._quantize(x)
        tokens = token_of_row(routing, topk_ids.shape[1], x.shape[0])
        a = xq.view(torch.uint8).index_select(0, tokens).view(xq.dtype)
        if config.FUSED_ACT and self._wgmma_fused:
            q = torch.empty((routing.rows, self.inter), dtype=self.w2.dtype, device=self.device)
            q_scale = torch.empty((routing.rows, self.inter // 128), dtype=torch.float32, device=self.device)
            launch_gate_up(a, xs.index_select(0, tokens), self.w13, self.w13_scale, routing.block_expert, q, q_scale,
                           DEFAULT_EPS, block_m=config.BLOCK_M, group_m=config.GROUP_M, stages=config.num_stages,
                           hw_rne=self._act_hw_rne, fp8=self._act_fp8, persistent=persistent)
        else:
            h = torch.empty((routing.rows, 2 * self.inter), dtype=torch.float32, device=self.device)
            launch_grouped(a, xs.index_select(0, tokens), self.w13, self.w13_scale, routing.block_expert, h,
                           persistent=persistent, **tiles)
            q, q_scale = silu_mul_quant(h, self.w2.dtype, slot_ids=routing.slot_ids, slots=routing.slots)
        out = torch.empty((routing.rows, self.hidden), dtype=x.dtype, device=self.device)
        launch_grouped(q, q_scale, self.w2, self.w2_scale, routing.block_expert, out, persistent=persistent, **tiles)
        return weighted_sum(out, row_of_slot(routing), topk_ids, topk_weights, self.experts, x.dtype)

    def _quantize(self, x: torch.Tensor, record: list[Recorded] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The activation in w13's fp8 type with row-major scales ``[M, ceil(H/128)]``."""
        if self._quantizer is None:
            self._quantizer = TritonQuantizer(self.hidden, dtype=self.w13.dtype, layout=ROW_MAJOR, device=self.device)
        return self._quantizer(x, record=record)


def _pdl_launch(prefetch: int | None) -> dict[str, object]:
    """A GEMM launch's keyword arguments for programmatic dependent launch asking L2 for ``prefetch`` K steps
    first; none where ``prefetch`` is None."""
    return {} if prefetch is None else {**pdl_launch(True), "PREFETCH_K": prefetch}


def launches_with_pdl(config: MoeTritonConfig, m: int) -> bool:
    """Whether :class:`TritonExperts` launches a call of ``m`` tokens on ``config`` with programmatic
    dependent launch where it runs: the transposed tiles at decode, the activation quantized by its own
    kernel (see there)."""
    return bool(config.SWAP_AB) and not config.QUANT_IN_KERNEL and m <= PDL_MAX_M


def _grouped_gemm(kernels: object, a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                  routing: Routing, out: torch.Tensor, config: MoeTritonConfig, *, a_rows: int,
                  out_sorted: bool = False, top_k: int = 1, pdl_prefetch: int | None = None,
                  record: list[Recorded] | None = None) -> None:
    """``_grouped_gemm_kernel`` on fp8 ``a`` with scales ``a_scale``, ``config``'s tiles: A rows per
    ``a_rows`` (:data:`A_SORTED`, :data:`A_SLOT`, :data:`A_TOKEN`), out rows the slots or, with
    ``out_sorted``, the sorted rows. ``pdl_prefetch``: not None, launched with programmatic dependent
    launch behind a launch of :class:`TritonExperts`, asking L2 for that many K steps first (see there).
    ``record``: the launch appended to it."""
    blocks = routing.rows // config.BLOCK_M
    n, kdim = w.shape[1], w.shape[2]
    if blocks == 0:
        return
    launch(kernels._grouped_gemm_kernel, (blocks * _ceil_div(n, config.BLOCK_N),), (  # type: ignore[attr-defined]
        a, a_scale, w, w_scale, routing.slot_ids, routing.block_expert, out,
        routing.slots, blocks, n, kdim,
        a.stride(0), a_scale.stride(0), a_scale.stride(1), w.stride(0), w.stride(1), w_scale.stride(0),
        w_scale.stride(1), out.stride(0)), dict(
        A_ROWS=a_rows, OUT_SORTED=out_sorted, BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, GROUP_M=config.GROUP_M,
        TOP_K=top_k, SWAP_AB=bool(config.SWAP_AB), num_warps=config.num_warps, num_stages=config.num_stages,
        **_pdl_launch(pdl_prefetch)), record)


def grouped_gemm_rows(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                      expert_of_row: torch.Tensor, out: torch.Tensor, config: MoeTritonConfig) -> torch.Tensor:
    """``out[r] = dequant(a[r]) @ dequant(w[expert_of_row[r]]).T`` for the rows whose expert is in
    ``[0, E)``; other rows of ``out`` are left as they are. ``a`` ``[R, K]`` fp8 (K-contiguous) with
    fp32 scales ``[R, ceil(K/128)]`` (any strides), ``w`` ``[E, N, K]`` with contiguous block scales."""
    from . import moe_triton_kernels as kernels

    routing = route(expert_of_row.reshape(-1, 1), w.shape[0], config.BLOCK_M)
    _grouped_gemm(kernels, a, a_scale, w.contiguous(), w_scale.contiguous(), routing, out, config, a_rows=A_SLOT)
    return out


def weighted_sum(out: torch.Tensor, row_map: torch.Tensor | None, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 experts: int, dtype: torch.dtype, *, pdl: bool = False,
                 record: list[Recorded] | None = None) -> torch.Tensor:
    """``y[t] = sum_j topk_weights[t, j] * out[row(t * k + j)]`` over ids in ``[0, experts)``, in fp32,
    as ``dtype``; ``row`` is the slot itself, or ``row_map[slot]`` when given (a slot mapped past ``out``'s
    last row is skipped: a masked layout's dropped slot). ``pdl``: launched with
    programmatic dependent launch (where the caller found it runs). ``record``: the launch appended to it."""
    from . import moe_triton_kernels as kernels

    m, k = topk_ids.shape
    hidden = out.shape[1]
    y = torch.empty((m, hidden), dtype=dtype, device=out.device)
    if m == 0:
        return y
    block_h = min(_SUM_BLOCK_H, triton.next_power_of_2(hidden))
    launch(kernels._weighted_sum_kernel, (m, _ceil_div(hidden, block_h)), (
        out, out if row_map is None else row_map, topk_ids.contiguous(), topk_weights.contiguous(), y, hidden, experts,
        out.shape[0], out.stride(0), y.stride(0)), dict(
        TOP_K=k, HAS_MAP=row_map is not None, BLOCK_H=block_h, num_warps=4, **pdl_launch(pdl)), record)
    return y


def ids_flags(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """``[P, 2]`` int32 on the ids' device, one launch: per block of rows of ``ids`` ``[M, k]`` (any strides),
    whether an id is outside ``[0, experts)`` and not -1, and whether a row repeats an id other than -1 (the
    eager call's check: :class:`fp8select.moe._IdsCheck`; ``moe_reference.ids_flags_torch`` in torch ops)."""
    from . import moe_triton_kernels as kernels

    m, k = ids.shape
    programs = max(_ceil_div(m, _IDS_BLOCK_M), 1)
    out = torch.empty((programs, 2), dtype=torch.int32, device=ids.device)
    launch(kernels._ids_check_kernel, (programs,), (ids, out, m, experts, ids.stride(0), ids.stride(1)),
           dict(TOP_K=k, K_POW2=triton.next_power_of_2(k), BLOCK_M=_IDS_BLOCK_M, num_warps=4))
    return out


_IDS_BLOCK_M = 128
"""Rows of the ids per program of :func:`ids_flags`."""


SILU_BLOCK_R = 16
"""Rows per program of the silu*up quantization."""


def scale_rows(scale: torch.Tensor) -> tuple[int, int, int, int]:
    """``(rows per block, block stride, row stride, group stride)`` of a scale tensor the kernels write through its
    strides: ``[R, G]`` (one block; any strides: row-major, or MN-major and TMA-aligned) or ``[B, R, G]`` (a masked
    layout's ``B`` experts, e.g. MN-major per expert)."""
    if scale.dim() == 2:
        return max(scale.shape[0], 1), 0, scale.stride(0), scale.stride(1)
    return max(scale.shape[1], 1), scale.stride(0), scale.stride(1), scale.stride(2)


def quantize_slots(x: torch.Tensor, rows: torch.Tensor, top_k: int, q: torch.Tensor, scale: torch.Tensor,
                   slot_ids: torch.Tensor | None = None, *, record: list[Recorded] | None = None) -> None:
    """Each slot's token (``slot // top_k``) of ``x`` ``[M, H]`` quantized per 1x128 group (as the quantizer does,
    bit for bit) into row ``rows[slot]`` of ``q`` ``[L, H]`` and of ``scale`` (``[L, G]`` or ``[B, L / B, G]``,
    any strides: :func:`scale_rows`), ``rows`` holding ``top_k`` slots per token; a slot whose row is ``L`` or more
    is skipped, and rows no slot names are left unset. With ``slot_ids`` (a sorted layout's: ``rows`` is then
    :func:`.moe_routing.row_of_slot`, whose 0 for a slot routed nowhere is not its row) only the slots it holds at
    their rows are written. One launch, each token quantized once, for the quantizer, the gathers into a
    vendor's layout and its scales' re-layout. ``record``: the launch appended to it."""
    from . import moe_triton_kernels as kernels

    tokens, hidden = rows.shape[0] // top_k, x.shape[1]
    if tokens == 0:
        return
    per_block, stride_sb, stride_sm, stride_sg = scale_rows(scale)
    block_t = min(_TOKENS_BLOCK, triton.next_power_of_2(tokens))
    launch(kernels._quant_slots_kernel, (_ceil_div(tokens, block_t), _ceil_div(hidden, 128)), (
        x, rows, rows if slot_ids is None else slot_ids, q, scale, tokens, hidden, q.shape[0], x.stride(0),
        q.stride(0), stride_sb, stride_sm, stride_sg, per_block, DEFAULT_EPS), dict(
        TOP_K=top_k, BLOCK_T=block_t, HAS_SLOTS=slot_ids is not None,
        HW_RNE=hw_rne(kernels._quant_slots_kernel, x.device, q.dtype), **fp8_constexprs(q.dtype), num_warps=4), record)


_TOKENS_BLOCK = 16
"""Tokens per program of :func:`quantize_slots`, fewer (a power of two) for fewer tokens: a program stores its
tile once per slot, so a 16-token tile holding one token would issue its masked rows' stores ``TOP_K`` times."""


def silu_mul_quant(h: torch.Tensor, dtype: torch.dtype, counts: torch.Tensor | None = None,
                   group_rows: int = 0, most: int | None = None, *, slot_ids: torch.Tensor | None = None,
                   slots: int = 0, scale: torch.Tensor | None = None,
                   pdl: bool = False, record: list[Recorded] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(h[:, :I]) * h[:, I:]`` of a ``[R, 2I]`` GEMM output, quantized per 1x128 group:
    ``(q [R, I] in dtype, fp32 scales)``, the scales row-major ``[R, ceil(I/128)]``, or written into ``scale``
    (``[R, G]`` or ``[R / group_rows, group_rows, G]``, any strides: :func:`scale_rows`), the layout a vendor's
    next GEMM reads, and returned. With ``counts`` (int32 ``[G]``) the
    rows are G groups of ``group_rows`` (a multiple of :data:`SILU_BLOCK_R`: a masked layout) and only
    each group's first ``counts[g]`` rows (rounded up to the program's rows) are computed; the others
    are left unset. ``most``: a bound on every count the caller knows (a masked layout's tokens: no
    expert holds more), so that programs are launched for that many rows of each group only (the
    sizes stay a function of the call's shapes: a CUDA graph captures them). With ``slot_ids`` (a
    sorted layout's, :class:`.moe_routing.Routing`) the rows whose entry is ``slots`` or more are
    padding: skipped, left unset. ``pdl``: launched with programmatic dependent launch (where the caller
    found it runs). ``record``: the launch appended to it."""
    from . import moe_triton_kernels as kernels

    rows, inter = h.shape[0], h.shape[1] // 2
    groups = _ceil_div(inter, 128)
    q = torch.empty((rows, inter), dtype=dtype, device=h.device)
    if scale is None:
        scale = torch.empty((rows, groups), dtype=torch.float32, device=h.device)
    if rows == 0:
        return q, scale
    if counts is not None and (group_rows <= 0 or group_rows % SILU_BLOCK_R or rows % group_rows):
        raise ValueError(f"group_rows must be a positive multiple of {SILU_BLOCK_R} dividing {rows}, got {group_rows}")
    if counts is None:
        group_blocks, programs = 1, _ceil_div(rows, SILU_BLOCK_R)
    else:
        group_blocks = _ceil_div(group_rows if most is None else max(min(most, group_rows), 1), SILU_BLOCK_R)
        programs = rows // group_rows * group_blocks
    per_block, stride_sb, stride_sm, stride_sg = scale_rows(scale)
    launch(kernels._silu_mul_quant_kernel, (programs, groups), (
        h, q, scale, scale if counts is None else counts, scale if slot_ids is None else slot_ids, rows, inter,
        h.stride(0), q.stride(0), stride_sb, stride_sm, stride_sg, per_block, max(group_rows, 1), group_blocks, slots,
        DEFAULT_EPS), dict(
        BLOCK_R=SILU_BLOCK_R, HAS_COUNTS=counts is not None, HAS_SLOTS=slot_ids is not None,
        HW_RNE=hw_rne(kernels._silu_mul_quant_kernel, h.device, dtype), **fp8_constexprs(dtype), num_warps=8,
        **pdl_launch(pdl)), record)
    return q, scale
