"""The layer object: prepared weights plus the plan for each call.

``Fp8Linear`` holds the weight laid out for the primary backend (the first in the
selection's chain that accepts this layer's problem) and for one fallback that shares the
checkpoint weight where it can. Each call goes to the primary unless the primary's
per-call gate (an M it cannot take, an activation dtype it does not accept) rejects it.
All layout work happens here at construction; the call path only quantizes activations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fp8select import ops
from fp8select.backends.base import Backend, PreparedWeight
from fp8select.errors import InvalidDtypeError, InvalidInputError, UnsupportedProblemError
from fp8select.kernels.triton_search import M_BUCKET_MAX
from fp8select.problem import Problem, dtype_name
from fp8select.selection import Candidate
from fp8select.tuning import routes_for

if TYPE_CHECKING:
    from fp8select.selection import Selection

FLOAT8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_block_size(block_size: object) -> tuple[int, int]:
    """``block_size`` as a pair of positive ints, or a typed error naming it."""
    if isinstance(block_size, torch.Tensor) or not isinstance(block_size, Sequence) or isinstance(block_size, str):
        raise InvalidDtypeError(f"block_size: expected two positive integers [block_n, block_k], found {block_size!r}")
    values = list(block_size)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidDtypeError(f"block_size: expected two positive integers [block_n, block_k], found {block_size!r}")
    if not all(v > 0 for v in values):
        raise InvalidInputError(f"block_size: expected two positive integers [block_n, block_k], found {block_size!r}")
    return values[0], values[1]


def check_weight(weight: object, weight_scale: object, block: tuple[int, int]) -> None:
    """Validate the checkpoint weight and its block scales (at load time, never per call)."""
    if not isinstance(weight, torch.Tensor):
        raise InvalidDtypeError(f"weight: expected a torch.Tensor, found {type(weight).__name__}")
    if not isinstance(weight_scale, torch.Tensor):
        raise InvalidDtypeError(f"weight_scale: expected a torch.Tensor, found {type(weight_scale).__name__}")
    if weight.dtype not in FLOAT8_DTYPES:
        allowed = "/".join(dtype_name(d) for d in FLOAT8_DTYPES)
        raise InvalidDtypeError(f"weight: expected dtype {allowed}, found {dtype_name(weight.dtype)}")
    if weight.dim() != 2:
        raise InvalidInputError(f"weight: expected a 2-D [N, K] tensor, found shape {tuple(weight.shape)}")
    if weight.device.type == "meta":
        raise InvalidInputError("weight: expected a tensor holding data, found one on the meta device (load the weights first)")
    n, k = weight.shape
    if n == 0 or k == 0:
        raise InvalidInputError(f"weight: expected N > 0 and K > 0, found shape {tuple(weight.shape)}")
    if weight_scale.dtype != torch.float32:
        raise InvalidDtypeError(f"weight_scale: expected dtype float32, found {dtype_name(weight_scale.dtype)}")
    bn, bk = block
    expected = (_ceil_div(n, bn), _ceil_div(k, bk))
    if tuple(weight_scale.shape) != expected:
        raise InvalidInputError(
            f"weight_scale: expected shape [ceil(N/{bn}), ceil(K/{bk})] = {list(expected)} for weight {list(weight.shape)} "
            f"and block_size [{bn}, {bk}], found {list(weight_scale.shape)}")
    if weight_scale.device != weight.device:
        raise InvalidInputError(f"weight_scale: expected device {weight.device} (the weight's), found {weight_scale.device}")
    if not bool(torch.isfinite(weight_scale).all()):
        bad = int((~torch.isfinite(weight_scale)).sum())
        raise InvalidInputError(f"weight_scale: expected finite values, found {bad} NaN/inf entries")


class Fp8Linear:
    """A block-FP8 linear layer bound to a backend: ``layer(x, bias=None, input_scale=None)``."""

    def __init__(self, selection: Selection, weight: torch.Tensor, weight_scale: torch.Tensor,
                 block_size: Sequence[int] = (128, 128), *, out_dtype: torch.dtype | None = None) -> None:
        block = check_block_size(block_size)
        check_weight(weight, weight_scale, block)
        if out_dtype is not None and out_dtype not in ACTIVATION_DTYPES:
            allowed = "/".join(dtype_name(d) for d in ACTIVATION_DTYPES)
            raise InvalidDtypeError(f"out_dtype: expected {allowed} or None, found {out_dtype!r}")
        self.selection = selection
        self.caps = selection.capabilities
        self.n, self.k = weight.shape
        self.block_size = block
        self.out_dtype = out_dtype
        self.weight_dtype = weight.dtype
        self.device = weight.device
        problem = self._problem(None, torch.bfloat16, out_dtype or torch.bfloat16)
        self.candidates = self._gate(problem)
        accepted = [b for b in selection.chain if self.candidates[b.name].accepted]
        if not accepted:
            raise UnsupportedProblemError(problem.describe(), [self.candidates[b.name] for b in selection.chain])
        self.primary: Backend = accepted[0]
        self.fallback: Backend | None = accepted[1] if len(accepted) > 1 else None
        self.prepared: dict[str, PreparedWeight] = {}
        self._plans: dict[tuple[int, torch.dtype, torch.dtype], Backend] = {}
        self.prepared[self.primary.name] = self.primary.prepare(weight, weight_scale, block, self.caps)
        if self.fallback is not None:
            primary = self.prepared[self.primary.name]
            if primary.weight_nk is not None:  # share the primary's weight (requantized or converted ones too)
                shared_weight = primary.weight_nk
                shared_scale = primary.scale_nk if primary.scale_nk is not None else weight_scale
            else:  # an irreversible layout (a shuffle): the fallback keeps the caller's checkpoint
                shared_weight, shared_scale = weight, weight_scale
            self.prepared[self.fallback.name] = self.fallback.prepare(shared_weight, shared_scale, block, self.caps)
        self.routes = routes_for(selection.tuning, self.n, self.k) if block == (128, 128) else None
        if self.routes is not None and self.routes.exact and "triton" in self.prepared:
            buckets = (2**i for i in range(M_BUCKET_MAX.bit_length()))  # 1, 2, 4, ..., 8192
            tuned = {b: dict(self.routes.entry(b) or {}).get("triton") for b in buckets}
            self.prepared["triton"].extra["tuned"] = {b: t for b, t in tuned.items() if t}
        ops.register(self)

    def _problem(self, m: int | None, act: torch.dtype, out: torch.dtype) -> Problem:
        return Problem(self.n, self.k, self.block_size, m, self.weight_dtype, act, out)

    def _gate(self, problem: Problem) -> dict[str, Candidate]:
        return {b.name: Candidate(rank, b.name, *_ok_reason(b.supports(problem, self.caps)))
                for rank, b in enumerate(self.selection.chain, 1)}

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends this layer may call: primary, then fallback."""
        return tuple(self.prepared)

    def plan(self, m: int, act_dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None) -> Backend:
        """The backend a call with ``m`` rows of ``act_dtype`` goes to: the tuning table's measured
        choice for this shape and M bucket when there is one (primary or fallback), else the
        primary unless its gate rejects the call."""
        out = out_dtype or self.out_dtype or act_dtype
        problem = self._problem(m, act_dtype, out)
        if self.routes is not None:
            entry = self.routes.entry(m)
            measured = next((b for b in (self.primary, self.fallback) if b is not None and entry and b.name == entry["backend"]), None)
            if measured is not None and measured.supports(problem, self.caps).ok:
                return measured
        rejected: list[Candidate] = []
        for rank, backend in enumerate(b for b in (self.primary, self.fallback) if b is not None):
            verdict = backend.supports(problem, self.caps)
            if verdict.ok:
                return backend
            rejected.append(Candidate(rank + 1, backend.name, False, verdict.reason))
        raise UnsupportedProblemError(problem.describe(), rejected)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                 input_scale: torch.Tensor | None = None) -> torch.Tensor:
        return ops.call(self, x, bias, input_scale)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                input_scale: torch.Tensor | None = None) -> torch.Tensor:
        """The eager computation (what the custom op runs under ``torch.compile``)."""
        x2, scale2, lead = self._check_input(x, input_scale)
        out_dtype = self.out_dtype or x.dtype
        self._check_bias(bias)
        m = x2.shape[0]
        if m == 0:
            return torch.empty((*lead, self.n), dtype=out_dtype, device=x.device)
        key = (m, x.dtype, out_dtype)
        backend = self._plans.get(key)
        if backend is None:
            if len(self._plans) > 4096:
                self._plans.clear()
            backend = self._plans[key] = self.plan(m, x.dtype, out_dtype)
        out = backend.run(self.prepared[backend.name], x2, input_scale=scale2, bias=bias, out_dtype=out_dtype, caps=self.caps)
        return out.reshape(*lead, self.n)

    def _check_input(self, x: object, input_scale: object) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
        if not isinstance(x, torch.Tensor):
            raise InvalidDtypeError(f"input: expected a torch.Tensor, found {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.k:
            raise InvalidInputError(f"input: expected shape [..., K={self.k}], found {list(x.shape)}")
        if x.device != self.device:
            raise InvalidInputError(f"input: expected device {self.device} (the weight's), found {x.device}")
        lead = tuple(x.shape[:-1])
        x2 = x.reshape(-1, self.k)
        if x2.shape[0] and x2.stride(-1) != 1:
            x2 = x2.contiguous()
        if x.dtype in FLOAT8_DTYPES:
            if input_scale is None:
                raise InvalidInputError("input_scale: a pre-quantized fp8 input needs its per-token group scales, found None")
            if self.out_dtype is None:
                raise InvalidDtypeError(
                    "out_dtype: a pre-quantized fp8 input needs an output dtype; pass out_dtype=torch.bfloat16 "
                    "(or float16/float32) to prepare() or linear()")
            if not isinstance(input_scale, torch.Tensor):
                raise InvalidDtypeError(f"input_scale: expected a torch.Tensor, found {type(input_scale).__name__}")
            groups = _ceil_div(self.k, self.block_size[1])
            if tuple(input_scale.shape) != (*lead, groups) or input_scale.dtype != torch.float32:
                raise InvalidInputError(
                    f"input_scale: expected float32 of shape {[*lead, groups]} (one scale per 1x{self.block_size[1]} group), "
                    f"found {dtype_name(input_scale.dtype)} {list(input_scale.shape)}")
            if input_scale.device != self.device:
                raise InvalidInputError(f"input_scale: expected device {self.device}, found {input_scale.device}")
            return x2, input_scale.reshape(-1, groups), lead
        if x.dtype not in ACTIVATION_DTYPES:
            allowed = "/".join(dtype_name(d) for d in (*ACTIVATION_DTYPES, *FLOAT8_DTYPES))
            raise InvalidDtypeError(f"input: expected dtype {allowed}, found {dtype_name(x.dtype)}")
        if input_scale is not None:
            raise InvalidInputError(f"input_scale: only meaningful with an fp8 input, found input dtype {dtype_name(x.dtype)}")
        return x2, None, lead

    def _check_bias(self, bias: object) -> None:
        if bias is None:
            return
        if not isinstance(bias, torch.Tensor):
            raise InvalidDtypeError(f"bias: expected a torch.Tensor or None, found {type(bias).__name__}")
        if tuple(bias.shape) != (self.n,):
            raise InvalidInputError(f"bias: expected shape [N={self.n}], found {list(bias.shape)}")
        if bias.device != self.device:
            raise InvalidInputError(f"bias: expected device {self.device}, found {bias.device}")
        if not bias.dtype.is_floating_point or bias.dtype.itemsize == 1:
            raise InvalidDtypeError(f"bias: expected a bf16/fp16/fp32 tensor, found {dtype_name(bias.dtype)}")

    def __repr__(self) -> str:
        fb = self.fallback.name if self.fallback else None
        return f"Fp8Linear(N={self.n}, K={self.k}, block={list(self.block_size)}, backend={self.primary.name!r}, fallback={fb!r})"


def _ok_reason(verdict: object) -> tuple[bool, str]:
    return bool(getattr(verdict, "ok", False)), str(getattr(verdict, "reason", ""))
