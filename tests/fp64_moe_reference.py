"""An fp64 reference of the MoE experts op, written independently of the library, for numerics tests.

It follows the semantics of docs/moe.md literally, one (token, expert) pair at a time: quantize
the token per 1x128 group (fp64 scale amax / 448), dequantize, multiply by the dequantized w13 of
the expert in fp64, silu(gate) * up in fp64, quantize that per 1x128 group the same way, multiply
by the dequantized w2, weight and sum. An id of -1 contributes nothing. Also random MoE problems.
"""

from __future__ import annotations

import torch
from fp64_reference import quantize_groups, rel_err

__all__ = ["MoeProblem", "expected_moe", "grouped_expected", "random_moe", "random_routing", "rel_err"]


def _dequant_blocks(w: torch.Tensor, s: torch.Tensor, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    n, k = w.shape
    rows = torch.arange(n) // block[0]
    cols = torch.arange(k) // block[1]
    return w.to(torch.float64) * s.to(torch.float64)[rows][:, cols]


def _quant_dequant(v: torch.Tensor, fp8: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    q, s = quantize_groups(v.reshape(1, -1), dtype=fp8)
    cols = torch.arange(v.numel()) // 128
    return (q.to(torch.float64) * s[:, cols]).reshape(-1)


def expected_moe(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                 topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                 gemm_out: torch.dtype | None = None, act_out: torch.dtype | None = None,
                 fp8: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """float64 ``[M, H]``: the experts op as the semantics say. ``gemm_out`` rounds both GEMMs' outputs to
    that dtype first (a backend whose grouped GEMMs write bf16, as DeepGEMM's do, computes that function:
    rounding gate and up to bf16 moves some values of the requantized product across an fp8 rounding
    boundary, up to ~3e-2 relative on one token with I = 128); ``act_out`` rounds ``silu(gate) * up`` to that
    dtype before it is quantized (AITER's fused MoE writes it to a bf16 buffer); ``fp8`` is the grid both
    activations are quantized onto, with ``amax / max(fp8)`` (e4m3fnuz on gfx942: max 240)."""
    x, topk_ids, topk_weights = x.cpu(), topk_ids.cpu(), topk_weights.cpu()
    m, h = x.shape
    inter = w13.shape[1] // 2
    y = torch.zeros((m, h), dtype=torch.float64)
    w13_deq = {}
    w2_deq = {}
    for t in range(m):
        a = _quant_dequant(x[t].to(torch.float64), fp8)
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if e == -1:
                continue
            if e not in w13_deq:
                w13_deq[e] = _dequant_blocks(w13[e].cpu(), s13[e].cpu())
                w2_deq[e] = _dequant_blocks(w2[e].cpu(), s2[e].cpu())
            hidden = w13_deq[e] @ a
            if gemm_out is not None:
                hidden = hidden.to(gemm_out).to(torch.float64)
            act = torch.nn.functional.silu(hidden[:inter]) * hidden[inter:]
            if act_out is not None:
                act = act.to(act_out).to(torch.float64)
            out = w2_deq[e] @ _quant_dequant(act, fp8)
            if gemm_out is not None:
                out = out.to(gemm_out).to(torch.float64)
            y[t] += float(topk_weights[t, j]) * out
    return y


def grouped_expected(a_q: torch.Tensor, a_s: torch.Tensor, w: torch.Tensor, s: torch.Tensor,
                     expert_of_row: torch.Tensor) -> torch.Tensor:
    """float64 ``[R, N]``: each row times its expert's dequantized weight; rows of no expert are 0."""
    rows = a_q.shape[0]
    out = torch.zeros((rows, w.shape[1]), dtype=torch.float64)
    cols = torch.arange(a_q.shape[1]) // 128
    for r in range(rows):
        e = int(expert_of_row[r])
        if 0 <= e < w.shape[0]:
            a = a_q[r].cpu().to(torch.float64) * a_s[r].cpu().to(torch.float64)[cols]
            out[r] = _dequant_blocks(w[e].cpu(), s[e].cpu()) @ a
    return out


class MoeProblem:
    """Random fp8 experts weights with positive block scales (never zero), in checkpoint layouts."""

    def __init__(self, experts: int, hidden: int, inter: int, *, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.experts, self.hidden, self.inter = experts, hidden, inter

        def weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
            w = (torch.randn(experts, n, k, generator=g) * 100).clamp(-440, 440)
            w = torch.where(w.abs() < 1e-3, torch.full_like(w, 0.5), w).to(torch.float8_e4m3fn)
            s = torch.rand(experts, -(-n // 128), -(-k // 128), generator=g) * 1e-3 + 1e-4
            return w, s

        self.w13, self.s13 = weight(2 * inter, hidden)
        self.w2, self.s2 = weight(hidden, inter)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.w13, self.s13, self.w2, self.s2


def random_moe(experts: int, hidden: int, inter: int, seed: int = 0) -> MoeProblem:
    return MoeProblem(experts, hidden, inter, seed=seed)


def random_routing(m: int, k: int, experts: int, *, seed: int = 0,
                   skew: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_weights [M, k] fp32, topk_ids [M, k] int32)``: distinct ids per token, drawn uniformly
    or (``skew``) mostly from the first experts."""
    g = torch.Generator().manual_seed(seed)
    if skew:
        logits = torch.randn(m, experts, generator=g) - torch.arange(experts, dtype=torch.float32)
    else:
        logits = torch.randn(m, experts, generator=g)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    return weights.to(torch.float32), ids.to(torch.int32)


def with_minus_ones(ids: torch.Tensor) -> torch.Tensor:
    """``ids`` with two experts on other ranks (-1, expert parallelism) where there are two tokens or more:
    the second token's second and the last token's first (the one place the vendor MoE tests mark them)."""
    m = ids.shape[0]
    if m > 1:
        ids[1, 1] = -1
        ids[m - 1, 0] = -1
    return ids


def with_strays(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` with ids outside ``[0, E)`` that are not -1 (E, 99 and -2; the layer's check raises on them, and
    a launch must count them nowhere and read nothing for them), and the same ids with those as -1 (what the
    launch's result must equal). Needs three tokens or more."""
    stray = ids.clone()
    stray[0, 0], stray[1, -1], stray[2, 0] = experts, 99, -2
    return stray, stray.masked_fill((stray < 0) | (stray >= experts), -1)


def assert_minus_one_and_nan_rows(run, hidden: int, top_k: int, experts: int) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
    """A launch ``run(x, topk_weights, topk_ids)``: every id -1 gives zeros; a NaN in one token's input makes
    that token's row NaN and leaves the others finite. Returns ``(x, weights, ids)`` for further checks."""
    w, ids = random_routing(4, top_k, experts, seed=5)
    x = torch.randn(4, hidden, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(run(x, w, torch.full_like(ids, -1)), torch.zeros_like(x))
    x[2, 7] = float("nan")
    y = run(x, w, ids)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()
    return x, w, ids
