"""Fake ``flashinfer`` (flashinfer-ai/flashinfer, package ``flashinfer-python``) for CPU tests.

Emulates ``flashinfer.gemm.gemm_fp8_nt_groupwise`` (CUTLASS and TRT-LLM backends) and
``flashinfer.gemm.fp8_blockscale_gemm_sm90`` with the runner it calls
(``flashinfer.gemm.gemm_base.get_fp8_blockscale_gemm_runner_sm90``), with
``flashinfer.utils.BackendSupportedError``.

Read against the real flashinfer-python 0.7.2.post1: ``flashinfer/gemm/gemm_base.py``
(``gemm_fp8_nt_groupwise``, its ``backend_requirement`` checks, ``fp8_blockscale_gemm_sm90``),
``data/csrc/fp8_blockscale_gemm_sm90_binding.cu`` (``runGemm``: the C++ side of the sm90 call),
``data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/fp8_blockscale_gemm/
fp8_blockscale_gemm.cu`` and ``fp8_blockscale_gemm_kernel.cuh`` (``scale_1x128_kernel``, the
activation quantizer; ``gemm_dispatch``: swapAB below M = 32) and
``data/csrc/nv_internal/tensorrt_llm/deep_gemm/fp8_gemm.cuh`` (the activation-scale layout).
What ``fp8_blockscale_gemm_sm90`` does there, and the fake with it:

* bf16 ``input``: quantized inside, per token and 128-column group, exactly as
  ``scale_1x128_kernel`` does: ``amax`` of ``|x|`` with ``__hmax`` (which returns the other
  operand when one is NaN: NaN never enters ``amax``), ``scale = 448 / amax`` (1 when amax is
  0), ``q = fp8_satfinite(x * scale)``, stored dequantization scale ``1 / scale``. So a NaN
  quantizes to an fp8 NaN, and an inf makes ``amax = inf``, ``scale = 0``, ``1 / scale = inf``
  and ``q = NaN`` where x is inf (0 elsewhere): either way the output row is NaN, as a float
  reference gives NaN/inf there.
* the output is bf16 whatever ``out_dtype`` says: the binding writes ``__nv_bfloat16`` into
  the output's memory, so ``out_dtype=torch.float16`` (which the Python checks accept) yields
  bf16 bit patterns read as fp16. The fake writes the same bits.
* an fp8 ``input_scale`` is read through its pointer as an MN-major, TMA-aligned ``[K/128,
  round_up(M, 4)]`` buffer (DeepGEMM's sm90 layout), not a row-major ``[M, K/128]``; the Python
  code checks only its dtype and device. The fake requires strides ``(1, round_up(M, 4))``.
* ``input``, ``weight`` and ``weight_scale`` are read through their pointers with leading
  dimension K (resp. K/128): a non-contiguous view is silently misread; the fake rejects it.
* M = 0: the C++ check ``input_ptr != nullptr`` fails (tvm-ffi raises its ``InternalError``
  kind as ``RuntimeError``).

Knobs (on ``fake.impl``; ``set_compute_capability`` / ``reset`` are also module functions):

* ``compute_capability``: ``(major, minor)`` of the emulated GPU, default ``(10, 0)``.
* ``runner_factory``: whether ``flashinfer.gemm.gemm_base`` has
  ``get_fp8_blockscale_gemm_runner_sm90`` (:class:`FakeSm90Runner`), default True; False
  emulates a release without it (``fp8_blockscale_gemm_sm90`` still runs).
* ``version``: the emulated ``flashinfer.__version__`` (fixed at install), default
  ``"0.7.2.post1"``: below ``0.2.9`` ``gemm_fp8_nt_groupwise`` has no ``backend`` parameter (and
  ``scale_major_mode`` defaults to ``"MN"``); below ``0.6.0`` ``fp8_blockscale_gemm_sm90`` does
  not exist; below ``0.2.6`` neither exists (the two lower bounds are unverified).

The CUTLASS and TRT-LLM kernels read the scale tensors through their data pointers only, so a
non-contiguous view is silently misread by the real library; the fake rejects it instead.
0.7.2.post1 also accepts ``backend="cutile"`` (K-major scales only), which the fake does not
emulate (``BackendSupportedError``). Capability rejections raise ``BackendSupportedError`` (a
plain ``Exception`` subclass, not a ``ValueError``); argument errors raise ``ValueError`` like
FlashInfer's checks, kernel-side ``TORCH_CHECK`` failures ``RuntimeError``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from packaging.version import Version

from . import Call, ceil_div, dequantize_blockwise, make_vendor_module, recorded

#: Capabilities accepted per backend (FlashInfer main at commit 00054844; 0.2.9 - 0.5 listed
#: cutlass 100/103/120/121 and trtllm 100/103).
CUTLASS_CAPABILITIES = frozenset({100, 103, 107, 120, 121})
TRTLLM_CAPABILITIES = frozenset({100, 103, 107})
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT_DTYPES = (torch.bfloat16, torch.float16)


class BackendSupportedError(Exception):
    """Raised by FlashInfer when a backend does not support the device or problem."""


class GPUArchitectureError(Exception):
    """Raised by FlashInfer for GPU architecture errors."""


def _validate_fp8_output_dtype(dtype: torch.dtype) -> None:
    if dtype not in _OUT_DTYPES:
        raise ValueError(f"Unsupported output dtype: {dtype}. Only torch.bfloat16 and torch.float16 are supported for FP8 GEMM operations.")


def _rowmajor(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """``t`` is a contiguous tensor of exactly ``shape``."""
    return tuple(t.shape) == shape and t.is_contiguous()


def _transposed_rowmajor(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """``t`` is the ``.t()`` view of a contiguous tensor of ``shape``."""
    return t.dim() == 2 and tuple(t.t().shape) == shape and t.t().is_contiguous()


def quantize_1x128_like_flashinfer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale_1x128_kernel`` of FlashInfer 0.7.2.post1 on a bf16 ``x`` [M, K] (K % 128 == 0).

    Returns the fp8 values and the fp32 dequantization scales [M, K/128]: amax ignores NaN
    (``__hmax``), ``scale = 448 / amax`` (1 for amax 0), values ``satfinite(x * scale)``, stored
    scale ``1 / scale`` (inf where amax is inf).
    """
    m, k = x.shape
    groups = x.float().reshape(m, k // 128, 128)
    magnitude = groups.abs()
    amax = torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude).amax(dim=-1)
    fmax = torch.finfo(torch.float8_e4m3fn).max
    scale = torch.where(amax != 0, fmax / amax, torch.ones_like(amax))
    q = (groups * scale.unsqueeze(-1)).clamp(-fmax, fmax).to(torch.float8_e4m3fn).reshape(m, k)
    return q, 1.0 / scale


def _quantize_rows(x: torch.Tensor, block_rows: int) -> torch.Tensor:
    """Float64 values of ``x`` after FP8 (e4m3fn) quantisation per ``block_rows`` x 128 block."""
    rows, cols = x.shape
    rb, kb = ceil_div(rows, block_rows), ceil_div(cols, 128)
    padded = torch.zeros(rb * block_rows, kb * 128, dtype=torch.float32)
    padded[:rows, :cols] = x.float()
    blocks = padded.view(rb, block_rows, kb, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / torch.finfo(torch.float8_e4m3fn).max
    q = (blocks / scale[:, None, :, None]).view(rb * block_rows, kb * 128)[:rows, :cols].to(torch.float8_e4m3fn)
    return dequantize_blockwise(q, scale, block_rows, 128)


class FakeFlashInfer:
    """State and behaviour of one installed fake ``flashinfer``."""

    def __init__(self, *, compute_capability: tuple[int, int] = (10, 0), version: str = "0.7.2.post1",
                 runner_factory: bool = True) -> None:
        self.version = Version(version)
        self.runner_factory = runner_factory
        self.runner: Any = FakeSm90Runner()  # build() puts its functions' recorded forms in its place
        self._initial: tuple[int, int] = (int(compute_capability[0]), int(compute_capability[1]))
        self.compute_capability: tuple[int, int] = self._initial

    def set_compute_capability(self, capability: tuple[int, int]) -> None:
        """Emulate another GPU, e.g. ``(9, 0)``, ``(10, 0)``, ``(12, 0)``."""
        self.compute_capability = (int(capability[0]), int(capability[1]))

    def reset(self) -> None:
        """Restore the install-time compute capability."""
        self.set_compute_capability(self._initial)

    @property
    def sm(self) -> int:
        """Capability as FlashInfer's ``supported_compute_capability`` spells it (e.g. 100)."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    # ----------------------------------------------------------------- gemm_fp8_nt_groupwise

    def gemm_fp8_nt_groupwise(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        a_scale: torch.Tensor,
        b_scale: torch.Tensor,
        scale_major_mode: str | None = None,
        mma_sm: int = 1,
        scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        backend: str = "cutlass",
    ) -> torch.Tensor:
        """``out = (a * a_scale) @ (b * b_scale).T`` with groupwise scales (Blackwell)."""
        return self._groupwise(a, b, a_scale, b_scale, scale_major_mode, mma_sm, scale_granularity_mnk, out, out_dtype, backend)

    def gemm_fp8_nt_groupwise_legacy(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        a_scale: torch.Tensor,
        b_scale: torch.Tensor,
        scale_major_mode: str = "MN",
        mma_sm: int = 1,
        scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Pre-0.2.9 form: CUTLASS only, no ``backend`` parameter."""
        return self._groupwise(a, b, a_scale, b_scale, scale_major_mode, mma_sm, scale_granularity_mnk, out, out_dtype, "cutlass")

    def _groupwise(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        a_scale: torch.Tensor,
        b_scale: torch.Tensor,
        scale_major_mode: str | None,
        mma_sm: int,
        granularity: tuple[int, int, int],
        out: torch.Tensor | None,
        out_dtype: torch.dtype | None,
        backend: str,
    ) -> torch.Tensor:
        granularity = tuple(granularity)  # type: ignore[assignment]
        if backend not in ("cutlass", "trtllm"):
            raise BackendSupportedError(f"gemm_fp8_nt_groupwise does not support backend '{backend}' (fake emulates cutlass, trtllm)")
        supported = CUTLASS_CAPABILITIES if backend == "cutlass" else TRTLLM_CAPABILITIES
        if self.sm not in supported:
            raise BackendSupportedError(f"gemm_fp8_nt_groupwise does not support backend '{backend}' with capability {self.sm}")
        if backend == "cutlass" and scale_major_mode is None:
            raise ValueError("scale_major_mode is required in CUTLASS")
        if backend == "trtllm":
            if granularity != (1, 128, 128):
                raise ValueError("scale_granularity_mnk must be (1, 128, 128) in TRTLLM")
            if a.dim() == 2 and a.shape[1] < 256:
                raise ValueError("a.shape[1] must be >= 256 in TRTLLM")
        if a.dim() != 2 or b.dim() != 2:
            raise ValueError(f"Shape mismatch. a.shape = {a.shape}, b.shape = {b.shape}")
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"Shape mismatch. a.shape[1] = {a.shape[1]}, b.shape[1] = {b.shape[1]}")
        out_dtype = (out_dtype or torch.bfloat16) if out is None else out.dtype
        _validate_fp8_output_dtype(out_dtype)

        m, k = a.shape
        n = b.shape[0]
        if a.dtype not in _FP8_DTYPES or b.dtype != a.dtype:
            raise RuntimeError(f"a and b must share an FP8 dtype (e4m3fn or e5m2), got {a.dtype} and {b.dtype}")
        if not (a.is_contiguous() and b.is_contiguous()):
            raise RuntimeError('a must be row-major (m, k) and b row-major (n, k) ("column-major" B); both contiguous')
        if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
            raise RuntimeError(f"scales must be float32, got {a_scale.dtype} and {b_scale.dtype}")
        if k % 128 != 0:
            raise RuntimeError(f"k must be a multiple of 128 for 128-wide scale groups (fake, conservative), got {k}")
        gm = granularity[0]
        kb, nb, mb = k // 128, ceil_div(n, 128), ceil_div(m, gm)

        if backend == "cutlass":
            if scale_major_mode not in ("K", "MN"):
                raise RuntimeError("Unsupported Scale Major Mode")
            if granularity not in ((1, 128, 128), (128, 128, 128)):
                raise RuntimeError("Unsupported scale granularity")
            if self.compute_capability[0] == 10 and mma_sm not in (1, 2):
                raise RuntimeError("Unsupported MMA SM")
            if m % 4 != 0:
                raise RuntimeError(f"m must be padded to a multiple of 4 for the CUTLASS kernel (documented note), got m={m}")
            if scale_major_mode == "K":
                a_shape, b_shape = (mb, kb), (nb, kb)
            else:
                a_shape, b_shape = (kb, mb), (kb, nb)
            for name, t, shape in (("a_scale", a_scale, a_shape), ("b_scale", b_scale, b_shape)):
                if not _rowmajor(t, shape):
                    raise RuntimeError(
                        f"{name} must be a contiguous {shape} tensor for scale_major_mode={scale_major_mode!r} "
                        f"(the kernel reads the data pointer), got shape {tuple(t.shape)} strides {tuple(t.stride())}"
                    )
            logical_a = a_scale if scale_major_mode == "K" else a_scale.t()
            logical_b = b_scale if scale_major_mode == "K" else b_scale.t()
        else:
            if a.dtype != torch.float8_e4m3fn:
                raise RuntimeError("the TRT-LLM FP8 GEMM is instantiated for e4m3 inputs only")
            if out_dtype != torch.bfloat16:
                raise RuntimeError("the TRT-LLM FP8 GEMM writes bfloat16 only (fp16 is not checked upstream and would be garbage)")
            if _transposed_rowmajor(a_scale, (kb, m)):
                logical_a = a_scale
            elif _rowmajor(a_scale, (kb, m)):
                logical_a = a_scale.t()
            else:
                raise RuntimeError(
                    f"a_scale must be (m, k/128) = {(m, kb)} contiguous on the first dimension (memory [k/128, m]), "
                    f"got shape {tuple(a_scale.shape)} strides {tuple(a_scale.stride())}"
                )
            if _rowmajor(b_scale, (nb, kb)):
                logical_b = b_scale
            elif _transposed_rowmajor(b_scale, (nb, kb)):
                logical_b = b_scale.t()
            else:
                raise RuntimeError(
                    f"b_scale must be (k/128, n/128) = {(kb, nb)} contiguous on the first dimension (memory "
                    f"[n/128, k/128], the checkpoint layout), got shape {tuple(b_scale.shape)} strides {tuple(b_scale.stride())}"
                )

        if out is None:
            out = torch.empty(m, n, dtype=out_dtype)
        elif tuple(out.shape) != (m, n) or not out.is_contiguous():
            raise RuntimeError(f"out must be a contiguous ({m}, {n}) tensor, got {tuple(out.shape)} strides {tuple(out.stride())}")
        result = dequantize_blockwise(a, logical_a, gm, 128) @ dequantize_blockwise(b, logical_b, 128, 128).T
        out.copy_(result.to(out.dtype))
        return out

    # ----------------------------------------------------------------- fp8_blockscale_gemm_sm90

    def fp8_blockscale_gemm_sm90(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        weight_scale: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Hopper block-scale GEMM (DeepGEMM-derived, swapAB for M < 32); ``out = input @ weight.T``."""
        if self.sm != 90:
            raise ValueError("fp8_blockscale_gemm_sm90 is only supported on SM90 (Hopper) architecture.")
        if input.ndim != 2:
            raise ValueError(f"Input must be 2D (M, K), got shape {input.shape}")
        if weight.ndim != 2:
            raise ValueError(f"Weight must be 2D (N, K), got shape {weight.shape}")
        m, k = input.shape
        n, k_weight = weight.shape
        if k_weight != k:
            raise ValueError(f"K dimension mismatch: input has K={k}, weight has K={k_weight}")
        if k % 128 != 0:
            raise ValueError(f"K dimension must be divisible by block size (128), got K={k}")
        if n % 64 != 0:
            raise ValueError(f"N dimension must be divisible by 64, got N={n}")
        input_fp8 = input.dtype == torch.float8_e4m3fn
        weight_fp8 = weight.dtype == torch.float8_e4m3fn
        if input_fp8 and weight.dtype == torch.bfloat16:
            raise ValueError("FP8 input + BF16 weight is not supported (missing kernel implementation). ")
        if input_fp8:
            if input_scale is None:
                raise ValueError("input_scale is required when input is FP8. ")
            if input_scale.dtype != torch.float32:
                raise ValueError(f"input_scale must be float32, got {input_scale.dtype}")
            rows = ceil_div(m, 4) * 4
            if tuple(input_scale.shape) != (m, k // 128) or (m > 0 and input_scale.stride() != (1, rows)):
                raise ValueError(
                    f"input_scale must be (M, K//128) = {(m, k // 128)} with strides (1, {rows}) (fake: the kernel reads "
                    f"an MN-major TMA-aligned buffer through the pointer and would misread any other layout), got "
                    f"shape {tuple(input_scale.shape)} strides {tuple(input_scale.stride())}")
        else:
            if input.dtype != torch.bfloat16:
                raise ValueError(f"Input must be either FP8 (torch.float8_e4m3fn) or BF16 (torch.bfloat16), got {input.dtype}")
            if input_scale is not None:
                raise ValueError(
                    "input_scale should not be provided for BF16 inputs. Use FP8 inputs if you want to provide external scales."
                )
        per_token_shape, per_block_shape = (n, k // 128), (ceil_div(n, 128), k // 128)
        if weight_fp8:
            if weight_scale is None:
                raise ValueError("weight_scale is required when weight is FP8. ")
            if tuple(weight_scale.shape) not in (per_token_shape, per_block_shape):
                raise ValueError(
                    f"weight_scale shape mismatch. Expected either {per_token_shape} (per-token, 1x128 blocks) or "
                    f"{per_block_shape} (per-block, 128x128 blocks), got {weight_scale.shape}"
                )
            if weight_scale.dtype != torch.float32:
                raise ValueError(f"weight_scale must be float32, got {weight_scale.dtype}")
            if not weight_scale.is_contiguous():
                raise ValueError("weight_scale must be contiguous (fake; the runner reads the data pointer)")
        else:
            if weight.dtype != torch.bfloat16:
                raise ValueError(f"Weight must be either FP8 (torch.float8_e4m3fn) or BF16 (torch.bfloat16), got {weight.dtype}")
            if weight_scale is not None:
                raise ValueError(
                    "weight_scale should not be provided for BF16 weights. Use FP8 weights if you want to provide external scales."
                )
        if out is not None:
            if tuple(out.shape) != (m, n):
                raise ValueError(f"Output shape mismatch. Expected ({m}, {n}), got {out.shape}")
            if out.dtype not in _OUT_DTYPES:
                raise ValueError(f"Output dtype must be torch.bfloat16 or torch.float16, got {out.dtype}")
            if out_dtype is not None and out.dtype != out_dtype:
                raise ValueError(f"Output dtype mismatch. Expected {out_dtype}, got {out.dtype}")
        else:
            out_dtype = out_dtype or torch.bfloat16
            if out_dtype not in _OUT_DTYPES:
                raise ValueError(f"Output dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
            out = torch.empty(m, n, dtype=out_dtype)
        size = self.runner.get_workspace_size(m, n, k)
        if size > 0:
            self.runner.configure_workspace(torch.empty(size, dtype=torch.uint8))
        self.runner.run_gemm(input, weight, out, input_scale, weight_scale)
        return out


class FakeSm90Runner:
    """The sm90 runner ``gemm_base.get_fp8_blockscale_gemm_runner_sm90()`` returns (one per process),
    as ``fp8_blockscale_gemm_sm90_binding.cu`` defines it: what the public function calls after its
    Python checks.

    * ``get_workspace_size(m, n, k)``: the largest of its three runners' workspaces; each
      remembers the largest M (rounded up to 4) it was asked about, so the size, and where the
      kernels place their parts, follow the largest M so far. The fake returns a size of the same
      form (quantized activation and weight, their scales), not byte-exact.
    * ``configure_workspace(ws)``: keeps ``ws``'s pointer, which later calls write through.
    * ``run_gemm(input, weight, output, scales_a, scales_b)``: the C++ checks (null input at M 0,
      K match, N and K multiples of 16, a weight scale per token or per block, a workspace
      configured), then the GEMM into ``output``'s memory as bf16. The fake also rejects what
      the kernel would silently misread or overrun: non-contiguous tensors, an output not [M, N],
      a workspace smaller than the last size asked for.
    """

    def __init__(self) -> None:
        self.max_m4 = 0
        self.needed = 0
        self.workspace: torch.Tensor | None = None

    def get_workspace_size(self, shape_m: int, shape_n: int, shape_k: int) -> int:
        self.max_m4 = max(self.max_m4, ceil_div(shape_m, 4) * 4)
        m32 = ceil_div(self.max_m4, 32) * 32
        self.needed = self.max_m4 * shape_k + m32 * ceil_div(shape_k, 128) * 4 + shape_n * shape_k \
            + ceil_div(shape_n, 128) * ceil_div(shape_k, 128) * 4
        return self.needed

    def configure_workspace(self, workspace: torch.Tensor) -> None:
        self.workspace = workspace

    def run_gemm(self, input: torch.Tensor, weight: torch.Tensor, output: torch.Tensor,
                 scales_a: torch.Tensor | None, scales_b: torch.Tensor | None) -> None:
        m, k = input.shape
        n = weight.shape[0]
        if m == 0:
            raise RuntimeError("Check failed: (input_ptr != nullptr) is false: input is null")
        if weight.shape[1] != k:
            raise RuntimeError("Check failed: (shape_k == weight.size(1)) is false: K dimension mismatch")
        if k % 16 or n % 16:
            raise RuntimeError(f"N must be a multiple of 16, (K={k}, N={n})")
        input_fp8 = input.dtype == torch.float8_e4m3fn
        weight_fp8 = weight.dtype == torch.float8_e4m3fn
        if input_fp8 and scales_a is None:
            raise RuntimeError("scales_a is required for FP8 input")
        per_token_shape, per_block_shape = (n, ceil_div(k, 128)), (ceil_div(n, 128), ceil_div(k, 128))
        if weight_fp8 and (scales_b is None or tuple(scales_b.shape) not in (per_token_shape, per_block_shape)):
            raise RuntimeError(f"scales_b shape mismatch: expected {per_token_shape} for per-token or {per_block_shape} "
                               f"for per-block, got {None if scales_b is None else tuple(scales_b.shape)}")
        if self.workspace is None:
            raise RuntimeError("Workspace not configured. Call configure_workspace first.")
        if self.workspace.numel() < self.needed:
            raise RuntimeError(f"fake: the workspace holds {self.workspace.numel()} bytes, the kernels write {self.needed}")
        if not (input.is_contiguous() and weight.is_contiguous()):
            raise RuntimeError("input and weight must be contiguous row-major (M, K) and (N, K) tensors")
        if tuple(output.shape) != (m, n) or not output.is_contiguous() or output.element_size() != 2:
            raise RuntimeError(f"fake: output must be a contiguous 16-bit ({m}, {n}) tensor (written through its pointer), "
                               f"got {output.dtype} {tuple(output.shape)} strides {tuple(output.stride())}")
        if scales_a is not None:
            x = dequantize_blockwise(input, scales_a, 1, 128)
        else:
            x = dequantize_blockwise(*quantize_1x128_like_flashinfer(input), 1, 128)
        if weight_fp8:
            assert scales_b is not None
            rows = 1 if tuple(scales_b.shape) == per_token_shape else 128
            w = dequantize_blockwise(weight, scales_b, rows, 128)
        else:
            w = _quantize_rows(weight, 128)
        output.view(torch.bfloat16).copy_((x @ w.T).to(torch.bfloat16))  # the binding writes bf16 whatever the dtype


def build(log: list[Call], **options: Any) -> tuple[FakeFlashInfer, dict[str, Any]]:
    """Build the fake ``flashinfer`` package; ``options`` are ``FakeFlashInfer`` keyword knobs."""
    impl = FakeFlashInfer(**options)
    gemm_attrs: dict[str, Any] = {}
    if impl.version >= Version("0.2.9"):
        gemm_attrs["gemm_fp8_nt_groupwise"] = recorded(log, "flashinfer", "gemm_fp8_nt_groupwise", impl.gemm_fp8_nt_groupwise)
    elif impl.version >= Version("0.2.6"):
        gemm_attrs["gemm_fp8_nt_groupwise"] = recorded(log, "flashinfer", "gemm_fp8_nt_groupwise", impl.gemm_fp8_nt_groupwise_legacy)
    base_attrs: dict[str, Any] = {}
    if impl.version >= Version("0.6.0"):
        gemm_attrs["fp8_blockscale_gemm_sm90"] = recorded(log, "flashinfer", "fp8_blockscale_gemm_sm90", impl.fp8_blockscale_gemm_sm90)
        runner = impl.runner
        impl.runner = SimpleNamespace(**{name: recorded(log, "flashinfer", name, getattr(runner, name))
                                         for name in ("get_workspace_size", "configure_workspace", "run_gemm")})
        base_attrs["fp8_blockscale_gemm_sm90"] = gemm_attrs["fp8_blockscale_gemm_sm90"]
        if impl.runner_factory:
            base_attrs["get_fp8_blockscale_gemm_runner_sm90"] = recorded(
                log, "flashinfer", "get_fp8_blockscale_gemm_runner_sm90", lambda: impl.runner)
    gemm_base = make_vendor_module("flashinfer.gemm.gemm_base", base_attrs)
    gemm = make_vendor_module("flashinfer.gemm", {**gemm_attrs, "gemm_base": gemm_base})
    utils = make_vendor_module(
        "flashinfer.utils",
        {"BackendSupportedError": BackendSupportedError, "GPUArchitectureError": GPUArchitectureError},
    )
    top = make_vendor_module(
        "flashinfer",
        {
            "__version__": str(impl.version),
            "gemm": gemm,
            "utils": utils,
            "set_compute_capability": impl.set_compute_capability,
            "reset": impl.reset,
            "FAKE": impl,
        },
        __doc__ or "",
    )
    return impl, {"flashinfer": top, "flashinfer.gemm": gemm, "flashinfer.gemm.gemm_base": gemm_base,
                  "flashinfer.utils": utils}
