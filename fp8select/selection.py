"""What ``resolve()`` returns: the decision, with the measurements and means to prepare its layers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import EllipsisType
from typing import Any

import torch

from fp8select import ops
from fp8select.decision import Decision
from fp8select.dropin import PreparedLayers
from fp8select.jit_processes import processes_wanted
from fp8select.layer import Fp8Linear
from fp8select.measured.invariance import Invariance
from fp8select.measured.model import Measurements
from fp8select.measured.sources import measurements_for
from fp8select.moe import DEFAULT_TOP_K, Fp8MoE, check_moe_weights
from fp8select.moe_plan import MoePlan, MoeTimes
from fp8select.plan import Plan, build_plan, estimator
from fp8select.problem import Problem


class SelectionMemo:
    """What a selection's methods keep so as not to repeat work: the layers ``linear()`` prepared
    (per weight tensor, :class:`~fp8select.dropin.PreparedLayers`) and the tables ``prepare(...,
    tune=True)`` and ``prepare_moe(..., tune=True)`` measured (per shape, empty where there was nothing
    to measure; they are also written to the cache directory). It never
    changes what a method returns, only how soon; every copy of a selection (``replace``,
    ``copy``, ``deepcopy``, a pickle) starts with an empty one."""

    def __init__(self) -> None:
        self.handle = 0  # the selection's, for drop-in calls under compilation (fp8select.ops.register_selection)
        self.layers = PreparedLayers()
        self.measured: dict[tuple[int, int], Mapping[str, Any]] = {}
        self.measured_moe: dict[tuple[int, int, int, int], Mapping[str, Any]] = {}  # (E, H, I, k)

    def __copy__(self) -> SelectionMemo:
        return SelectionMemo()

    def __deepcopy__(self, memo: dict[int, Any]) -> SelectionMemo:
        return SelectionMemo()

    def __reduce__(self) -> tuple[type[SelectionMemo], tuple[()]]:
        return SelectionMemo, ()


def _can_measure_now() -> bool:
    """Not while a CUDA graph is being captured or ``torch.compile`` traces (a layer prepared at its first call,
    as ``Selection.linear`` does, inside an engine's capture): measuring there would break it."""
    return not torch.compiler.is_compiling() and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _measured_once(found: dict[Any, Mapping[str, Any]], key: Any,
                   measure: Callable[[], Mapping[str, Any] | None]) -> list[Mapping[str, Any]] | None:
    """Every table measured at load time so far, ``key``'s by ``measure()`` first if it is new; None when
    ``key`` needed nothing (remembered as an empty table, so that it is not asked again)."""
    if key not in found:
        found[key] = measure() or {}
    return _kept(found) if found[key] else None


def _kept(found: Mapping[Any, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The tables of ``found`` that hold rows (a shape that needed nothing is remembered as an empty one)."""
    return [table for table in found.values() if table]


@dataclass(frozen=True)
class Selection(Decision):
    """What :func:`fp8select.resolve` decided (a :class:`~fp8select.decision.Decision`: ``backend``,
    ``verdicts``, ``source``, ``capabilities``, ``chain``, ``disabled``, ``notes``) with what its
    layers are planned from: a plain value, settled when it is returned.

    Each layer's plan picks among the ``chain`` per M bucket (by ``measurements``, the device's
    tuning tables, read from ``tuning_sources``), and an explicit choice runs wherever its gate
    accepts the call. ``max_weight_copies`` bounds the copies of a weight a layer may hold beyond
    the checkpoint's (None: no bound). ``group`` is the process group it was agreed in, if any.
    ``batch_invariant``: every layer's plan keeps each output row independent of its batch, by
    the records of ``invariance`` (:mod:`fp8select.measured.invariance`; see :mod:`fp8select.plan`).
    ``tune_at_load``: ``prepare()`` measures a CUDA layer's shape where the tables leave its plan open
    (:func:`fp8select.measured.sources.wants_load_time_tuning` says when).
    """

    measurements: Measurements | None = field(default=None, repr=False, compare=False)
    tuning_sources: tuple[str, ...] = ()
    max_weight_copies: int | None = 1
    tables: tuple[Mapping[str, Any], ...] = field(default=(), repr=False, compare=False)
    batch_invariant: bool = False
    invariance: Invariance | None = field(default=None, repr=False, compare=False)
    group: Any = field(default=None, repr=False, compare=False)
    tune_at_load: bool = False
    # How to measure a layer shape at load time (set by resolve(): fp8select.measure.loadtime.measure_shape and
    # measure_moe_shape; measurement code sits above this module).
    load_time_measure: Callable[..., Mapping[str, Any] | None] | None = field(default=None, repr=False, compare=False)
    load_time_measure_moe: Callable[..., Mapping[str, Any] | None] | None = field(default=None, repr=False,
                                                                                  compare=False)
    _memo: SelectionMemo = field(default_factory=SelectionMemo, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._memo.handle = ops.register_selection(self)  # before any tracing: a compiled graph's linear() calls need it

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled or deep-copied: the state (with an empty memo), and a handle of its own."""
        self.__dict__.update(state)
        self.__post_init__()

    def __copy__(self) -> Selection:
        return replace(self)  # the same decision, with an empty memo of its own

    @classmethod
    def of(cls, decision: Decision, **more: Any) -> Selection:
        """``decision`` as a selection (``more``: its other fields)."""
        return cls(**{f.name: getattr(decision, f.name) for f in fields(Decision)}, **more)

    def explain(self) -> str:
        caps = self.capabilities
        where = caps.device_kind + (f" ({caps.device_name})" if caps.device_name else "")
        if caps.compute_capability:
            where += f", sm{caps.compute_capability[0]}{caps.compute_capability[1]}"
        if caps.gfx_arch:
            where += f", {caps.gfx_arch}"
        lines = [f"fp8select chose {self.backend.name!r} ({self.source}) on {where}, torch {caps.torch_version}", ""]
        width = max([len("backend")] + [len(c.name) for c in self.verdicts])
        lines.append(f"{'rank':>4}  {'backend':<{width}}  {'verdict':<8}  reason")
        for c in self.verdicts:
            verdict = "CHOSEN" if c.name == self.backend.name else ("ok" if c.accepted else "rejected")
            lines.append(f"{c.rank:>4}  {c.name:<{width}}  {verdict:<8}  {c.reason}")
        lines.append("")
        lines.append("chain: " + " -> ".join(b.name for b in self.chain))
        if self.batch_invariant:
            lines.append("plans: per layer one backend and configuration for every M (batch-invariant), the fastest that "
                         "these allow" + (f" (explicit choice: {self.explicit})" if self.explicit else "") + ":")
            lines.extend(self.invariance.describe(self.chain) if self.invariance is not None else [])
        elif self.explicit:
            lines.append(f"plans: {self.explicit!r} for every call its gate accepts, the fastest other backend elsewhere")
        else:
            lines.append("plans: per layer and M bucket, the fastest backend of the chain (explain --layer N,K shows one)")
        if self.measurements is not None:
            lines.append("measurements: " + ", ".join(self.tuning_sources))
            lines.extend("  " + line for line in self.measurements.describe().splitlines())
        else:
            held = f" (its tables hold MoE rows only: {', '.join(self.tuning_sources)})" if self.tuning_sources else ""
            lines.append(f"measurements: none for this device{held}, so plans follow the priority order")
        if caps.device_kind == "cuda":
            processes = processes_wanted(caps)
            lines.append("load-time measurement: " + (
                "on: prepare() measures the M buckets the tables leave open for a shape, each once, into the cache directory "
                "(FP8SELECT_TUNE=off turns it off)" + (f"; the vendors' kernels compiled first in up to {processes} worker "
                                                       "processes (FP8SELECT_JIT_PROCESSES)" if processes else "")
                if self.tune_at_load else
                "off (FP8SELECT_TUNE=load turns it on; unset, it is on where the cache directory can be written)"))
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend.name,
            "source": self.source,
            "chain": [b.name for b in self.chain],
            "disabled": list(self.disabled),
            "verdicts": [c.to_dict() for c in self.verdicts],
            "capabilities": self.capabilities.to_dict(),
            "fingerprint": self.capabilities.fingerprint(),
            "tuning_sources": list(self.tuning_sources),
            "measured_backends": list(self.measurements.backends) if self.measurements is not None else [],
            "max_weight_copies": self.max_weight_copies,
            "batch_invariant": self.batch_invariant,
            "tune_at_load": self.tune_at_load,
        }

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor,
                block_size: Sequence[int] = (128, 128), *, out_dtype: torch.dtype | None = None,
                max_weight_copies: int | EllipsisType | None = ..., tune: bool | None = None) -> Fp8Linear:
        """Plan the layer and lay its weight out for the backends the plan uses, once; returns a callable layer.

        ``max_weight_copies`` overrides the selection's bound for this layer (None: no bound; the
        default ``...`` keeps the selection's). ``tune`` (default: ``tune_at_load``) measures a
        CUDA layer's shape first where the tables do not settle its plan
        (:mod:`fp8select.measure.loadtime`; with a process group, on rank 0 for every rank).
        """
        from fp8select.inputs import check_block_size

        copies = self.max_weight_copies if max_weight_copies is ... else max_weight_copies
        measurements = self.measurements
        if (isinstance(weight, torch.Tensor) and weight.is_cuda and weight.dim() == 2
                and check_block_size(block_size) == (128, 128) and self._measures_now(tune)):
            measurements = self._measure_at_load(int(weight.shape[0]), int(weight.shape[1]), weight.device)
        return Fp8Linear(self.chain, self.capabilities, weight, weight_scale, block_size, out_dtype=out_dtype,
                         measurements=measurements, explicit=self.explicit,
                         max_weight_copies=copies, invariance=self._invariance())

    def _measures_now(self, tune: bool | None) -> bool:
        """Whether ``prepare()`` / ``prepare_moe()`` measure a CUDA layer's shape: ``tune``, else ``tune_at_load``;
        never while a CUDA graph is captured or ``torch.compile`` traces."""
        return (self.tune_at_load if tune is None else tune) and _can_measure_now()

    def _measure_at_load(self, n: int, k: int, device: torch.device) -> Measurements | None:
        """The selection's measurements with those measured for (N, K) now (once per shape per selection)."""
        measure = self.load_time_measure
        if measure is None:
            return self.measurements
        measured = _measured_once(self._memo.measured, (n, k),
                                  lambda: measure(self, n, k, device=device, group=self.group))
        if measured is None:
            return self.measurements
        return measurements_for(self.capabilities, self.chain, [*self.tables, *measured])

    def measured_at_load(self) -> tuple[Mapping[str, Any], ...]:
        """Every dense table this selection's ``prepare()`` measured at load time so far (each also written to the
        cache directory): what a selection planning from the same rows adds to its ``tables``."""
        return tuple(_kept(self._memo.measured))

    def plan_for(self, n: int, k: int, block_size: Sequence[int] = (128, 128), *,
                 out_dtype: torch.dtype | None = None) -> Plan:
        """The plan a layer of this shape would get (no weights needed: what ``explain --layer`` prints)."""
        from fp8select.errors import InvalidInputError
        from fp8select.inputs import check_block_size

        for name, value in (("n", n), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidInputError(f"{name}: expected a positive integer, found {value!r}")
        block = check_block_size(block_size)
        problem = Problem(n, k, block, None, torch.float8_e4m3fn, torch.bfloat16, out_dtype or torch.bfloat16)
        estimate = estimator(self.measurements, n, k, block)
        return build_plan(problem, self.chain, self.capabilities, estimate, explicit=self.explicit,
                          max_weight_copies=self.max_weight_copies, invariance=self._invariance())

    def _invariance(self) -> Invariance | None:
        """The records plans keep rows batch-invariant by; None for ordinary plans."""
        if not self.batch_invariant:
            return None
        return self.invariance if self.invariance is not None else Invariance(self.capabilities, self.chain, ())

    def prepare_moe(self, w13: torch.Tensor, w13_scale_inv: torch.Tensor, w2: torch.Tensor, w2_scale_inv: torch.Tensor,
                    block_size: Sequence[int] = (128, 128), *, top_k: int | None = None,
                    measured: MoeTimes | None = None, check_ids: bool = True, tune: bool | None = None) -> Fp8MoE:
        """Plan a MoE experts layer and lay its weights out, once; returns ``moe(x, topk_weights, topk_ids)``.

        ``w13`` float8_e4m3fn ``[E, 2I, H]`` (gate rows, then up rows), ``w2`` ``[E, H, I]``, with fp32 block
        scales; ``top_k`` the experts per token the first plan is made for (default 8; others on first use);
        ``measured`` rows of this shape (:data:`fp8select.moe_plan.MoeTimes`; default: the tuning tables'
        rows for it, per top-k). ``tune`` (default: ``tune_at_load``) measures a CUDA layer's shape
        at that top-k first where the tables do not settle its plan (:mod:`fp8select.measure.loadtime`; with a
        process group, on rank 0 for every rank). A batch-invariant selection plans one route for every M, or
        raises :class:`~fp8select.errors.BatchInvariantError`. See docs/moe.md.
        """
        from fp8select.inputs import check_block_size
        from fp8select.moe_select import checked_times, moe_chain, moe_explicit, moe_measurements

        measured = checked_times(measured)
        chain = moe_chain(self)
        table = moe_measurements(self, chain, self.tables) if measured is None else None
        if measured is None and isinstance(w13, torch.Tensor) and w13.is_cuda and self._measures_now(tune):
            block = check_block_size(block_size)
            experts, hidden, inter = check_moe_weights(w13, w13_scale_inv, w2, w2_scale_inv, block)
            if block == (128, 128):
                table = self._measure_moe_at_load(chain, table, (w13, w13_scale_inv, w2, w2_scale_inv),
                                                  (experts, hidden, inter, top_k or DEFAULT_TOP_K))
        return Fp8MoE(chain, self.capabilities, w13, w13_scale_inv, w2, w2_scale_inv, block_size, top_k=top_k,
                      measured=measured, table=table, explicit=moe_explicit(self, chain), check_ids=check_ids,
                      invariance=self._invariance())

    def _measure_moe_at_load(self, chain: Sequence[Any], table: Any, weights: tuple[torch.Tensor, ...],
                             shape: tuple[int, int, int, int]) -> Any:
        """The MoE rows ``table`` with those measured for ``shape`` now (once per shape per selection)."""
        from fp8select.moe_select import moe_measurements

        measure = self.load_time_measure_moe
        if measure is None:
            return table
        measured = _measured_once(self._memo.measured_moe, shape, lambda: measure(
            self, chain, table, weights, shape, device=weights[0].device, group=self.group))
        if measured is None:
            return table
        return moe_measurements(self, chain, [*self.tables, *measured])

    def moe_plan_for(self, experts: int, hidden: int, intermediate: int, top_k: int,
                     block_size: Sequence[int] = (128, 128), *, measured: MoeTimes | None = None) -> MoePlan:
        """The plan a MoE layer of this shape would get (no weights needed: what ``explain --moe`` prints)."""
        from fp8select.moe_select import moe_chain, moe_measurements, moe_plan_for

        chain = moe_chain(self)
        return moe_plan_for(self, chain, experts, hidden, intermediate, top_k, block_size, measured,
                            moe_measurements(self, chain, self.tables), self._invariance())

    def forget_prepared(self) -> None:
        """Forget the layers :meth:`linear` prepared, so that its next call with each weight prepares it again:
        after writing weights in a way it cannot see (through ``.data``, or into inference tensors; see
        :mod:`fp8select.dropin`), as a weight update does."""
        self._memo.layers.clear()

    def linear(self, input: torch.Tensor, weight: torch.Tensor, block_size: Sequence[int], weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Drop-in for the engines' ``w8a8_block_fp8_linear(input, weight, block_size, weight_scale, ...)``.

        The first call with a weight prepares it (:meth:`prepare`); later calls with the same,
        unmodified weight and scale tensors reuse that layer (:class:`~fp8select.dropin.PreparedLayers`
        says when a layer is prepared again, and that it is freed with the weight; after writes through
        ``.data``, call :meth:`forget_prepared`). The output
        dtype is the activation's; a pre-quantized fp8 ``input`` needs ``out_dtype``.
        """
        if torch.compiler.is_compiling():  # one opaque node, whose real implementation is the eager call below
            return ops.dropin_call(self._memo.handle, input, weight, block_size, weight_scale, input_scale, bias,
                                   out_dtype)
        dropin = self._memo.layers
        layer = dropin.get(weight, weight_scale, block_size, out_dtype)
        if layer is None:
            layer = dropin.keep(weight, weight_scale, block_size, out_dtype, self.prepare)
        return layer(input, bias, input_scale)
