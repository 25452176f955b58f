"""The MoE experts layer: a plan per layer, its prepared weights, and the call path.

``Fp8MoE`` (made by :meth:`fp8select.Selection.prepare_moe`) checks the checkpoint once, builds its
:class:`~fp8select.moe_plan.MoePlan` per activation dtype and top-k (the first for bf16 and the
``top_k`` given, default 8; others on first use), prepares the weights for exactly the backends its
plans use, and binds each M bucket to one call. ``moe(x, topk_weights, topk_ids)`` checks its inputs
(typed errors), looks its bucket up and runs. Under ``torch.compile`` it is one opaque custom op
(:mod:`fp8select.moe_ops`).

Expert ids: -1 contributes nothing (the expert lives on another rank); any other id outside
``[0, E)``, or an id repeated in one token's row, is an :class:`~fp8select.errors.InvalidInputError`.
Checking the ids reads two flags back from the device (one launch on a GPU with Triton), so it runs
on eager calls only (not while a CUDA graph is captured, nor in a compiled graph), and ``check_ids=False``
turns it off; unchecked, an id outside ``[0, E)`` contributes nothing, as -1 does, and never reads out
of bounds. That is what lets a call queue its launches before it reads the check (:class:`_IdsCheck`):
the GPU computes while the host waits, and a bad call raises after its launches, its output never
returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NoReturn

import torch

from fp8select import moe_ops
from fp8select._log import get_logger
from fp8select.backends.moe import MoeBackend, MoeLaunch, MoeProblem, MoeWeights
from fp8select.buckets import BUCKET_INDEX, M_BUCKET_MAX
from fp8select.capabilities import Capabilities
from fp8select.errors import InvalidDtypeError, InvalidInputError, NotPicklableError, UnsupportedProblemError
from fp8select.guard import call_foreign
from fp8select.inputs import check_block_size
from fp8select.kernels.quant import ACTIVATION_DTYPES
from fp8select.measured.invariance import Invariance
from fp8select.measured.moe import MoeMeasurements
from fp8select.moe_plan import MoeEstimates, MoePlan, MoeTimes, build_moe_plan
from fp8select.problem import dtype_name
from fp8select.verdict import Candidate, prepare_failures

__all__ = ["DEFAULT_TOP_K", "Fp8MoE", "check_moe_weights"]

DEFAULT_TOP_K = 8
_WEIGHT_DTYPE = torch.float8_e4m3fn
_ID_DTYPES = (torch.int32, torch.int64)
_WEIGHT_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_TENSOR, _STRIDED = torch.Tensor, torch.strided
_LAST_BUCKET = BUCKET_INDEX[-1]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidDtypeError(f"{name}: expected a torch.Tensor, found {type(value).__name__}")
    if value.layout != torch.strided:
        raise InvalidInputError(f"{name}: expected a dense (strided) tensor, found layout {value.layout}")
    return value


def check_moe_weights(w13: object, w13_scale: object, w2: object, w2_scale: object,
                      block: tuple[int, int]) -> tuple[int, int, int]:
    """Validate a MoE checkpoint (at load time); returns ``(E, H, I)``."""
    tensors = {name: _tensor(name, v) for name, v in
               (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale))}
    for name in ("w13", "w2"):
        t = tensors[name]
        if t.dtype != _WEIGHT_DTYPE:
            raise InvalidDtypeError(f"{name}: expected dtype float8_e4m3fn, found {dtype_name(t.dtype)}")
        if t.dim() != 3:
            raise InvalidInputError(f"{name}: expected a 3-D [E, N, K] tensor, found shape {tuple(t.shape)}")
        if t.device.type == "meta":
            raise InvalidInputError(f"{name}: expected a tensor holding data, found one on the meta device")
    experts, two_i, hidden = tensors["w13"].shape
    if experts == 0 or hidden == 0 or two_i == 0 or two_i % 2:
        raise InvalidInputError(f"w13: expected [E > 0, 2I > 0 (even), H > 0], found shape {tuple(tensors['w13'].shape)}")
    inter = two_i // 2
    if tuple(tensors["w2"].shape) != (experts, hidden, inter):
        raise InvalidInputError(f"w2: expected shape [E, H, I] = {[experts, hidden, inter]} (from w13 "
                                f"{list(tensors['w13'].shape)}), found {list(tensors['w2'].shape)}")
    bn, bk = block
    for name, (n, k) in (("w13_scale", (two_i, hidden)), ("w2_scale", (hidden, inter))):
        s = tensors[name]
        if s.dtype != torch.float32:
            raise InvalidDtypeError(f"{name}: expected dtype float32, found {dtype_name(s.dtype)}")
        expected = (experts, _ceil_div(n, bn), _ceil_div(k, bk))
        if tuple(s.shape) != expected:
            raise InvalidInputError(f"{name}: expected shape [E, ceil({n}/{bn}), ceil({k}/{bk})] = {list(expected)}, "
                                    f"found {list(s.shape)}")
    device = tensors["w13"].device
    for name, t in tensors.items():
        if t.device != device:
            raise InvalidInputError(f"{name}: expected device {device} (w13's), found {t.device}")
    for name in ("w13_scale", "w2_scale"):
        if not bool(torch.isfinite(tensors[name]).all()):
            bad = int((~torch.isfinite(tensors[name])).sum())
            raise InvalidInputError(f"{name}: expected finite values, found {bad} NaN/inf entries")
    return experts, hidden, inter


class Fp8MoE:
    """A block-FP8 MoE experts layer with its plan: ``moe(x, topk_weights, topk_ids) -> y``."""

    def __init__(self, backends: Sequence[MoeBackend], caps: Capabilities, w13: torch.Tensor, w13_scale: torch.Tensor,
                 w2: torch.Tensor, w2_scale: torch.Tensor, block_size: Sequence[int] = (128, 128), *,
                 top_k: int | None = None, measured: MoeTimes | None = None, table: MoeMeasurements | None = None,
                 explicit: str | None = None, check_ids: bool = True, invariance: Invariance | None = None) -> None:
        start = time.perf_counter()
        block = check_block_size(block_size)
        self.experts, self.hidden, self.intermediate = check_moe_weights(w13, w13_scale, w2, w2_scale, block)
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise InvalidInputError(f"top_k: expected a positive int or None, found {top_k!r}")
        self.caps, self.block_size, self.explicit, self.check_ids = caps, block, explicit, bool(check_ids)
        self.backends_chain = tuple(backends)
        self._by_name = {b.name: b for b in self.backends_chain}
        self.device = w13.device
        self._ids_flags = _ids_flags_for(self.device, caps)
        self._weights = MoeWeights(w13.detach(), w13_scale.detach(), w2.detach(), w2_scale.detach(), block)
        self._measured, self._table, self._invariance = measured, table, invariance
        self.prepared: dict[str, Any] = {}
        self._failed: dict[str, str] = {}
        self.plans: dict[tuple[torch.dtype, int], MoePlan] = {}
        self._launches: dict[tuple[torch.dtype, int], tuple[MoeLaunch, ...]] = {}
        self._planning = threading.Lock()
        self.main_plan = self._plan_for(torch.bfloat16, top_k or DEFAULT_TOP_K)
        moe_ops.register(self)
        get_logger().info("fp8select.moe_prepared", experts=self.experts, hidden=self.hidden,
                          intermediate=self.intermediate, plan=self.main_plan.summary(),
                          ms=round((time.perf_counter() - start) * 1e3, 3))

    def _problem(self, act: torch.dtype, top_k: int) -> MoeProblem:
        return MoeProblem(self.experts, self.hidden, self.intermediate, top_k, self.block_size, None, _WEIGHT_DTYPE, act)

    def _plan_for(self, act: torch.dtype, top_k: int) -> MoePlan:
        """The plan (and bound launches) for calls with ``act`` activations and ``top_k`` experts per token."""
        key = (act, top_k)
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        with self._planning:  # the first call of a signature plans it; a concurrent one waits for that plan
            plan = self.plans.get(key)
            return plan if plan is not None else self._new_plan(act, top_k)

    def _new_plan(self, act: torch.dtype, top_k: int) -> MoePlan:
        """:meth:`_plan_for` of a new signature: its plan, weights prepared and launches bound, published last."""
        key = (act, top_k)
        problem = self._problem(act, top_k)
        while True:
            chain = [b for b in self.backends_chain if b.name not in self._failed]
            try:
                plan = build_moe_plan(problem, chain, self.caps, measured=self._measured_rows(top_k),
                                      estimated=self._estimates(top_k), explicit=self.explicit,
                                      invariance=self._invariance)
            except UnsupportedProblemError as exc:
                raise UnsupportedProblemError(problem.describe(), [*exc.candidates, *prepare_failures(self._failed, len(exc.candidates))]) \
                    from None
            if self._prepare(plan):
                break
        if self._failed:  # the verdicts name what could not be prepared, and why (an explicit choice, say)
            plan = replace(plan, candidates=(*plan.candidates, *prepare_failures(self._failed, len(plan.candidates))))
        self._launches[key] = tuple(self._bind(route) for route in plan.routes)
        self.plans[key] = plan  # last: a reader that finds the plan finds its launches
        return plan

    def _measured_rows(self, top_k: int) -> MoeTimes | None:
        """The rows given to ``prepare_moe``, else the tables' for this shape and ``top_k``."""
        if self._measured is not None or self._table is None:
            return self._measured
        return self._table.times(self.experts, self.hidden, self.intermediate, top_k)

    def _estimates(self, top_k: int) -> MoeEstimates | None:
        """The tables' estimates for this shape and ``top_k`` (none where rows were given to ``prepare_moe``)."""
        if self._measured is not None or self._table is None:
            return None
        return self._table.estimates(self.experts, self.hidden, self.intermediate, top_k)

    def _prepare(self, plan: MoePlan) -> bool:
        for name in plan.backends:
            if name in self.prepared:
                continue
            outcome = call_foreign(self._by_name[name].prepare, self._weights, self.caps)
            if outcome.error is not None:
                self._failed[name] = outcome.error
                get_logger().warning("fp8select.moe_prepare_failed", backend=name, error=outcome.error)
                return False
            self.prepared[name] = outcome.value
        return True

    def _bind(self, route: Any) -> MoeLaunch:
        if route.backend is None:
            detail = route.detail

            def unrouted(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> NoReturn:
                raise UnsupportedProblemError(f"MoE M bucket {route.bucket}", [Candidate(1, "-", False, detail)])

            return unrouted
        return self._by_name[route.backend].bind(self.prepared[route.backend], route.layout, route.config, self.caps)

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends this layer's plans run, smallest M first."""
        return tuple(dict.fromkeys(n for plan in self.plans.values() for n in plan.backends))

    def describe(self) -> str:
        return self.main_plan.describe()

    # -- the call path -------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """``y[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])`` (docs/moe.md); no autograd.

        Under ``torch.compile`` one opaque custom op (:mod:`fp8select.moe_ops`). Eagerly, the inputs a
        prepared layer expects (plain contiguous tensors of planned dtypes and matching shapes on the
        weights' device, no gradient) go straight to their bucket's bound launch, the ids' check queued
        before it and read after it; anything else takes :meth:`_checked_forward`, which checks every argument.
        """
        if torch.compiler.is_compiling():
            return moe_ops.compiled_call(self, x, topk_weights, topk_ids)
        if (type(x) is _TENSOR and type(topk_ids) is _TENSOR and type(topk_weights) is _TENSOR
                and not x.requires_grad and not topk_weights.requires_grad
                and x.layout is _STRIDED and topk_ids.layout is _STRIDED and topk_weights.layout is _STRIDED
                and x.is_contiguous() and topk_ids.is_contiguous() and topk_weights.is_contiguous()
                and x.device == self.device and topk_ids.device == self.device and topk_weights.device == self.device
                and topk_ids.dtype in _ID_DTYPES and topk_weights.dtype in _WEIGHT_FLOATS):
            shape, ids_shape = x.shape, topk_ids.shape
            if (len(shape) == 2 and len(ids_shape) == 2 and shape[1] == self.hidden and ids_shape[0] == shape[0]
                    and topk_weights.shape == ids_shape):
                launches = self._launches.get((x.dtype, ids_shape[1]))
                m = shape[0]
                if launches is not None and m:
                    launch = launches[BUCKET_INDEX[m] if m <= M_BUCKET_MAX else _LAST_BUCKET]
                    if self.check_ids and not _capturing(topk_ids):
                        pending = _IdsCheck(topk_ids, self.experts, self._ids_flags)
                        y = launch(x, topk_weights, topk_ids)
                        pending.raise_if_bad()
                        return y
                    return launch(x, topk_weights, topk_ids)
        return self._checked_forward(x, topk_weights, topk_ids)

    __call__ = forward

    def _checked_forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` for any input: every argument checked (typed errors), no autograd recorded."""
        m, top_k = self._check(x, topk_weights, topk_ids)
        if m == 0:
            return torch.empty((0, self.hidden), dtype=x.dtype, device=x.device)
        pending = _IdsCheck(topk_ids, self.experts, self._ids_flags) if self.check_ids and not _capturing(topk_ids) else None
        launches = self._launches.get((x.dtype, top_k))
        if launches is None:  # the first call at this dtype and top-k: bad ids raise before it plans
            if pending is not None:
                pending.raise_if_bad()
                pending = None
            self._plan_for(x.dtype, top_k)
            launches = self._launches[(x.dtype, top_k)]
        with torch.no_grad():
            y = launches[BUCKET_INDEX[m] if m <= M_BUCKET_MAX else _LAST_BUCKET](
                x.contiguous(), topk_weights.contiguous(), topk_ids.contiguous())
        if pending is not None:
            pending.raise_if_bad()
        return y

    def _check(self, x: object, topk_weights: object, topk_ids: object) -> tuple[int, int]:
        x = _tensor("x", x)
        ids = _tensor("topk_ids", topk_ids)
        weights = _tensor("topk_weights", topk_weights)
        if x.dtype not in ACTIVATION_DTYPES:
            allowed = "/".join(dtype_name(d) for d in ACTIVATION_DTYPES)
            raise InvalidDtypeError(f"x: expected dtype {allowed}, found {dtype_name(x.dtype)}")
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise InvalidInputError(f"x: expected shape [M, H={self.hidden}], found {list(x.shape)}")
        m = x.shape[0]
        if ids.dtype not in _ID_DTYPES:
            raise InvalidDtypeError(f"topk_ids: expected dtype int32/int64, found {dtype_name(ids.dtype)}")
        if ids.dim() != 2 or ids.shape[0] != m or ids.shape[1] < 1:
            raise InvalidInputError(f"topk_ids: expected shape [M={m}, k >= 1], found {list(ids.shape)}")
        if weights.dtype not in _WEIGHT_FLOATS:
            raise InvalidDtypeError(f"topk_weights: expected dtype float32/bfloat16/float16, found {dtype_name(weights.dtype)}")
        if tuple(weights.shape) != tuple(ids.shape):
            raise InvalidInputError(f"topk_weights: expected shape {list(ids.shape)} (topk_ids'), found {list(weights.shape)}")
        for name, t in (("x", x), ("topk_weights", weights), ("topk_ids", ids)):
            if t.device != self.device:
                raise InvalidInputError(f"{name}: expected device {self.device} (the weights'), found {t.device}")
        return m, ids.shape[1]

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise NotPicklableError("Fp8MoE: a prepared MoE layer holds launches bound to this process's device; pickle "
                                "the BlockFp8MoE module or the checkpoint's tensors, and prepare again")

    def __repr__(self) -> str:
        return (f"Fp8MoE(E={self.experts}, H={self.hidden}, I={self.intermediate}, "
                f"plan={self.main_plan.summary()!r})")


_IdsFlags = Callable[[torch.Tensor, int], torch.Tensor]
"""``ids_flags(ids, experts) -> [P, 2]`` int32: per block of rows, an id outside ``[0, E)`` and not -1, a repeat."""


def _ids_flags_for(device: torch.device, caps: Capabilities) -> _IdsFlags:
    """What computes the ids' check flags on ``device``: the one-launch Triton kernel on a GPU with Triton (the
    torch ops took eight or so launches, more host time than the rest of a decode call), else torch ops."""
    if device.type == "cuda" and "triton" in caps.packages:
        from fp8select.kernels.moe_triton import ids_flags

        return ids_flags
    from fp8select.kernels.moe_reference import ids_flags_torch

    return ids_flags_torch


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


class _IdsCheck:
    """The ids' check of one eager call, its reductions queued before the call's launches and read after them.

    Queued: whether an id is outside ``[0, E)`` and not -1 and whether a token's row repeats an id (ignoring
    -1), one Triton launch on a GPU (``_ids_flags_for``), copied to host memory as they come. The call's
    launches are queued next (an id outside ``[0, E)`` contributes nothing and is never read out of bounds),
    then :meth:`raise_if_bad` waits for the copy. So the GPU runs the call's kernels while the host waits,
    where a check read before the launches left it idle while the host launched them. The message is
    worked out only when something is wrong."""

    __slots__ = ("_done", "_experts", "_flags", "_ids")

    def __init__(self, ids: torch.Tensor, experts: int, ids_flags: _IdsFlags) -> None:
        self._ids, self._experts = ids, experts
        flags = ids_flags(ids, experts)
        self._done: torch.cuda.Event | None = None
        if flags.is_cuda:
            flags = flags.to("cpu", non_blocking=True)  # into pinned memory, in stream order
            self._done = torch.cuda.Event()
            self._done.record()
        self._flags = flags

    def raise_if_bad(self) -> None:
        """Wait for the flags; an :class:`InvalidInputError` if an id is outside ``[0, E)`` and not -1, or repeated
        in a token's row."""
        if self._done is not None:
            self._done.synchronize()
        flags = self._flags.tolist()
        bad, twice = any(f[0] for f in flags), any(f[1] for f in flags)
        ids, experts = self._ids, self._experts
        if bad:
            found = ids[(ids < -1) | (ids >= experts)][:4].tolist()
            raise InvalidInputError(f"topk_ids: expected expert ids in [0, {experts}) or -1 (an expert on another "
                                    f"rank), found {found}")
        if twice:
            raise InvalidInputError("topk_ids: expected distinct expert ids within each token's row, found a repeated id")
