"""Fake ``deep_gemm`` (deepseek-ai/DeepGEMM) for CPU tests.

Emulates the dense FP8 GEMM entry points and the scale-layout helpers an adapter uses:

* ``api="v2.6"`` (default), checked against the real DeepGEMM 2.6.1 (main at commit 54e2261,
  ``deep_gemm/__init__.py``, ``deep_gemm/_C.pyi``, ``csrc/apis/gemm.hpp``,
  ``csrc/apis/layout.hpp``, ``csrc/utils/layout.hpp``,
  ``csrc/jit_kernels/impls/smxx_layout.hpp``, ``csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp``):
  ``fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None,
  compiled_dims="nk", disable_ue8m0_cast=False)`` with ``fp8_gemm_nt`` the same function
  (``m.attr("fp8_gemm_nt") = m.attr("fp8_fp4_gemm_nt")``), plus ``get_tma_aligned_size``,
  ``get_mn_major_tma_aligned_tensor``, ``get_mn_major_tma_aligned_packed_ue8m0_tensor(sf,
  psum_layout=None)``, ``transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=None,
  is_sfa=None, disable_ue8m0_cast=False, psum_layout=None)``, ``set_num_sms``/``get_num_sms``
  and the ``deep_gemm.utils`` / ``deep_gemm.utils.layout`` submodules; ``__version__ = "2.6.1"``; and the
  M-grouped ``m_grouped_fp8_gemm_nt_contiguous`` / ``_masked`` and
  ``get_mk_alignment_for_contiguous_layout`` (also in ``api="v2.8"``), in tests/fakes/deep_gemm_grouped.py.
* ``api="v2"``: the 2.0-era seven-parameter form ``fp8_gemm_nt((a, sfa), (b, sfb), d, c=None,
  recipe=None, compiled_dims="nk", disable_ue8m0_cast=False)`` (read in earlier 2.x sources,
  not in a release checked here).
* ``api="v2.8"``: as v2.6 with a trailing ``alpha=None`` (read at DeepGEMM 2.8.0 source;
  not run).
* ``api="v1"``: ``gemm_fp8_fp8_bf16_nt(lhs, rhs, out)`` and
  ``get_col_major_tma_aligned_tensor`` (DeepGEMM before the 2025-07 refactor, Hopper only).

Knobs (on ``fake.impl``, also exported as module functions ``set_arch`` / ``set_layout_check``
/ ``reset``):

* ``arch``: ``"sm90"`` (FP32 scales) or ``"sm100"`` (packed UE8M0 int32 scales); any other
  value makes every GEMM raise ``RuntimeError("Unsupported architecture")``.
* ``layout_check``: ``"strict"`` (default) enforces the documented contract: the LHS scale
  already MN-major and TMA-aligned (strides exactly ``(1, round_up(M, 4))``), and on SM100
  both scales already packed UE8M0. ``"transform"`` emulates what the library code does
  instead: re-lay-out FP32 scales on every call (``get_mn_major_tma_aligned_tensor``: a
  silent copy), and on SM100 silently truncate FP32 scales to powers of two while packing them.

What the 2.x fakes assert of the shapes is what DeepGEMM's host code asserts: no N or K
multiple (2.6.1 has none in the dense path), only the TMA alignment of the operands' leading
strides (16 bytes: K % 16 for fp8 ``a`` and ``b``, N % 8 for a bf16 ``d``). Whether the kernels
are *correct* outside SGLang's gate (N % 64, K % 128) is not known here: the fake computes exact
numbers for any shape it accepts. v1 asserts ``n % 64 == 0 and k % 128 == 0`` as its Python code
does. Errors: 2.x raises ``RuntimeError("Assertion error (file:line): condition")`` (a
``DGException`` through pybind11; the fake writes ``(deep_gemm fake)`` for the location); v1 raises
``AssertionError`` as its Python ``assert`` does.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Call, ceil_div, make_vendor_module, recorded, round_up, unpack_ue8m0
from .deep_gemm_grouped import FakeGroupedGEMM

ARCH_MAJORS = {"sm90": 9, "sm100": 10}
API_VARIANTS = ("v1", "v2", "v2.6", "v2.8")
LAYOUT_CHECKS = ("strict", "transform")
_TMA_ALIGNMENT_BYTES = 16


def _fail(condition: str, detail: str = "") -> RuntimeError:
    """DeepGEMM-style host assertion failure."""
    return RuntimeError(f"Assertion error (deep_gemm fake): {condition}" + (f" ({detail})" if detail else ""))


def _check(ok: bool, condition: str, detail: str = "") -> None:
    if not ok:
        raise _fail(condition, detail)


def _tma_aligned(mn: int, element_size: int) -> int:
    return round_up(mn, _TMA_ALIGNMENT_BYTES // element_size)


def _pack_ue8m0_mn_major(sf: torch.Tensor) -> torch.Tensor:
    """FP32 [.., MN, G] -> int32 [.., MN, ceil(G/4)], MN-major, TMA-aligned (exponent bits only)."""
    squeeze = sf.dim() == 2
    batched = sf.unsqueeze(0) if squeeze else sf
    batches, mn, groups = batched.shape
    exponents = (batched.contiguous().view(torch.int32) >> 23).to(torch.uint8)
    aligned_mn, aligned_groups = _tma_aligned(mn, 4), round_up(groups, 4)
    padded = torch.zeros(batches, aligned_mn, aligned_groups, dtype=torch.uint8)
    padded[:, :mn, :groups] = exponents
    words = padded.view(torch.int32).view(batches, aligned_mn, aligned_groups // 4)
    out = torch.empty_strided(
        (batches, aligned_mn, aligned_groups // 4),
        (aligned_mn * (aligned_groups // 4), 1, aligned_mn),
        dtype=torch.int32,
    )
    out.copy_(words)
    out = out[:, :mn, :]
    return out.squeeze(0) if squeeze else out


def _truncate_to_pow2(sf: torch.Tensor) -> torch.Tensor:
    """What DeepGEMM's FP32 -> UE8M0 cast keeps of a scale: its exponent (rounds down)."""
    exponents = (sf.float().contiguous().view(torch.int32) >> 23) & 0xFF
    return (exponents << 23).view(torch.float32)


class FakeDeepGEMM:
    """State and behaviour of one installed fake ``deep_gemm``."""

    def __init__(self, *, arch: str = "sm90", api: str = "v2.6", layout_check: str = "strict", num_sms: int = 132) -> None:
        if api not in API_VARIANTS:
            raise ValueError(f"api must be one of {API_VARIANTS}, got {api!r}")
        self.api = api
        self._initial = (arch, layout_check, num_sms)
        self.arch = arch
        self.layout_check = layout_check
        self.num_sms = num_sms
        self.reset()

    # ----------------------------------------------------------------- knobs

    def set_arch(self, arch: str) -> None:
        """Emulate another GPU: ``"sm90"`` or ``"sm100"`` (anything else is unsupported)."""
        self.arch = arch

    def set_layout_check(self, mode: str) -> None:
        """``"strict"`` (documented contract) or ``"transform"`` (library's per-call fix-ups)."""
        if mode not in LAYOUT_CHECKS:
            raise ValueError(f"layout_check must be one of {LAYOUT_CHECKS}, got {mode!r}")
        self.layout_check = mode

    def reset(self) -> None:
        """Restore the options the fake was installed with."""
        arch, layout_check, num_sms = self._initial
        self.set_arch(arch)
        self.set_layout_check(layout_check)
        self.num_sms = num_sms

    @property
    def arch_major(self) -> int:
        """Compute-capability major of the emulated GPU (0 when unsupported)."""
        return ARCH_MAJORS.get(self.arch, 0)

    # ----------------------------------------------------------------- layout helpers (real API)

    def get_tma_aligned_size(self, x: int, element_size: int) -> int:
        """Round ``x`` up so that ``x * element_size`` is a multiple of 16 bytes."""
        _check(_TMA_ALIGNMENT_BYTES % element_size == 0, "kNumTMAAlignmentBytes % element_size == 0")
        return _tma_aligned(x, element_size)

    def get_mn_major_tma_aligned_tensor(self, sf: torch.Tensor) -> torch.Tensor:
        """FP32 scales [.., MN, G] as an MN-major tensor with strides (1, round_up(MN, 4))."""
        _check(sf.dim() in (2, 3), "dim == 2 or dim == 3")
        _check(sf.dtype == torch.float32, "sf.scalar_type() == torch::kFloat")
        mn, groups = sf.shape[-2], sf.shape[-1]
        aligned = _tma_aligned(mn, 4)
        if sf.dim() == 2 and sf.stride(0) == 1 and sf.stride(1) == aligned:
            return sf
        if sf.dim() == 3 and sf.stride(1) == 1 and sf.stride(2) == aligned and sf.stride(0) == aligned * groups:
            return sf
        batches = 1 if sf.dim() == 2 else sf.shape[0]
        out = torch.empty_strided((batches, mn, groups), (aligned * groups, 1, aligned), dtype=torch.float32)
        out.copy_(sf.reshape(batches, mn, groups))
        return out.squeeze(0) if sf.dim() == 2 else out

    def get_mn_major_tma_aligned_packed_ue8m0_tensor(self, sf: torch.Tensor, psum_layout: torch.Tensor | None = None) -> torch.Tensor:
        """Pack FP32 scales [.., MN, G] into UE8M0 int32 [.., MN, ceil(G/4)], MN-major, TMA-aligned.

        Keeps only each scale's exponent byte (``bits >> 23``): non-power-of-two scales are
        silently rounded down, exactly like the library. ``psum_layout`` (grouped GEMMs) is
        not emulated.
        """
        _check(psum_layout is None, "psum_layout is None", "grouped layouts are not emulated")
        _check(sf.dim() in (2, 3), "dim == 2 or dim == 3")
        _check(sf.dtype == torch.float32, "sf.scalar_type() == torch::kFloat")
        return _pack_ue8m0_mn_major(sf)

    def transform_sf_into_required_layout(
        self,
        sf: torch.Tensor,
        mn: int,
        k: int,
        recipe: tuple[int, ...],
        num_groups: int | None = None,
        is_sfa: bool | None = None,
        disable_ue8m0_cast: bool = False,
        psum_layout: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The library's own scale transform for one operand (what ``fp8_gemm_nt`` applies)."""
        _check(num_groups is None and psum_layout is None, "num_groups is None", "grouped layouts are not emulated")
        if len(recipe) == 3:
            _check(is_sfa is not None, "is_sfa.has_value()")
            gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
        else:
            _check(len(recipe) == 2, "valid recipe")
            gran_mn, gran_k = recipe
        _, _, transformed = self._transform_sf(sf, mn, k, gran_mn, gran_k, disable_ue8m0_cast, "sf", lenient=True)
        return transformed

    def set_num_sms(self, new_num_sms: int) -> None:
        """Set the maximum SM count (recorded only)."""
        self.num_sms = int(new_num_sms)

    def get_num_sms(self) -> int:
        """The maximum SM count."""
        return self.num_sms

    # ----------------------------------------------------------------- GEMMs (real API)

    def fp8_gemm_nt(
        self,
        a: tuple[torch.Tensor, torch.Tensor],
        b: tuple[torch.Tensor, torch.Tensor],
        d: torch.Tensor,
        c: torch.Tensor | None = None,
        recipe: tuple[int, int, int] | None = None,
        compiled_dims: str = "nk",
        disable_ue8m0_cast: bool = False,
    ) -> None:
        """D = C + A @ B.T with 1x128 LHS and 128x128 (or 1x128) RHS scales; writes ``d`` in place."""
        self._gemm_nt(a, b, d, c, recipe, None, None, compiled_dims, disable_ue8m0_cast, None)

    def fp8_fp4_gemm_nt(
        self,
        a: tuple[torch.Tensor, torch.Tensor],
        b: tuple[torch.Tensor, torch.Tensor],
        d: torch.Tensor,
        c: torch.Tensor | None = None,
        recipe: tuple[int, int, int] | None = None,
        recipe_a: tuple[int, int] | None = None,
        recipe_b: tuple[int, int] | None = None,
        compiled_dims: str = "nk",
        disable_ue8m0_cast: bool = False,
    ) -> None:
        """DeepGEMM 2.6.1: ``fp8_gemm_nt`` is this function (FP4 operands are not emulated)."""
        self._gemm_nt(a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, None)

    def fp8_gemm_nt_v28(
        self,
        a: tuple[torch.Tensor, torch.Tensor],
        b: tuple[torch.Tensor, torch.Tensor],
        d: torch.Tensor,
        c: torch.Tensor | None = None,
        recipe: tuple[int, int, int] | None = None,
        recipe_a: tuple[int, int] | None = None,
        recipe_b: tuple[int, int] | None = None,
        compiled_dims: str = "nk",
        disable_ue8m0_cast: bool = False,
        alpha: float | None = None,
    ) -> None:
        """DeepGEMM 2.8 form of ``fp8_gemm_nt`` (separate per-operand recipes, ``alpha``)."""
        self._gemm_nt(a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, alpha)

    def gemm_fp8_fp8_bf16_nt(
        self,
        lhs: tuple[torch.Tensor, torch.Tensor],
        rhs: tuple[torch.Tensor, torch.Tensor],
        out: torch.Tensor,
    ) -> None:
        """DeepGEMM v1: out = lhs @ rhs.T, FP32 1x128 LHS and 128x128 RHS scales, BF16 out."""
        if self.arch_major != 9:
            raise RuntimeError(f"DeepGEMM v1 kernels are Hopper (SM90) only; emulating {self.arch}")
        lhs_t, lhs_scales = lhs
        rhs_t, rhs_scales = rhs
        m, k = lhs_t.shape
        n, k_ = rhs_t.shape
        m_, n_ = out.shape
        checks = [
            (n % 64 == 0 and k % 128 == 0, "n % 64 == 0 and k % 128 == 0"),
            (m == m_ and n == n_ and k == k_, "m == m_ and n == n_ and k == k_"),
            (n > 0 and k > 0, "n > 0 and k > 0"),
            (tuple(lhs_scales.shape) == (m, ceil_div(k, 128)), "lhs_scales.shape == (m, (k + 127) // 128)"),
            (
                tuple(rhs_scales.shape) == (ceil_div(n, 128), ceil_div(k, 128)),
                "rhs_scales.shape == ((n + 127) // 128, (k + 127) // 128)",
            ),
            (lhs_t.dtype == torch.float8_e4m3fn and lhs_scales.dtype == torch.float32, "lhs dtypes"),
            (rhs_t.dtype == torch.float8_e4m3fn and rhs_scales.dtype == torch.float32, "rhs dtypes"),
            (out.dtype == torch.bfloat16, "out.dtype == torch.bfloat16"),
            (lhs_t.is_contiguous() and rhs_t.is_contiguous() and out.is_contiguous(), "contiguous lhs, rhs, out"),
            (rhs_scales.is_contiguous(), "rhs_scales.is_contiguous()"),
        ]
        for ok, condition in checks:
            if not ok:
                raise AssertionError(condition)
        if self.layout_check == "strict" and not self._is_mn_major_tma(lhs_scales, m):
            raise AssertionError(
                f"lhs_scales must be TMA-aligned and transposed: strides (1, {_tma_aligned(m, 4)}) expected, "
                f"got {tuple(lhs_scales.stride())}; use get_col_major_tma_aligned_tensor "
                "(layout_check='transform' emulates the slow per-call fix-up)"
            )
        if m == 0:
            return
        per_row_b = rhs_scales.double().repeat_interleave(128, 0)[:n]
        self._write(out, None, lhs_t, lhs_scales.double(), rhs_t, per_row_b)

    def get_col_major_tma_aligned_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """DeepGEMM v1 name of ``get_mn_major_tma_aligned_tensor``."""
        return self.get_mn_major_tma_aligned_tensor(x)

    # ----------------------------------------------------------------- implementation

    @staticmethod
    def _is_mn_major_tma(sf: torch.Tensor, mn: int) -> bool:
        """The layout ``get_mn_major_tma_aligned_tensor`` returns as is (2.6.1 smxx_layout.hpp:
        ``stride(1) == 1 and stride(2) == tma_aligned_mn`` of the batched view), else copies."""
        return sf.dim() == 2 and sf.stride(0) == 1 and sf.stride(1) == _tma_aligned(mn, sf.element_size())

    @staticmethod
    def _major(t: torch.Tensor, name: str) -> str:
        _check(t.dim() == 2, f"{name}.dim() == 2", f"got shape {tuple(t.shape)}")
        _check(t.stride(-2) == 1 or t.stride(-1) == 1, f"{name}.stride(-2) == 1 or {name}.stride(-1) == 1")
        return "K" if t.stride(-1) == 1 else "MN"

    def _transform_sf(
        self,
        sf: torch.Tensor,
        mn: int,
        k: int,
        gran_mn: int,
        gran_k: int,
        disable_ue8m0_cast: bool,
        role: str,
        *,
        lenient: bool,
    ) -> tuple[str, torch.Tensor, torch.Tensor]:
        """Validate one scale tensor; return (kind, float64 per-row scales [mn, G], transformed tensor)."""
        arch = self.arch_major
        _check(sf.dtype in (torch.float32, torch.int32), f"{role} dtype is float32 or int32", f"got {sf.dtype}")
        _check(sf.dim() == 2, f"{role}.dim() == 2", f"got shape {tuple(sf.shape)}")
        groups = ceil_div(k, gran_k)
        packing = 1 if sf.dtype == torch.float32 else 4
        expected = (ceil_div(mn, gran_mn), ceil_div(k, gran_k * packing))
        _check(tuple(sf.shape) == expected, f"{role} shape == {expected}", f"got {tuple(sf.shape)}")
        strict = self.layout_check == "strict" and not lenient
        is_fp32 = sf.dtype == torch.float32

        if is_fp32 and gran_mn == 1 and gran_k == 128 and (arch == 9 or disable_ue8m0_cast):
            if strict and role == "sfa" and not self._is_mn_major_tma(sf, mn):
                raise _fail(
                    f"{role} must be MN-major and TMA-aligned",
                    f"expected strides (1, {_tma_aligned(mn, 4)}) for shape {tuple(sf.shape)}, got "
                    f"{tuple(sf.stride())}; use get_mn_major_tma_aligned_tensor (layout_check='transform' "
                    "emulates the library's per-call copy)",
                )
            return "fp32", sf.double(), self.get_mn_major_tma_aligned_tensor(sf)
        if is_fp32 and gran_mn == 128 and gran_k == 128 and (arch == 9 or disable_ue8m0_cast):
            rows, cols = sf.shape
            _check(
                (sf.stride(1) == 1 and sf.stride(0) == cols) or (sf.stride(1) == rows and sf.stride(0) == 1),
                f"{role} (SM90 128x128 SFB) contiguous or transposed-contiguous",
                f"got strides {tuple(sf.stride())}",
            )
            return "fp32", sf.double().repeat_interleave(gran_mn, 0)[:mn], sf
        if is_fp32 and gran_k == 128 and arch == 10:
            _check(not disable_ue8m0_cast, "not disable_ue8m0_cast")
            if strict:
                raise _fail(
                    f"{role} must be packed UE8M0 (int32) on SM100",
                    "FP32 scales would be re-packed on every call and rounded down to powers of two; pack "
                    "them at load time with get_mn_major_tma_aligned_packed_ue8m0_tensor "
                    "(layout_check='transform' emulates the silent cast)",
                )
            dense = sf if gran_mn == 1 else sf.repeat_interleave(gran_mn, 0)[:mn]
            return "int", _truncate_to_pow2(dense).double(), _pack_ue8m0_mn_major(dense.contiguous())
        if not is_fp32 and gran_mn == 1 and gran_k == 128 and arch == 10:
            _check(sf.stride(-2) == 1 or mn == 1, f"{role}.stride(-2) == 1 or mn == 1", "packed UE8M0 must be MN-major")
            aligned = _tma_aligned(mn, 4)
            if strict or self.api != "v2.8":  # 2.6.1 check_sf_layout asserts equality; 2.8.0 read as >=
                _check(sf.stride(-1) == aligned, f"{role}.stride(-1) == {aligned} (TMA-aligned MN)", f"got {sf.stride(-1)}")
            else:
                _check(sf.stride(-1) >= aligned and sf.stride(-1) % 4 == 0, f"{role}.stride(-1) >= {aligned}")
            return "int", unpack_ue8m0(sf, groups), sf
        raise RuntimeError(f"Unknown SF transformation ({role}: {sf.dtype}, recipe ({gran_mn}, {gran_k}), sm{arch}0)")

    def _gemm_nt(
        self,
        a: Any,
        b: Any,
        d: torch.Tensor,
        c: torch.Tensor | None,
        recipe: tuple[int, int, int] | None,
        recipe_a: tuple[int, int] | None,
        recipe_b: tuple[int, int] | None,
        compiled_dims: str,
        disable_ue8m0_cast: bool,
        alpha: float | None,
    ) -> None:
        arch = self.arch_major
        if arch not in (9, 10):
            raise RuntimeError(f"Unsupported architecture ({self.arch}); DeepGEMM FP8 GEMMs need SM90 or SM100")
        _check(isinstance(a, tuple | list) and len(a) == 2, "a is a (tensor, scaling factor) pair")
        _check(isinstance(b, tuple | list) and len(b) == 2, "b is a (tensor, scaling factor) pair")
        a_t, sfa = a
        b_t, sfb = b
        _check(isinstance(compiled_dims, str), "compiled_dims is a string")
        _check(alpha is None, "alpha is None", "alpha is not emulated by the fake")
        major_a, major_b = self._major(a_t, "a"), self._major(b_t, "b")
        if arch == 9:
            _check(major_a == "K" and major_b == "K", "major_a == K and major_b == K", "SM90 needs K-major A and B")
        self._major(d, "d")
        _check(d.stride(-1) == 1, "d.stride(-1) == 1", "the library only supports row-major output")
        for name, t in (("a", a_t), ("b", b_t)):
            _check(t.dtype == torch.float8_e4m3fn, f"{name}.scalar_type() == kFloat8_e4m3fn", f"got {t.dtype}")
        m, k = a_t.shape
        n, k_ = b_t.shape
        _check(tuple(d.shape) == (m, n) and k == k_, "m == m_ and n == n_ and k == k_")
        _check(d.dtype in (torch.bfloat16, torch.float32), "d.scalar_type() == kBFloat16 or kFloat", f"got {d.dtype}")
        _check(d.stride(0) * d.element_size() % _TMA_ALIGNMENT_BYTES == 0, "d row stride is 16-byte aligned")
        for name, t in (("a", a_t), ("b", b_t)):
            leading = t.stride(0) if t.stride(1) == 1 else t.stride(1)
            _check(leading % _TMA_ALIGNMENT_BYTES == 0, f"{name} leading stride is 16-byte aligned", f"got {leading}")
        if c is not None:
            _check(c.stride(-1) == 1 and c.shape == d.shape, "c is row-major with d's shape")
            _check(c.dtype == d.dtype, "d.scalar_type() == c.value().scalar_type()")
        if m == 0 or n == 0:  # early_return
            return
        if k == 0:  # no accumulation: d = c, or zeros
            if c is None:
                d.zero_()
            else:
                d.copy_(c)
            return

        gran_a: tuple[int, int]
        gran_b: tuple[int, int]
        if recipe_a is not None or recipe_b is not None:
            if recipe_a is None or recipe_b is None or recipe is not None:
                raise _fail("recipe or (recipe_a, recipe_b)")
            gran_a, gran_b = (recipe_a[0], recipe_a[1]), (recipe_b[0], recipe_b[1])
        else:
            if recipe is None:
                recipe = self._default_recipe(sfa, sfb)
            gran_a, gran_b = (recipe[0], recipe[2]), (recipe[1], recipe[2])
        kind_a, dense_a, _ = self._transform_sf(sfa, m, k, gran_a[0], gran_a[1], disable_ue8m0_cast, "sfa", lenient=False)
        kind_b, dense_b, _ = self._transform_sf(sfb, n, k, gran_b[0], gran_b[1], disable_ue8m0_cast, "sfb", lenient=False)

        if arch == 9:
            _check(kind_a == "fp32" and kind_b == "fp32", "SM90 takes FP32 scaling factors")
            if gran_b[0] != 1:
                _check(c is None and d.dtype == torch.bfloat16, "not c.has_value() and d is BF16 (SM90 1D2D kernel)")
        else:
            _check(kind_a == "int" and kind_b == "int", "Unsupported architecture or scaling factor types")
        self._write(d, c, a_t, dense_a, b_t, dense_b)

    def _default_recipe(self, sfa: torch.Tensor, sfb: torch.Tensor) -> tuple[int, int, int]:
        if self.arch_major == 9:
            _check(sfa.dtype == torch.float32 and sfb.dtype == torch.float32, "SM90 default recipe needs FP32 SFA and SFB")
            return (1, 128, 128)
        _check(sfb.dtype in (torch.float32, torch.int32), "sfb dtype is float32 or int32")
        return (1, 128, 128) if sfb.dtype == torch.float32 else (1, 1, 128)

    @staticmethod
    def _write(
        d: torch.Tensor,
        c: torch.Tensor | None,
        a_t: torch.Tensor,
        scale_a: torch.Tensor,
        b_t: torch.Tensor,
        scale_b: torch.Tensor,
    ) -> None:
        """d = c + (a * scale_a) @ (b * scale_b).T, with per-row [rows, K/128] float64 scales."""
        k = a_t.shape[1]
        a64 = a_t.to(torch.float64) * scale_a.repeat_interleave(128, 1)[:, :k]
        b64 = b_t.to(torch.float64) * scale_b.repeat_interleave(128, 1)[:, :k]
        result = a64 @ b64.T
        if c is not None:
            result = result + c.to(torch.float64)
        d.copy_(result.to(d.dtype))


def build(log: list[Call], **options: Any) -> tuple[FakeDeepGEMM, dict[str, Any]]:
    """Build the fake ``deep_gemm`` package; ``options`` are ``FakeDeepGEMM`` keyword knobs."""
    impl = FakeDeepGEMM(**options)

    def rec(name: str, fn: Any) -> Any:
        return recorded(log, "deep_gemm", name, fn)

    knobs = {"set_arch": impl.set_arch, "set_layout_check": impl.set_layout_check, "reset": impl.reset, "FAKE": impl}
    if impl.api == "v1":
        top = {
            "gemm_fp8_fp8_bf16_nt": rec("gemm_fp8_fp8_bf16_nt", impl.gemm_fp8_fp8_bf16_nt),
            "get_col_major_tma_aligned_tensor": rec("get_col_major_tma_aligned_tensor", impl.get_col_major_tma_aligned_tensor),
            "get_num_sms": rec("get_num_sms", impl.get_num_sms),
            "set_num_sms": rec("set_num_sms", impl.set_num_sms),
            "ceil_div": ceil_div,
        }
        return impl, {"deep_gemm": make_vendor_module("deep_gemm", {**top, **knobs}, __doc__ or "")}

    gemms = {"v2": impl.fp8_gemm_nt, "v2.6": impl.fp8_fp4_gemm_nt, "v2.8": impl.fp8_gemm_nt_v28}
    versions = {"v2": "2.1.0", "v2.6": "2.6.1", "v2.8": "2.8.0"}
    gemm = rec("fp8_gemm_nt", gemms[impl.api])  # one object under both names, as in 2.6.1 (calls recorded as fp8_gemm_nt)
    layout = {
        name: rec(name, getattr(impl, name))
        for name in (
            "get_tma_aligned_size",
            "get_mn_major_tma_aligned_tensor",
            "get_mn_major_tma_aligned_packed_ue8m0_tensor",
        )
    }
    layout_module = make_vendor_module("deep_gemm.utils.layout", layout)
    utils_module = make_vendor_module("deep_gemm.utils", {**layout, "layout": layout_module, "ceil_div": ceil_div, "align": round_up})
    grouped = FakeGroupedGEMM(impl)  # the M-grouped GEMMs (tests/fakes/deep_gemm_grouped.py)
    grouped_names = ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
                     "get_mk_alignment_for_contiguous_layout")
    top = {
        **({name: rec(name, getattr(grouped, name)) for name in grouped_names} if impl.api != "v2" else {}),
        "fp8_gemm_nt": gemm,
        **({"fp8_fp4_gemm_nt": gemm} if impl.api != "v2" else {}),
        "transform_sf_into_required_layout": rec("transform_sf_into_required_layout", impl.transform_sf_into_required_layout),
        "get_num_sms": rec("get_num_sms", impl.get_num_sms),
        "set_num_sms": rec("set_num_sms", impl.set_num_sms),
        "utils": utils_module,
        "__version__": versions[impl.api],
        **layout,
        **knobs,
    }
    return impl, {
        "deep_gemm": make_vendor_module("deep_gemm", top, __doc__ or ""),
        "deep_gemm.utils": utils_module,
        "deep_gemm.utils.layout": layout_module,
    }
