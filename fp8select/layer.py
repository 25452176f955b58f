"""The layer object: a plan per layer, the prepared weights it needs, and the call path.

``Fp8Linear`` builds its :class:`~fp8select.plan.Plan` at construction (one route per M
bucket over every accepted backend of the selection's chain), prepares the weight for exactly
the backends the plan uses (sharing storage between backends of the same weight layout), and
binds each bucket to one call. A call checks its input, looks its bucket up and runs: no
decision, no copy of the weight, no measurement code. Calls with another activation or output
dtype than the plan's get their own plan (built once, on first use), which may prepare a
backend more where the planned ones decline that dtype. Inference only: outputs never carry
gradients.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NoReturn

import torch

from fp8select import ops
from fp8select._log import get_logger
from fp8select.backends.base import CHECKPOINT_LAYOUT, Backend, Launch, PreparedWeight
from fp8select.buckets import BUCKET_INDEX, M_BUCKET_MAX, bucket_index
from fp8select.capabilities import Capabilities
from fp8select.errors import InvalidDtypeError, InvalidInputError, NotPicklableError, UnsupportedProblemError
from fp8select.guard import call_foreign
from fp8select.inputs import check_bias, check_block_size, check_input, check_max_weight_copies, check_weight
from fp8select.kernels.quant import ACTIVATION_DTYPES
from fp8select.measured.invariance import Invariance
from fp8select.measured.model import Measurements
from fp8select.plan import GATE, Plan, Route, build_plan, estimator
from fp8select.problem import Problem, dtype_name
from fp8select.verdict import Candidate, prepare_failures

CheckedRun = Callable[..., torch.Tensor]
"""A route's ``run`` with its prepared weight bound: what the checked path calls (any input a backend takes)."""
_STRIDED = torch.strided
_IS_COMPILING = torch.compiler.is_compiling  # (dynamo knows the function, not the name it is called by)
_TENSOR = torch.Tensor
_LAST_BUCKET = BUCKET_INDEX[-1]
_BIAS_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))


class Fp8Linear:
    """A block-FP8 linear layer with its plan: ``layer(x, bias=None, input_scale=None)``.

    Made by :meth:`fp8select.Selection.prepare`. ``chain`` is the selection's accepted backends
    in priority order (an explicit choice first, named by ``explicit``); ``measurements`` the
    device's tuning tables; ``max_weight_copies`` how many copies of the weight beyond the
    checkpoint's the plan may hold (None: no limit); ``invariance``, when given, the records its
    plans keep every row batch-invariant by (:mod:`fp8select.measured.invariance`).
    """

    def __init__(self, chain: Sequence[Backend], caps: Capabilities, weight: torch.Tensor, weight_scale: torch.Tensor,
                 block_size: Sequence[int] = (128, 128), *, out_dtype: torch.dtype | None = None,
                 measurements: Measurements | None = None, explicit: str | None = None,
                 max_weight_copies: int | None = 1, invariance: Invariance | None = None) -> None:
        start = time.perf_counter()
        block = check_block_size(block_size)
        check_weight(weight, weight_scale, block)
        if out_dtype is not None and out_dtype not in ACTIVATION_DTYPES:
            allowed = "/".join(dtype_name(d) for d in ACTIVATION_DTYPES)
            raise InvalidDtypeError(f"out_dtype: expected {allowed} or None, found {out_dtype!r}")
        check_max_weight_copies(max_weight_copies)
        # Inference only: no autograd through the weights (kept as they are when none is recorded, so shared).
        weight = weight.detach() if weight.requires_grad else weight
        weight_scale = weight_scale.detach() if weight_scale.requires_grad else weight_scale
        self.caps = caps
        self.chain = tuple(chain)
        self._by_name = {b.name: b for b in self.chain}
        self.n, self.k = weight.shape
        self.block_size = block
        self.out_dtype = out_dtype
        self.weight_dtype = weight.dtype
        self.device = weight.device
        self._estimate = estimator(measurements, self.n, self.k, block)
        self.explicit = explicit
        self.max_weight_copies = max_weight_copies
        self.invariance = invariance
        self._checkpoint_storage = weight.untyped_storage().data_ptr()
        # The [N, K] weight of each layout prepared so far, which later backends of that layout share.
        self._shared: dict[str, tuple[torch.Tensor, torch.Tensor]] = {CHECKPOINT_LAYOUT: (weight, weight_scale)}
        self.prepared: dict[str, PreparedWeight] = {}
        self._held: set[str] = set()  # the weight layouts prepared (max_weight_copies bounds them over every plan)
        self._failed: dict[str, str] = {}
        self.plans: dict[tuple[torch.dtype, torch.dtype], Plan] = {}
        self._checked_runs: dict[tuple[torch.dtype, torch.dtype], tuple[CheckedRun, ...]] = {}
        # Per unquantized activation dtype, each bucket's launch bound at prepare time (the fast path).
        self._launches: dict[torch.dtype, tuple[Launch, ...]] = {}
        self._planning = threading.Lock()
        self.main_plan = self._plan_for(torch.bfloat16, out_dtype or torch.bfloat16)
        if all(use.layout != CHECKPOINT_LAYOUT for use in self.main_plan.weights):
            del self._shared[CHECKPOINT_LAYOUT]  # no backend reads it: the caller may free the checkpoint
        ops.register(self)  # the handle a compiled graph calls it by (before any tracing)
        get_logger().info("fp8select.layer_prepared", n=self.n, k=self.k, block=list(block),
                          plan=self.main_plan.summary(), weight_copies=self.main_plan.weight_copies,
                          ms=round((time.perf_counter() - start) * 1e3, 3))

    # -- plans ---------------------------------------------------------------------------------

    def _problem(self, m: int | None, act: torch.dtype, out: torch.dtype) -> Problem:
        return Problem(self.n, self.k, self.block_size, m, self.weight_dtype, act, out)

    def _plan_for(self, act: torch.dtype, out: torch.dtype) -> Plan:
        """The plan for calls with ``act`` input and ``out`` output, its weights prepared (once per signature)."""
        key = (act, out)
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        with self._planning:  # the first call of a signature plans it; a concurrent one waits for that plan
            plan = self.plans.get(key)
            return plan if plan is not None else self._new_plan(act, out)

    def _new_plan(self, act: torch.dtype, out: torch.dtype) -> Plan:
        """:meth:`_plan_for` of a new signature: its plan, weights prepared and launches bound, published last."""
        key = (act, out)
        problem = self._problem(None, act, out)
        while True:
            chain = [b for b in self.chain if b.name not in self._failed]
            try:
                plan = build_plan(problem, chain, self.caps, self._estimate, explicit=self.explicit,
                                  max_weight_copies=self.max_weight_copies, invariance=self.invariance,
                                  held=self._held)
            except UnsupportedProblemError as exc:
                raise UnsupportedProblemError(problem.describe(), [*exc.candidates, *prepare_failures(self._failed, len(exc.candidates))]) \
                    from None
            if self._prepare(plan):
                break
        if self._failed:  # the verdicts name what could not be prepared, and why
            plan = replace(plan, candidates=(*plan.candidates, *prepare_failures(self._failed, len(plan.candidates))))
        self._checked_runs[key] = tuple(self._bind(route) for route in plan.routes)
        if act in ACTIVATION_DTYPES and out == (self.out_dtype or act):
            self._launches[act] = tuple(self._launch(route, out) for route in plan.routes)
        self.plans[key] = plan  # last: a reader that finds the plan finds its runs
        if plan.explicit is not None and any(r.why == GATE for r in plan.routes):
            others = "; ".join(f"M {r.bucket}: {r.detail}" for r in plan.routes if r.why == GATE)
            get_logger().warning("fp8select.explicit_choice_declined", backend=plan.explicit, n=self.n, k=self.k,
                                 act=dtype_name(act), out=dtype_name(out), routes=others)
        return plan

    def _prepare(self, plan: Plan) -> bool:
        """Prepare the plan's backends not prepared yet; False (and the backend marked failed) when one raises."""
        layout_of = {name: use.layout for use in plan.weights for name in use.backends}
        for backend in self.chain:
            name = backend.name
            if name not in layout_of or name in self.prepared:
                continue
            layout = layout_of[name]
            # Its own layout's weight if held; else the checkpoint; else (the checkpoint was let go because
            # the plan reads only a copy) the [N, K] form of a copy, which computes the same function.
            source = self._shared.get(layout) or self._shared.get(CHECKPOINT_LAYOUT) or next(iter(self._shared.values()), None)
            if source is None:
                raise InvalidInputError(
                    f"weight: calls of this signature need backend {name!r}, and this layer holds its weight only in a "
                    "layout no other backend can read; prepare the layer again, or call it with the dtypes its plan "
                    "was made for")
            weight, scale = source
            # A backend that cannot prepare (whatever it raises, SystemExit included) is left out, with its reason.
            outcome = call_foreign(backend.prepare, weight, scale, self.block_size, self.caps)
            if outcome.error is not None or not isinstance(outcome.value, PreparedWeight):
                self._failed[name] = outcome.error or f"returned {type(outcome.value).__name__}, expected a PreparedWeight"
                get_logger().warning("fp8select.prepare_failed", backend=name, n=self.n, k=self.k, error=self._failed[name])
                return False
            prepared = self.prepared[name] = outcome.value
            self._held.add(layout)
            if layout not in self._shared and prepared.weight_nk is not None:
                self._shared[layout] = (prepared.weight_nk, prepared.scale_nk if prepared.scale_nk is not None else scale)
        return True

    def _bind(self, route: Route) -> CheckedRun:
        """The call of one route: the backend's run with its prepared weight (and launch config) bound."""
        if route.backend is None:
            return self._unrouted(route)
        backend = self._by_name[route.backend]
        kwargs: dict[str, Any] = {"caps": self.caps}
        if route.config is not None:
            kwargs["config"] = route.config
        return functools.partial(backend.run, self.prepared[route.backend], **kwargs)

    def _unrouted(self, route: Route) -> Callable[..., NoReturn]:
        """The call of a bucket no backend can run: it raises, saying why."""
        return functools.partial(_no_backend, f"N={self.n}, K={self.k}, M bucket {route.bucket}", route.detail)

    def _launch(self, route: Route, out_dtype: torch.dtype) -> Launch:
        """The launch of one route for unquantized input, bound once (:meth:`Backend.bind`)."""
        if route.backend is None:
            return self._unrouted(route)
        return self._by_name[route.backend].bind(self.prepared[route.backend], caps=self.caps, config=route.config,
                                                 out_dtype=out_dtype)

    @property
    def candidates(self) -> dict[str, Candidate]:
        """Every chain backend's verdict on this layer (load time), by name."""
        return {c.name: c for c in self.main_plan.candidates}

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends this layer runs (those of its plans), smallest M first."""
        return tuple(dict.fromkeys(n for plan in self.plans.values() for n in plan.backends))

    def backend_for(self, m: int, act_dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None) -> Backend:
        """The backend a call with ``m`` rows of ``act_dtype`` runs on (raises when none can)."""
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise InvalidInputError(f"m: expected a number of rows >= 0, found {m!r}")
        out = out_dtype or self.out_dtype or act_dtype
        route = self._plan_for(act_dtype, out).route(m)
        if route.backend is None:
            _no_backend(self._problem(m, act_dtype, out).describe(), route.detail)
        return self._by_name[route.backend]

    def describe(self) -> str:
        """The plan, one line per M range: backend, why (measured, model, rule, gate, explicit, invariant), detail."""
        return self.main_plan.describe()

    def memory(self) -> dict[str, Any]:
        """The weight bytes this layer holds: whether it keeps the checkpoint's, and its copies."""
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for p in self.prepared.values() for t in (p.weight, p.weight_nk) if t is not None}
        copies = {ptr: size for ptr, size in held.items() if ptr != self._checkpoint_storage}
        return {"checkpoint_held": self._checkpoint_storage in held or CHECKPOINT_LAYOUT in self._shared,
                "copies": len(copies), "copy_bytes": sum(copies.values())}

    # -- the call path -------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                input_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``y = x @ dequant(W).T (+ bias)`` for ``x`` of any leading shape; no autograd.

        Under ``torch.compile`` one opaque custom op (:mod:`fp8select.ops`). Eagerly, the input a
        prepared layer expects (a plain contiguous tensor of a planned activation dtype on the
        weight's device, no gradient, a fitting bias) goes straight to its bucket's bound
        launch; anything else takes :meth:`_checked_forward`, which checks every argument.
        """
        if _IS_COMPILING():
            return ops.compiled_call(self, x, bias, input_scale)
        if (input_scale is None and type(x) is _TENSOR and not x.requires_grad and x.layout is _STRIDED
                and x.is_contiguous() and x.device == self.device and (bias is None or self._bias_fits(bias))):
            launches = self._launches.get(x.dtype)
            shape = x.shape
            k = self.k
            if launches is not None and shape and shape[-1] == k:
                flat = len(shape) == 2
                m = shape[0] if flat else x.numel() // k
                if m:
                    launch = launches[BUCKET_INDEX[m] if m <= M_BUCKET_MAX else _LAST_BUCKET]
                    return launch(x, bias) if flat else launch(x.view(m, k), bias).view(*shape[:-1], self.n)
        return self._checked_forward(x, bias, input_scale)

    __call__ = forward

    def _bias_fits(self, bias: object) -> bool:
        """Whether ``bias`` is one the fast path takes as is (else the checked path says what is wrong)."""
        return (isinstance(bias, torch.Tensor) and bias.layout is _STRIDED and not bias.requires_grad
                and bias.dtype in _BIAS_DTYPES and bias.shape == (self.n,) and bias.device == self.device)

    def _checked_forward(self, x: torch.Tensor, bias: torch.Tensor | None,
                         input_scale: torch.Tensor | None) -> torch.Tensor:
        """:meth:`forward` for any input: every argument checked (typed errors), no autograd recorded."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self._checked_forward(x, bias, input_scale)
        x2, scale2, lead = check_input(x, input_scale, k=self.k, group=self.block_size[1], device=self.device,
                                       out_dtype=self.out_dtype)
        out_dtype = self.out_dtype or x.dtype
        check_bias(bias, n=self.n, device=self.device)
        m = x2.shape[0]
        if m == 0:
            return torch.empty((*lead, self.n), dtype=out_dtype, device=x.device)
        runs = self._checked_runs.get((x.dtype, out_dtype))
        if runs is None:
            self._plan_for(x.dtype, out_dtype)
            runs = self._checked_runs[(x.dtype, out_dtype)]
        out = runs[bucket_index(m)](x2, input_scale=scale2, bias=bias, out_dtype=out_dtype)
        return out.reshape(*lead, self.n)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise NotPicklableError(
            "Fp8Linear: a prepared layer holds launches bound to this process's device and kernels, so it is not "
            "pickled or deep-copied; pickle the BlockFp8Linear module (it prepares again when loaded) or the "
            "checkpoint's weight and scale, and prepare again")

    def __deepcopy__(self, memo: dict[int, Any]) -> NoReturn:
        self.__reduce_ex__(4)

    def __copy__(self) -> Fp8Linear:
        """A second handle on the same prepared weights and launches (registered anew for the custom op)."""
        twin = object.__new__(Fp8Linear)
        twin.__dict__.update(self.__dict__)
        ops.register(twin)  # its own handle: the original's is freed with the original
        return twin

    def __repr__(self) -> str:
        return (f"Fp8Linear(N={self.n}, K={self.k}, block={list(self.block_size)}, "
                f"plan={self.main_plan.summary()!r})")


def _no_backend(what: str, detail: str, *args: Any, **kwargs: Any) -> NoReturn:
    raise UnsupportedProblemError(what, [Candidate(1, "-", False, detail)])
