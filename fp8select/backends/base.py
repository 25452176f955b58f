"""What every backend declares, and the shared problem-level gate.

A backend is declared data (``name``, ``requires``, block sizes, dtypes, alignment) plus
``prepare`` (load-time layout work) and ``run`` (the forward). ``requires`` holds pure
probes evaluated against a :class:`~fp8select.capabilities.Capabilities` value; nothing
here touches a device or imports a vendor package at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch

from fp8select.capabilities import Capabilities
from fp8select.kernels.quant import ROW_MAJOR, ScaleLayout
from fp8select.probes import Probe
from fp8select.problem import Problem, dtype_name
from fp8select.verdict import Verdict

NOT_IMPLEMENTED = "not implemented in this version"

CHECKPOINT_LAYOUT = "checkpoint"
"""The weight layout of a backend that reads the checkpoint's fp8 bytes as they are (or views of them)."""

FNUZ_LAYOUT = "e4m3fnuz"
"""An e4m3fn checkpoint converted to e4m3fnuz (same bits but 0x80, scales doubled) for gfx942."""

Launch = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""One route's call bound at prepare time (:meth:`Backend.bind`): ``launch(x, bias) -> out``."""

BLOCK_128x128 = (128, 128)
BLOCK_1x128 = (1, 128)


def block_pair(block_size: Sequence[int]) -> tuple[int, int]:
    """``block_size`` as the ``(bn, bk)`` tuple a :class:`PreparedWeight` holds (a caller may pass a list).

    Layers hand backends a pair already checked by :func:`fp8select.inputs.check_block_size`;
    ``tuple()`` only changes the container, which mypy cannot see keeps it a pair.
    """
    return cast("tuple[int, int]", tuple(block_size))


@dataclass
class PreparedWeight:
    """A weight in one backend's layout, made once at load time.

    ``weight_nk`` is the fp8 weight as an [N, K] tensor (a view, no copy) when the backend's
    layout allows one, so a fallback backend can share the weight; ``scale_nk`` is its block
    scale in the checkpoint layout when that differs from the caller's (a requantized or
    fnuz-converted weight), None when the caller's scale applies; ``scale`` is the backend's
    weight-scale tensor; ``extra`` holds anything else its ``run`` needs.
    """

    backend: str
    weight: torch.Tensor
    scale: torch.Tensor
    block_size: tuple[int, int]
    n: int
    k: int
    weight_nk: torch.Tensor | None
    extra: dict[str, Any] = field(default_factory=dict)
    scale_nk: torch.Tensor | None = None


class Backend:
    """Base of every backend. Subclasses set the class-level declarations and implement
    :meth:`prepare` and :meth:`run`; they may extend :meth:`supports` / :meth:`supports_m`.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    requires: ClassVar[tuple[Probe, ...]] = ()
    block_sizes: ClassVar[tuple[tuple[int, int], ...]] = (BLOCK_128x128, BLOCK_1x128)
    activation_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    out_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    accepts_prequantized: ClassVar[bool] = True
    n_multiple: ClassVar[int] = 1
    k_multiple: ClassVar[int] = 1
    implemented: ClassVar[bool] = True
    invariant: ClassVar[str | None] = None
    """Why every output row is bitwise independent of the batch (M, position) by construction, in
    one line, or None: then only a measured record says so (:mod:`fp8select.measured.invariance`)."""
    packages: ClassVar[tuple[str, ...]] = ()
    """Import names of the packages whose versions this backend's speed depends on (besides torch,
    CUDA/HIP and Triton): measurements are kept per backend at these versions."""
    jit: ClassVar[bool] = False
    """Whether its first call at a new shape compiles a kernel into an on-disk cache that other
    processes read (``warmup(..., processes=N)`` compiles those in worker processes)."""

    def check(self, caps: Capabilities) -> Verdict:
        """Device-level gate: every probe in ``requires``, then whether compute exists."""
        rejected = device_gate(self.requires, self.implemented, caps)
        return Verdict.accept(self.accept_reason(caps)) if rejected is None else rejected

    def accept_reason(self, caps: Capabilities) -> str:
        return requirements_met(self.requires, caps)

    @property
    def input_scale_layout(self) -> ScaleLayout:
        """The activation-scale layout this backend consumes (what the quantizer writes for it)."""
        return ROW_MAJOR

    def weight_dtype(self, caps: Capabilities) -> torch.dtype:
        """The fp8 dtype this backend computes with on this device (e4m3fnuz on gfx942)."""
        return torch.float8_e4m3fn

    def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
        """Problem-level gate: block size, dtypes and N/K alignment (M via :meth:`supports_m`)."""
        if tuple(problem.block_size) not in self.block_sizes:
            supported = ", ".join(f"[{bn}, {bk}]" for bn, bk in self.block_sizes)
            bn, bk = problem.block_size
            return Verdict.reject(f"requires block size {supported}, found [{bn}, {bk}]")
        if problem.pre_quantized:
            if not self.accepts_prequantized:
                return Verdict.reject(f"requires unquantized activations, found pre-quantized {dtype_name(problem.act_dtype)}")
        elif problem.act_dtype not in self.activation_dtypes:
            allowed = "/".join(dtype_name(d) for d in self.activation_dtypes)
            return Verdict.reject(f"requires activations {allowed}, found {dtype_name(problem.act_dtype)}")
        if problem.out_dtype not in self.out_dtypes:
            allowed = "/".join(dtype_name(d) for d in self.out_dtypes)
            return Verdict.reject(f"requires output {allowed}, found {dtype_name(problem.out_dtype)}")
        if problem.n % self.n_multiple:
            return Verdict.reject(f"requires N % {self.n_multiple} == 0, found N={problem.n}")
        if problem.k % self.k_multiple:
            return Verdict.reject(f"requires K % {self.k_multiple} == 0, found K={problem.k}")
        if problem.m is not None:
            return self.supports_m(problem.m, caps)
        return Verdict.accept(f"supports {problem.describe()}")

    def weight_layout(self, caps: Capabilities, problem: Problem) -> str:
        """How :meth:`prepare` stores the fp8 weight: :data:`CHECKPOINT_LAYOUT` when it keeps the
        checkpoint's bytes (the tensor or views of it), else a name for its copy (requantized,
        converted, shuffled). Backends with the same name share one copy; each other name costs
        one more weight in memory."""
        return CHECKPOINT_LAYOUT

    def preferred_m(self, caps: Capabilities) -> int | None:
        """The largest M this backend should run when nothing was measured (a speed rule the plan
        applies only without measurements), or None for any M."""
        return None

    def launch_config(self, config: Mapping[str, Any]) -> Any:
        """A measured launch configuration (a tuning-table row's ``config``) in the form :meth:`run`
        takes as ``config=``; backends without launch parameters have none."""
        return None

    def fit_config(self, config: Any, measured_at: tuple[int, int], problem: Problem, m: int) -> Any:
        """``config`` (from :meth:`launch_config`), measured at weight shape ``measured_at`` = (N, K),
        made fit for ``problem``'s shape at ``m`` rows: the plan borrows a modelled shape's
        configuration from the nearest measured one. Unchanged by default."""
        return config

    def supports_m(self, m: int, caps: Capabilities) -> Verdict:
        """Per-call gate on the number of rows; every M by default."""
        return Verdict.accept(f"any M (found {m})")

    def warm_up(self, caps: Capabilities, device: torch.device) -> None:
        """Once-per-process setup of this backend's vendor that its first call would otherwise pay,
        done by ``resolve(background=True)`` on its side thread, on ``device``, while the engine loads
        its weights (:func:`fp8select.verify_chain.import_in_background`). Nothing by default."""

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """Load-time layout work. The default keeps the checkpoint layout (no copy)."""
        return PreparedWeight(self.name, weight, weight_scale, block_pair(block_size), weight.shape[0], weight.shape[1], weight)

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        """The forward on a 2-D ``x`` [M, K] (M >= 1): returns [M, N] in ``out_dtype``.

        ``x`` is bf16/fp16 (quantized here, in this backend's scale layout), or fp8 with
        ``input_scale`` [M, ceil(K/128)] when the caller quantized it already.
        """
        raise NotImplementedError(f"{self.name}: {NOT_IMPLEMENTED}")

    def bind(self, prepared: PreparedWeight, *, caps: Capabilities, config: Any, out_dtype: torch.dtype) -> Launch:
        """The call of one plan route, bound once when the layer is prepared: ``launch(x, bias)``.

        ``x`` is [M >= 1, K], contiguous, unquantized, in an activation dtype this backend
        accepted for the plan, on the weight's device; ``bias`` None or a [N] bf16/fp16/fp32
        tensor there: the layer checked both, so a launch checks nothing. ``config`` is the
        route's launch configuration (:meth:`launch_config`'s form), None for none. The default
        calls :meth:`run`; a backend overrides it to do once, here, what does not depend on the
        call (entry points, scale layouts, quantizer constants, kernel handles).
        """
        run: Callable[..., torch.Tensor] = self.run  # a backend with launch configurations takes config=
        if config is not None:
            return lambda x, bias: run(prepared, x, input_scale=None, bias=bias, out_dtype=out_dtype, caps=caps,
                                       config=config)
        return lambda x, bias: run(prepared, x, input_scale=None, bias=bias, out_dtype=out_dtype, caps=caps)

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def device_gate(requires: Sequence[Probe], implemented: bool, caps: Capabilities) -> Verdict | None:
    """The first of ``requires`` that rejects ``caps``, else a rejection when the backend is not
    implemented, else None: a backend's device-level gate (dense and MoE alike)."""
    for probe in requires:
        verdict = probe(caps)
        if not verdict.ok:
            return verdict
    return None if implemented else Verdict.reject(NOT_IMPLEMENTED)


def requirements_met(requires: Sequence[Probe], caps: Capabilities) -> str:
    """The reason a device-level gate accepts: what each probe found."""
    return "meets " + "; ".join(p(caps).reason for p in requires) if requires else "no requirements"
