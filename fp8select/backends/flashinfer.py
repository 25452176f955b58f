"""``flashinfer``: FlashInfer's block-scaled FP8 GEMMs, one kernel family per GPU generation.

API followed (docs/vendor-apis.md, "FlashInfer"; flashinfer-ai/flashinfer
flashinfer/gemm/gemm_base.py at commit 00054844 and the 0.2.9 - 0.6 releases):

* ``trtllm`` (sm100, sm103): ``flashinfer.gemm.gemm_fp8_nt_groupwise(a, b, a_scale, b_scale,
  out_dtype=torch.bfloat16, backend="trtllm")`` (the ``backend`` parameter since 0.2.9).
  ``a_scale`` fp32 [M, K/128] "contiguous on the first dimension" (strides (1, M), written so by
  the quantizer); ``b_scale`` the checkpoint's [N/128, K/128] row-major scale as is. bf16 output
  only, K >= 256.
* ``cutlass`` (sm120, sm121; GB10 is sm121): the same function with ``scale_major_mode="MN"``
  and ``backend="cutlass"``: ``a_scale`` a contiguous [K/128, M] tensor (the M-major quantizer
  output's ``.t()``), ``b_scale`` a contiguous [K/128, N/128] tensor (the checkpoint's scale
  transposed once in :meth:`FlashInferBackend.prepare`), as SGLang calls it. The kernel reads
  the scales through their data pointers, so a wrong layout is misread, never copied. M is
  padded to a multiple of 4 (the docstring's note).
* ``sm90`` (flashinfer >= 0.6.0; read and run in 0.7.2.post1): ``flashinfer.gemm.
  fp8_blockscale_gemm_sm90(x_bf16, W, None, S_w, out_dtype=torch.bfloat16)``: bf16 activations,
  quantized inside (by its source, its 1x128 quantizer makes the output row of an activation
  row holding a NaN or an inf NaN, so no fix-up is applied); the checkpoint weight and scale as
  is, read through their pointers (contiguous). N % 64, K % 128 (its checks). bf16 output
  only: the binding writes bf16 whatever ``out_dtype`` says. Any M (a swapAB kernel below 32);
  SGLang uses it only for M < 32 (above that its non-swapAB kernel was slower than DeepGEMM),
  which the plan applies as a speed rule where nothing was measured
  (:meth:`FlashInferBackend.preferred_m`); measured routes decide otherwise. A bound launch
  calls, after the first call, the runner that function calls (``gemm_base.
  get_fp8_blockscale_gemm_runner_sm90()``: ``get_workspace_size``, ``configure_workspace``,
  ``run_gemm``), skipping its Python checks (:meth:`FlashInferBackend.bind`).

None of these take a bias, so it is added afterwards. sm107 is accepted by FlashInfer main
and 0.7.2.post1 (its requirement lists) but no sm107 kernel was run, so it is not gated in. N and K not multiples of 128 are unverified
for the groupwise kernels and go to the fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch

from fp8select.backends._vendor import (
    EntryPoint,
    add_bias,
    dtypes_ok,
    entry_points_gate,
    lookup,
    multiple_of,
    pad_rows,
    quantized_input,
    require,
)
from fp8select.backends.base import Backend, BLOCK_128x128, Launch, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.guard import call_foreign
from fp8select.kernels.quant import M_MAJOR, ScaleLayout
from fp8select.probes import AllOf, AnyOf, ComputeCapability, DeviceKind, Package, Probe
from fp8select.probes.core import PackageSymbols
from fp8select.problem import Problem, dtype_name
from fp8select.verdict import Verdict

MODULE = "flashinfer.gemm"
GROUPWISE = "gemm_fp8_nt_groupwise"
HOPPER_GEMM = "fp8_blockscale_gemm_sm90"
TRTLLM, CUTLASS, SM90 = "trtllm", "cutlass", "sm90"

# The FlashInfer kernel each compute capability runs (data, not branches).
KERNELS: dict[tuple[int, int], str] = {(10, 0): TRTLLM, (10, 3): TRTLLM, (12, 0): CUTLASS, (12, 1): CUTLASS, (9, 0): SM90}
ENTRY_POINTS = {TRTLLM: GROUPWISE, CUTLASS: GROUPWISE, SM90: HOPPER_GEMM}
OUT_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    TRTLLM: (torch.bfloat16,),  # the TRT-LLM kernel writes bf16 only (fp16 would be misread)
    CUTLASS: (torch.bfloat16, torch.float16),
    SM90: (torch.bfloat16,),  # the binding writes bf16 into any output (fp16 would be misread)
}
TRTLLM_MIN_K = 256
SM90_MAX_M = 31  # SGLang's bound for fp8_blockscale_gemm_sm90; a speed rule (preferred_m)
CUTLASS_M_MULTIPLE = 4
CUTLASS_SCALE_MAJOR_MODE = "MN"  # as SGLang calls it: both scales transposed-contiguous

# What ``fp8_blockscale_gemm_sm90`` calls after its argument checks (0.7.2.post1): a bound launch calls it directly.
RUNNER_MODULE = "flashinfer.gemm.gemm_base"
RUNNER_FACTORY = "get_fp8_blockscale_gemm_runner_sm90"
RUNNER_FUNCTIONS = ("get_workspace_size", "configure_workspace", "run_gemm")

_GROUPWISE_RELEASE = "gemm_fp8_nt_groupwise with backend= since 0.2.9"
FLASHINFER_KERNELS = AnyOf((
    AllOf((ComputeCapability(allowed=((10, 0), (10, 3))), Package("flashinfer", ">=0.2.9", _GROUPWISE_RELEASE),
           PackageSymbols("flashinfer", (GROUPWISE,)))),
    AllOf((ComputeCapability(allowed=((12, 0), (12, 1))), Package("flashinfer", ">=0.2.9", _GROUPWISE_RELEASE),
           PackageSymbols("flashinfer", (GROUPWISE,)))),
    AllOf((ComputeCapability(allowed=((9, 0),)), Package("flashinfer", ">=0.6.0", HOPPER_GEMM),
           PackageSymbols("flashinfer", (HOPPER_GEMM,)))),
))


class _Runner(NamedTuple):
    """FlashInfer's sm90 runner and the three of its functions ``fp8_blockscale_gemm_sm90`` calls."""

    module: Any  # kept alive: the functions are bound to it
    workspace_size: Callable[[int, int, int], int]
    configure_workspace: Callable[[torch.Tensor], None]
    run_gemm: Callable[..., None]


def _runner(factory: EntryPoint) -> _Runner | None:
    """The runner ``factory`` returns (once FlashInfer's own call has built it), or None when it is
    not what 0.7.2.post1's ``fp8_blockscale_gemm_sm90`` calls: then the public function stays."""
    made = call_foreign(factory.fn)
    functions: list[Any] = [getattr(made.value, name, None) for name in RUNNER_FUNCTIONS] if made.error is None else []
    if len(functions) != len(RUNNER_FUNCTIONS) or not all(callable(f) for f in functions):
        return None
    return _Runner(made.value, *functions)


def kernel_for(caps: Capabilities) -> str | None:
    """The FlashInfer kernel this device takes (``trtllm``, ``cutlass``, ``sm90``), or None."""
    cc = caps.compute_capability
    return KERNELS.get(tuple(cc)) if cc is not None else None  # type: ignore[arg-type]


class FlashInferBackend(Backend):
    name = "flashinfer"
    jit = True
    summary = ("FlashInfer gemm_fp8_nt_groupwise (sm100/103 trtllm, sm120/121 cutlass) "
               "or fp8_blockscale_gemm_sm90 (sm90)")
    requires: ClassVar[tuple[Probe, ...]] = (DeviceKind(("cuda",)), Package("flashinfer"), FLASHINFER_KERNELS)
    block_sizes = (BLOCK_128x128,)
    n_multiple = 64  # every kernel; the groupwise ones need N % 128 (see supports)
    k_multiple = 128
    packages = ("flashinfer",)

    # Activation-scale layouts per kernel (class attributes so a test can substitute a wrong one).
    trtllm_scale_layout: ClassVar[ScaleLayout] = M_MAJOR
    cutlass_scale_layout: ClassVar[ScaleLayout] = M_MAJOR  # its .t() is the contiguous [K/128, M] "MN" scale

    @property
    def input_scale_layout(self) -> ScaleLayout:
        """M-major (strides (1, M)), what both groupwise kernels read."""
        return self.trtllm_scale_layout

    def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
        """Per kernel: output dtype, N/K alignment, TRT-LLM's K >= 256, the sm90 kernel's bf16 input."""
        verdict = super().supports(problem, caps)
        if not verdict.ok:
            return verdict
        kernel = kernel_for(caps)
        if kernel is None:
            return Verdict.reject(f"requires compute capability {'/'.join(f'sm{a}{b}' for a, b in KERNELS)}, "
                                  f"found {caps.compute_capability}")
        if problem.out_dtype not in OUT_DTYPES[kernel]:
            allowed = "/".join(dtype_name(d) for d in OUT_DTYPES[kernel])
            return Verdict.reject(f"requires output {allowed} on the {kernel} kernel, found {dtype_name(problem.out_dtype)}")
        if kernel == SM90:
            rejected = self._sm90_gate(problem)
        else:
            rejected = (dtypes_ok(problem, (torch.float8_e4m3fn,), (torch.float8_e4m3fn,))
                        or multiple_of(problem, n=128, why="partial N blocks unverified on the groupwise kernels"))
            if rejected is None and kernel == TRTLLM and problem.k < TRTLLM_MIN_K:
                rejected = Verdict.reject(f"requires K >= {TRTLLM_MIN_K} on the trtllm kernel, found K={problem.k}")
        if rejected is not None:
            return rejected
        return entry_points_gate(problem, verdict, caps, MODULE, (ENTRY_POINTS[kernel],))

    @staticmethod
    def _sm90_gate(problem: Problem) -> Verdict | None:
        if problem.pre_quantized or problem.act_dtype != torch.bfloat16:
            return Verdict.reject(f"requires bfloat16 activations on the sm90 kernel (the kernel quantizes them), "
                                  f"found {dtype_name(problem.act_dtype)}")
        return dtypes_ok(problem, (torch.float8_e4m3fn,), ())

    def preferred_m(self, caps: Capabilities) -> int | None:
        """Without measurements, only M <= 31 on sm90: SGLang found its non-swapAB kernel slower than
        DeepGEMM above that. A speed rule for the plan, not a gate: measured routes decide."""
        return SM90_MAX_M if kernel_for(caps) == SM90 else None

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """The weight as is (shared); the weight scale as is, or transposed-contiguous for cutlass "MN"."""
        kernel = kernel_for(caps)
        if kernel is None:
            raise ValueError(f"flashinfer: no kernel for compute capability {caps.compute_capability}")
        gemm = require(MODULE, (ENTRY_POINTS[kernel],))
        n, k = weight.shape
        w = weight.contiguous()
        if kernel == CUTLASS:
            scale = weight_scale.t().contiguous()  # "MN" major: [K/128, N/128] contiguous, once
        else:
            scale = weight_scale.contiguous()  # [N/128, K/128]: the checkpoint
        return PreparedWeight(self.name, w, scale, block_pair(block_size), n, k, w,
                              extra={"gemm": gemm, "kernel": kernel})

    def bind(self, prepared: PreparedWeight, *, caps: Capabilities, config: Any, out_dtype: torch.dtype) -> Launch:
        """sm90: the weight bound once (the kernel quantizes). The first call runs the public
        ``fp8_blockscale_gemm_sm90``, which builds its runner; later ones call the runner's three
        functions as that function does after its argument checks (checks this layer made at
        prepare time and makes on every call). Where the runner is not found as 0.7.2.post1 has
        it, every call takes the public function. The other kernels call :meth:`run`."""
        if prepared.extra["kernel"] != SM90:
            return super().bind(prepared, caps=caps, config=config, out_dtype=out_dtype)
        gemm = prepared.extra["gemm"].fn
        weight, scale = prepared.weight, prepared.scale
        n, k = prepared.n, prepared.k
        factory = lookup(RUNNER_MODULE, (RUNNER_FACTORY,))
        runner: _Runner | None = None
        tried = isinstance(factory, Verdict)  # without the factory, every call takes the public function

        def launch(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            nonlocal runner, tried
            if runner is not None:  # what the public function runs after its checks, which prepare made
                m = x.shape[0]
                out = torch.empty(m, n, dtype=out_dtype, device=x.device)
                size = runner.workspace_size(m, n, k)  # (it also records the largest M in the runner)
                if size > 0:
                    runner.configure_workspace(torch.empty(size, dtype=torch.uint8, device=x.device))
                runner.run_gemm(x, weight, out, None, scale)
            else:
                out = gemm(x, weight, None, scale, out_dtype=out_dtype)  # builds and loads the runner
                if not tried:
                    tried = True
                    runner = _runner(factory)  # type: ignore[arg-type]
            return out if bias is None else add_bias(out, bias)

        return launch

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        gemm: EntryPoint = prepared.extra["gemm"]
        kernel = prepared.extra["kernel"]
        if kernel == SM90:
            out = gemm.fn(x.contiguous(), prepared.weight, None, prepared.scale, out_dtype=out_dtype)
            return add_bias(out, bias)
        m = x.shape[0]
        if kernel == TRTLLM:
            x_q, x_s = quantized_input(x, input_scale, torch.float8_e4m3fn, self.trtllm_scale_layout)
            out = gemm.fn(x_q, prepared.weight, x_s, prepared.scale, out_dtype=out_dtype, backend=TRTLLM)
            return add_bias(out, bias)
        x, input_scale = pad_rows(x, input_scale, CUTLASS_M_MULTIPLE)
        x_q, x_s = quantized_input(x, input_scale, torch.float8_e4m3fn, self.cutlass_scale_layout)
        out = gemm.fn(x_q, prepared.weight, x_s.t(), prepared.scale, scale_major_mode=CUTLASS_SCALE_MAJOR_MODE,
                      out_dtype=out_dtype, backend=CUTLASS)
        return add_bias(out[:m], bias)
