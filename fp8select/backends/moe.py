"""MoE experts backends: what each declares, and the reference, Triton and torch ones.

A MoE backend runs the whole experts op of :mod:`fp8select.kernels.moe_reference` (routing, both
grouped GEMMs, ``silu(gate) * up`` and its quantization, the weighted sum) in one or more
*layouts* (its ways of grouping the tokens: ``sorted`` blocks, DeepGEMM's ``contiguous`` and
``masked``). Like the dense backends it is declared data (``requires``: probes over a
:class:`~fp8select.capabilities.Capabilities`; a problem gate) with ``prepare`` (load time) and
``bind`` (one route's call, bound once). Vendor packages are imported only in ``prepare``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from fp8select.backends.base import NOT_IMPLEMENTED, device_gate, requirements_met
from fp8select.backends.triton import TRITON_DEVICES
from fp8select.capabilities import Capabilities
from fp8select.detect import FLASHINFER_MOE_SOURCE
from fp8select.probes import (
    ComputeCapability,
    DeviceKind,
    Float8Dtype,
    Functional,
    HasScaledMM,
    Package,
    PackageSymbols,
    Probe,
    ToolkitVersion,
)
from fp8select.problem import dtype_name
from fp8select.verdict import Verdict

__all__ = ["FlashInferMoe", "Helpers", "MoeBackend", "MoeLaunch", "MoeProblem", "MoeWeights", "RecordedLaunch",
           "ReferenceMoe", "Replayed", "TorchGroupedMoe", "TritonMoe", "gather_rows", "helpers", "nan_where_nonfinite",
           "replayed"]

MoeLaunch = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""One route's call, bound at prepare time: ``launch(x, topk_weights, topk_ids) -> y`` on checked inputs (M >= 1)."""


@dataclass(frozen=True)
class MoeProblem:
    """One MoE experts layer: ``experts`` experts of hidden size H and intermediate size I, ``top_k``
    experts per token (None: not known at load time), ``m`` tokens (None: any)."""

    experts: int
    hidden: int
    intermediate: int
    top_k: int | None = None
    block_size: tuple[int, int] = (128, 128)
    m: int | None = None
    weight_dtype: torch.dtype = torch.float8_e4m3fn
    act_dtype: torch.dtype = torch.bfloat16

    def describe(self) -> str:
        m = "any M" if self.m is None else f"M={self.m}"
        k = "" if self.top_k is None else f", k={self.top_k}"
        bn, bk = self.block_size
        return (f"MoE E={self.experts}, H={self.hidden}, I={self.intermediate}{k}, {m}, block [{bn}, {bk}], "
                f"weight {dtype_name(self.weight_dtype)}, input {dtype_name(self.act_dtype)}")


@dataclass(frozen=True)
class MoeWeights:
    """A layer's checkpoint tensors: ``w13`` ``[E, 2I, H]`` (gate rows, then up rows), ``w2`` ``[E, H, I]``,
    fp8, and their fp32 block scales."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    block_size: tuple[int, int]

    def contiguous(self) -> MoeWeights:
        """The same tensors, each contiguous (a view where it already is: no copy)."""
        return MoeWeights(self.w13.contiguous(), self.w13_scale.contiguous(), self.w2.contiguous(),
                          self.w2_scale.contiguous(), self.block_size)


def gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of an fp8 (or any 1-byte) tensor, through a uint8 view."""
    return t.view(torch.uint8).index_select(0, index).view(t.dtype)


def nan_where_nonfinite(y: torch.Tensor, x: torch.Tensor, topk_ids: torch.Tensor, experts: int) -> torch.Tensor:
    """``y`` with NaN rows where ``x``'s row holds a NaN or inf and the token has an expert in ``[0, E)``: the
    semantics' promise (docs/moe.md), kept around a vendor whose own activation quantizer may drop NaN (as the
    dense vendors' did, FACTS.md) and whose behaviour on one is not verified. A few small launches."""
    routed = ((topk_ids >= 0) & (topk_ids < experts)).any(dim=1)
    poisoned = (~torch.isfinite(x).all(dim=1)) & routed
    return y.masked_fill(poisoned.unsqueeze(1), float("nan"))


class Helpers(NamedTuple):
    """What a vendor backend runs around its grouped GEMMs (:func:`helpers`). Each takes the record of a call
    being recorded for replay (:class:`Replayed`; ``record=`` but for ``vendor_call``); the torch ones record
    nothing (a call on them is never replayed)."""

    quantize_slots: Any
    """``quantize_slots(x, rows, top_k, q, scale)``: the tokens quantized into the vendor's rows and scale layout."""
    silu_mul_quant: Any
    """``silu_mul_quant(h, dtype, ...) -> (q, scale)``: the gate-up output's activation, quantized."""
    weighted_sum: Any
    """``weighted_sum(out, row_map, topk_ids, topk_weights, experts, dtype) -> y``."""
    vendor_call: Any
    """``vendor_call(record, fn, *tensors)``: ``fn(*tensors)``, the vendor's own call, a step of the record."""


def helpers(device: torch.device) -> Helpers:
    """What a vendor backend runs around its grouped GEMMs: fp8select's Triton kernels on a GPU, torch elsewhere
    (CPU tests against the fakes)."""
    if device.type == "cuda":
        from fp8select.kernels.call_replay import vendor_call
        from fp8select.kernels.moe_triton import quantize_slots, silu_mul_quant, weighted_sum

        return Helpers(quantize_slots, silu_mul_quant, weighted_sum, vendor_call)
    from fp8select.kernels.moe_reference import quantize_slots_torch, silu_mul_quant_torch, weighted_sum_torch

    return Helpers(quantize_slots_torch, silu_mul_quant_torch, weighted_sum_torch, _plain_call)


def _plain_call(record: object, fn: Callable[..., object], *tensors: torch.Tensor) -> None:
    """``vendor_call`` off a GPU: ``fn(*tensors)``, nothing recorded."""
    fn(*tensors)


RecordedLaunch = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]
"""A vendor route's call with the record its launches and vendor steps go to: ``launch(x, topk_weights,
topk_ids, record) -> y``."""


def replayed(launch: RecordedLaunch, hidden: int, device: torch.device) -> MoeLaunch:
    """``launch`` as a route's call: on CUDA, its calls under one M, k and dtypes replayed from the third on
    (:class:`Replayed`); elsewhere every call made afresh."""
    if device.type != "cuda":
        return lambda x, topk_weights, topk_ids: launch(x, topk_weights, topk_ids, None)
    return Replayed(launch, hidden, device)


class Replayed:
    """A vendor route's call whose calls are replayed (:class:`~fp8select.kernels.call_replay.CallReplays`, in
    :attr:`calls`, keyed by M, k and the dtypes): its Triton launches without their Python, the vendor's own calls
    made again on the new call's tensors."""

    __slots__ = ("_hidden", "_launch", "calls")

    def __init__(self, launch: RecordedLaunch, hidden: int, device: torch.device) -> None:
        from fp8select.kernels.call_replay import CallReplays

        self._launch, self._hidden = launch, hidden
        self.calls = CallReplays(device, ())  # a vendor step holds the weights it reads; no launch reads them

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        m, k = topk_ids.shape
        return self.calls((m, k, x.dtype, topk_weights.dtype, topk_ids.dtype), (x, topk_weights, topk_ids),
                          (m, self._hidden), x.dtype, lambda record: self._launch(x, topk_weights, topk_ids, record))


class MoeBackend:
    """Base of every MoE backend (class-level declarations; ``prepare``, ``bind``)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    requires: ClassVar[tuple[Probe, ...]] = ()
    layouts: ClassVar[tuple[str, ...]] = ("sorted",)
    block_sizes: ClassVar[tuple[tuple[int, int], ...]] = ((128, 128),)
    activation_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    implemented: ClassVar[bool] = True
    packages: ClassVar[tuple[str, ...]] = ()
    aligned_k_why: ClassVar[str | None] = None
    """Why H and I (the K of the two grouped GEMMs) must be multiples of 128, for a backend whose kernels
    need it (None: any H and I)."""

    def check(self, caps: Capabilities) -> Verdict:
        """Device-level gate: every probe of ``requires``, then whether it is implemented."""
        rejected = device_gate(self.requires, self.implemented, caps)
        return Verdict.accept(requirements_met(self.requires, caps)) if rejected is None else rejected

    def supports(self, problem: MoeProblem, caps: Capabilities, layout: str) -> Verdict:
        """Problem-level gate of one layout: block size, dtypes; subclasses add shapes and M."""
        if layout not in self.layouts:
            return Verdict.reject(f"requires layout {'/'.join(self.layouts)}, found {layout}")
        if tuple(problem.block_size) not in self.block_sizes:
            allowed = ", ".join(f"[{bn}, {bk}]" for bn, bk in self.block_sizes)
            return Verdict.reject(f"requires block size {allowed}, found {list(problem.block_size)}")
        if problem.act_dtype not in self.activation_dtypes:
            allowed = "/".join(dtype_name(d) for d in self.activation_dtypes)
            return Verdict.reject(f"requires activations {allowed}, found {dtype_name(problem.act_dtype)}")
        if problem.weight_dtype != torch.float8_e4m3fn:
            return Verdict.reject(f"requires weight float8_e4m3fn, found {dtype_name(problem.weight_dtype)}")
        if self.aligned_k_why is not None:
            unaligned = reject_unaligned(problem, self.aligned_k_why)
            if unaligned is not None:
                return unaligned
        return Verdict.accept(f"supports {problem.describe()} ({layout})")

    def default_config(self, problem: MoeProblem, layout: str, bucket: int) -> Any:
        """The launch configuration of M bucket ``bucket`` where nothing measured it (None: the backend has
        none); ``problem`` is the layer, whose ``m`` may be None: ``bucket`` is the M."""
        return None

    def launch_config(self, config: Any) -> Any:
        """A measured row's ``config`` in the form :meth:`bind` takes."""
        return None

    def tuning_configs(self, problem: MoeProblem, layout: str, bucket: int) -> list[Any]:
        """The configurations ``tune --moe`` times for one bucket, the default first (here: the default only)."""
        return [self.default_config(problem, layout, bucket)]

    def prepare(self, weights: MoeWeights, caps: Capabilities) -> Any:
        """Load-time layout work; the default keeps the checkpoint's tensors."""
        return weights

    def bind(self, prepared: Any, layout: str, config: Any, caps: Capabilities) -> MoeLaunch:
        raise NotImplementedError(f"{self.name}: {NOT_IMPLEMENTED}")

    def __repr__(self) -> str:
        return f"<moe backend {self.name}>"


class ReferenceMoe(MoeBackend):
    name = "reference"
    summary = "pure torch (exact fp8 block products in fp64, a loop over the experts used); any device, slow, no CUDA graphs"
    invariant: ClassVar[str | None] = ("each token alone: exact fp8 block products in float64, its k experts' outputs "
                                       "added in a fixed order (fp8select/kernels/moe_reference.py)")
    requires: ClassVar[tuple[Probe, ...]] = (Float8Dtype("float8_e4m3fn"),)
    block_sizes = ((128, 128), (1, 128))
    activation_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def bind(self, prepared: Any, layout: str, config: Any, caps: Capabilities) -> MoeLaunch:
        from fp8select.kernels.moe_reference import experts_reference

        w: MoeWeights = prepared
        return lambda x, weights, ids: experts_reference(x, w.w13, w.w13_scale, w.w2, w.w2_scale, weights, ids,
                                                         w.block_size)


class TritonMoe(MoeBackend):
    name = "triton"
    summary = "fp8select's Triton grouped kernels: sorted blocks, fused silu*up and 1x128 quantization"
    requires: ClassVar[tuple[Probe, ...]] = (Package("triton"), TRITON_DEVICES)
    activation_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def default_config(self, problem: MoeProblem, layout: str, bucket: int) -> Any:
        from fp8select.kernels.moe_config import default_config

        return default_config(bucket, problem.top_k or 1, problem.experts)

    def launch_config(self, config: Any) -> Any:
        from fp8select.kernels.moe_config import MoeTritonConfig

        return MoeTritonConfig.from_dict(config)

    def tuning_configs(self, problem: MoeProblem, layout: str, bucket: int) -> list[Any]:
        from fp8select.kernels.moe_config import tuning_configs

        return tuning_configs(bucket, problem.top_k or 1, problem.experts)

    def prepare(self, weights: MoeWeights, caps: Capabilities) -> Any:
        """The kernels bound to the weights; on gfx942, whose Triton multiplies e4m3fnuz (its e4m3fn dot
        fails there, as the dense backend says), an e4m3fnuz copy of e4m3fn experts (the same values:
        :func:`~fp8select.kernels.vendor_layouts.e4m3fn_to_e4m3fnuz`), and the activations are quantized
        onto e4m3fnuz's grid (``amax / 240``), as the dense Triton backend does there."""
        from fp8select.kernels.moe_triton import TritonExperts

        w13, s13, w2, s2 = weights.w13, weights.w13_scale, weights.w2, weights.w2_scale
        if caps.gfx_arch == "gfx942" and w13.dtype == torch.float8_e4m3fn:
            from fp8select.kernels.vendor_layouts import e4m3fn_to_e4m3fnuz

            (w13, s13), (w2, s2) = e4m3fn_to_e4m3fnuz(w13, s13), e4m3fn_to_e4m3fnuz(w2, s2)
        return TritonExperts(w13, s13, w2, s2)

    def bind(self, prepared: Any, layout: str, config: Any, caps: Capabilities) -> MoeLaunch:
        return lambda x, weights, ids: prepared(x, weights, ids, config)


class TorchGroupedMoe(MoeBackend):
    """torch ``F.scaled_grouped_mm`` with block-wise recipes. Declared so that ``explain`` says why it
    does not run: on torch 2.11 / sm90 the block-wise recipes raise ``No gemm implementation was found``
    (measured on the H200). It is accepted only where a functional probe found it working."""

    name = "cuda-scaled-grouped-mm"
    summary = "torch F.scaled_grouped_mm block-wise (cuBLAS/CUTLASS grouped)"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        HasScaledMM(),
        Functional("cuda_blockwise_scaled_grouped_mm",
                   "block-wise F.scaled_grouped_mm tried on a small problem; torch 2.11 on sm90 raises "
                   "'No gemm implementation was found'"),
    )
    implemented = False


class FlashInferMoe(MoeBackend):
    """FlashInfer's ``cutlass_fused_moe(..., use_deepseek_fp8_block_scale=True)`` (the whole experts op, TRT-LLM's
    CUTLASS MoE). Declared so that ``explain`` says why it does not run; no adapter is written.

    From FlashInfer 0.7.2.post1's sources (``fused_moe/core.py``): block-scale FP8 raises ``NotImplementedError``
    unless the device is sm90 ("not yet implemented for Blackwell") and CUDA >= 12.8; the sm90 module is built by
    NVCC at first use from ``csrc/fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding.cu``,
    ``cutlass_fused_moe_instantiation.cu`` and generated CUTLASS instantiations. The trimmed package this project
    runs on the H200 ships neither of those two files (the full wheel's RECORD lists them) and no prebuilt
    ``fused_moe_90`` module, so there it cannot build: the last probe reads the binding source's
    ``FusedMoeRunner`` through detection. A package from the JIT-cache distribution (prebuilt modules) would
    be rejected too, conservatively."""

    name = "flashinfer"
    summary = "FlashInfer cutlass_fused_moe with DeepSeek FP8 block scales (JIT-built TRT-LLM CUTLASS MoE), sm90"
    requires: ClassVar[tuple[Probe, ...]] = (
        DeviceKind(("cuda",)),
        ComputeCapability(allowed=((9, 0),)),
        ToolkitVersion("cuda", ">=12.8", "FlashInfer FP8 block-scale MoE"),
        Package("flashinfer", why="cutlass_fused_moe"),
        PackageSymbols("flashinfer", ("cutlass_fused_moe",), "FlashInfer's fused MoE entry point"),
        PackageSymbols("flashinfer", ("FusedMoeRunner",),
                       f"{FLASHINFER_MOE_SOURCE}, which cutlass_fused_moe compiles at first use; the trimmed "
                       "0.7.2.post1 package lacks it and ships no prebuilt fused_moe_90 module"),
    )
    implemented = False


def reject_unaligned(problem: MoeProblem, why: str) -> Verdict | None:
    """A rejection unless H and I (the K of the two grouped GEMMs) are multiples of 128 (``why`` says
    which kernel needs it), else None."""
    for what, value in (("H", problem.hidden), ("I", problem.intermediate)):
        if value % 128:
            return Verdict.reject(f"requires {what} % 128 == 0 ({why}), found {what}={value}")
    return None
