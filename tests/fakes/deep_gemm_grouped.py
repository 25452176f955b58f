"""The M-grouped FP8 GEMMs of the fake ``deep_gemm`` (DeepGEMM 2.6.1 API; part of tests/fakes/deep_gemm.py).

Checked against FACTS.md ("Grouped (MoE) block-FP8 GEMMs on the H200": both run on the H200 with
2.6.1) and DeepGEMM's ``csrc/apis/gemm.hpp`` (``m_grouped_fp8_fp4_gemm_nt_contiguous`` and
``_masked`` host checks):

* ``m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
  compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False, ensure_zero_padding=True,
  expected_m_for_psum_layout=None)``: ``a`` ``[M, K]`` K-major, ``b`` ``[G, N, K]`` K-major, ``d``
  ``[M, N]`` bf16 row-major, ``grouped_layout`` int32 contiguous ``[M]`` (not the psum layout),
  ``n > 0 and k > 0 and num_groups > 0``.
* ``m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
  compiled_dims="nk", disable_ue8m0_cast=False)``: ``a`` ``[G, M, K]``, ``d`` ``[G, M, N]`` bf16,
  ``masked_m`` int32 contiguous ``[G]``, ``expected_m > 0 and m > 0``.
* ``get_mk_alignment_for_contiguous_layout()``: 128.

Scales as the dense fake requires on sm90 (fp32; ``sfb`` ``[G, N/128, K/128]`` contiguous; ``sfa``
MN-major and TMA-aligned: ``[M, K/128]`` strides ``(1, round_up(M, 4))``, per group for the masked
form, ``[G, M, K/128]`` strides ``(K/128 * round_up(M, 4), 1, round_up(M, 4))``).

Stricter than verified, on purpose: the contiguous form requires M a multiple of the alignment and one
``grouped_layout`` value per aligned block (what DeepGEMM's scheduler reads: the block's first row; a
mixed block would be computed with one expert); rows of a -1 block, and masked rows at or beyond
``masked_m``, are written as NaN (DeepGEMM leaves them unwritten: the adapter must never read them);
``masked_m`` above M is an error. sm100 (UE8M0 scales) is not emulated for the grouped forms.

The masked form's M must be a multiple of 128: on sm90 DeepGEMM tiles each group's rows by its block M
(64 or 128, ``csrc/jit_kernels/heuristics/sm90.hpp``) through 2-D TMA descriptors of ``[G * M, K]`` and
``[G * M, N]`` (``make_tma_a_desc`` / ``make_tma_cd_desc``), so a tile that crosses a group's end reads
and writes the next group's rows. DeepGEMM does not check it (its tests use M 4096); on the H200 an M of
4 gave results 60% off.
"""

from __future__ import annotations

from typing import Any

import torch

from . import ceil_div, round_up

ALIGNMENT = 128


def _fail(condition: str, detail: str = "") -> RuntimeError:
    return RuntimeError(f"Assertion error (deep_gemm fake, grouped): {condition}" + (f" ({detail})" if detail else ""))


def _check(ok: bool, condition: str, detail: str = "") -> None:
    if not ok:
        raise _fail(condition, detail)


def _dequant(q: torch.Tensor, scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    """float64 ``q [R, K]`` times ``scale [ceil(R/block_rows), ceil(K/128)]`` read by logical index."""
    rows, k = q.shape
    expanded = scale.to(torch.float64).repeat_interleave(block_rows, 0)[:rows].repeat_interleave(128, 1)[:, :k]
    return q.to(torch.float64) * expanded


class FakeGroupedGEMM:
    """The grouped entry points, sharing the dense fake's architecture knob."""

    def __init__(self, dense: Any) -> None:
        self.dense = dense

    def get_mk_alignment_for_contiguous_layout(self) -> int:
        return ALIGNMENT

    def _common(self, a: Any, b: Any, recipe: Any, recipe_a: Any, recipe_b: Any, disable_ue8m0_cast: bool,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        _check(self.dense.arch_major == 9, "sm90 (grouped forms on sm100 are not emulated)", f"arch {self.dense.arch}")
        _check(isinstance(a, tuple | list) and len(a) == 2 and isinstance(b, tuple | list) and len(b) == 2,
               "a and b are (tensor, scaling factor) pairs")
        _check(recipe in (None, (1, 128, 128)) and recipe_a is None and recipe_b is None, "default 1D2D recipe")
        a_t, sfa = a
        b_t, sfb = b
        for name, t in (("a", a_t), ("b", b_t)):
            _check(t.dtype == torch.float8_e4m3fn, f"{name}.scalar_type() == kFloat8_e4m3fn", f"got {t.dtype}")
            _check(t.stride(-1) == 1, f"{name} is K-major")
            _check(t.stride(-2) * t.element_size() % 16 == 0, f"{name} leading stride is 16-byte aligned")
        _check(b_t.dim() == 3 and b_t.is_contiguous(), "b is [G, N, K] contiguous")
        g, n, k = b_t.shape
        _check(n > 0 and k > 0 and g > 0, "n > 0 and k > 0 and num_groups > 0")
        _check(sfb.dtype == torch.float32 and tuple(sfb.shape) == (g, ceil_div(n, 128), ceil_div(k, 128))
               and sfb.is_contiguous(), "sfb is fp32 [G, N/128, K/128] contiguous", f"got {sfb.dtype} {tuple(sfb.shape)}")
        _check(sfa.dtype == torch.float32, "sfa is fp32 on sm90")
        return a_t, sfa, b_t, sfb

    def m_grouped_fp8_gemm_nt_contiguous(self, a: Any, b: Any, d: torch.Tensor, grouped_layout: torch.Tensor,
                                         recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                         compiled_dims: str = "nk", disable_ue8m0_cast: bool = False,
                                         use_psum_layout: bool = False, ensure_zero_padding: bool = True,
                                         expected_m_for_psum_layout: int | None = None) -> None:
        a_t, sfa, b_t, sfb = self._common(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast)
        _check(not use_psum_layout and expected_m_for_psum_layout is None, "not use_psum_layout", "psum not emulated")
        _check(a_t.dim() == 2, "a is [M, K]")
        m, k = a_t.shape
        g, n, _ = b_t.shape
        _check(d.dim() == 2 and tuple(d.shape) == (m, n) and k == b_t.shape[2], "m == m_ and n == n_ and k == k_")
        _check(d.dtype == torch.bfloat16 and d.stride(-1) == 1, "d is bf16 and N-major")
        _check(grouped_layout.dtype == torch.int32 and grouped_layout.is_contiguous()
               and tuple(grouped_layout.shape) == (m,), "grouped_layout is int32 [M] contiguous")
        _check(m % ALIGNMENT == 0, f"M % {ALIGNMENT} == 0 (fake: rows padded to the alignment)", f"M={m}")
        _check(tuple(sfa.shape) == (m, ceil_div(k, 128)) and sfa.stride(0) == 1 and sfa.stride(1) == round_up(m, 4),
               "sfa is MN-major and TMA-aligned", f"shape {tuple(sfa.shape)} strides {tuple(sfa.stride())}")
        if m == 0:
            return
        blocks = grouped_layout.view(-1, ALIGNMENT)
        _check(bool((blocks == blocks[:, :1]).all()), "one grouped_layout value per aligned block (fake)")
        _check(bool(((blocks[:, 0] >= -1) & (blocks[:, 0] < g)).all()), "grouped_layout in [-1, G)")
        out = torch.full((m, n), float("nan"), dtype=torch.float64)
        a64 = _dequant(a_t, sfa, 1)
        for e in grouped_layout.unique().tolist():
            if e >= 0:
                rows = grouped_layout == e
                out[rows] = a64[rows] @ _dequant(b_t[e], sfb[e], 128).T
        d.copy_(out.to(d.dtype))

    def m_grouped_fp8_gemm_nt_masked(self, a: Any, b: Any, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                                     recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                     compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
        a_t, sfa, b_t, sfb = self._common(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast)
        _check(a_t.dim() == 3 and a_t.is_contiguous(), "a is [G, M, K] contiguous")
        g, m, k = a_t.shape
        _, n, _ = b_t.shape
        _check(g == b_t.shape[0] == masked_m.numel() and k == b_t.shape[2], "num_groups and K agree")
        _check(d.dim() == 3 and tuple(d.shape) == (g, m, n) and d.dtype == torch.bfloat16 and d.is_contiguous(),
               "d is bf16 [G, M, N] contiguous")
        _check(isinstance(expected_m, int) and expected_m > 0 and m > 0, "expected_m > 0 and m > 0")
        _check(m % 128 == 0, "M % 128 == 0 (the sm90 kernel's block M, 64 or 128, tiles each group's rows)",
               f"got M={m}")
        _check(masked_m.dtype == torch.int32 and masked_m.is_contiguous(), "masked_m is int32 contiguous")
        pad = round_up(m, 4)
        _check(tuple(sfa.shape) == (g, m, ceil_div(k, 128)) and sfa.stride(1) == 1 and sfa.stride(2) == pad
               and sfa.stride(0) == pad * ceil_div(k, 128), "sfa is MN-major and TMA-aligned per group",
               f"shape {tuple(sfa.shape)} strides {tuple(sfa.stride())}")
        counts = masked_m.tolist()
        _check(all(0 <= c <= m for c in counts), "0 <= masked_m <= M (fake)", f"got {counts}")
        out = torch.full((g, m, n), float("nan"), dtype=torch.float64)
        for e, c in enumerate(counts):
            if c:
                out[e, :c] = _dequant(a_t[e, :c], sfa[e, :c], 1) @ _dequant(b_t[e], sfb[e], 128).T
        d.copy_(out.to(d.dtype))
