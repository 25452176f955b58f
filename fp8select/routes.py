"""A plan's values: per M bucket a :class:`Route` (backend, configuration, why), the weights the plan
holds (:class:`WeightUse`), and the :class:`Plan` that gathers them and describes itself. Made by
:func:`fp8select.plan.build_plan` (the decision); read by the layer and ``explain``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from fp8select.backends.base import CHECKPOINT_LAYOUT
from fp8select.buckets import bucket_index, bucket_range, span
from fp8select.problem import Problem
from fp8select.verdict import Candidate

__all__ = ["Plan", "Route", "WeightUse", "span"]


@dataclass(frozen=True)
class Route:
    """What runs the calls of one M bucket (M in ``bucket/2 + 1 .. bucket``)."""

    bucket: int
    backend: str | None  # None: no backend of the chain can run this bucket (calls raise)
    why: str
    detail: str
    config: Any = None  # a launch configuration (Triton's TritonConfig), else None
    us: float | None = None

    def to_dict(self) -> dict[str, Any]:
        config = self.config.to_dict() if hasattr(self.config, "to_dict") else self.config
        return {"bucket": self.bucket, "backend": self.backend, "why": self.why, "detail": self.detail,
                "config": config, "us": None if self.us is None else round(self.us, 3)}


@dataclass(frozen=True)
class WeightUse:
    """One weight layout the plan needs: which backends read it, and whether it is a copy."""

    layout: str
    backends: tuple[str, ...]

    @property
    def copy(self) -> bool:
        return self.layout != CHECKPOINT_LAYOUT


@dataclass(frozen=True)
class Plan:
    """A layer's decisions: one :class:`Route` per M bucket, the weights they need, and the verdicts."""

    problem: Problem
    routes: tuple[Route, ...]
    weights: tuple[WeightUse, ...]
    candidates: tuple[Candidate, ...]
    explicit: str | None = None
    max_weight_copies: int | None = 1
    notes: tuple[str, ...] = ()
    invariant: str | None = None  # batch-invariant plans: what backs the guarantee (a record, a proof)

    def route(self, m: int) -> Route:
        return self.routes[bucket_index(m)]

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends the plan runs, in order of first use (smallest M first)."""
        return tuple(dict.fromkeys(r.backend for r in self.routes if r.backend is not None))

    @property
    def weight_copies(self) -> int:
        return sum(w.copy for w in self.weights)

    def ranges(self, *, by_backend_only: bool = False) -> list[tuple[int, int | None, Route]]:
        """Consecutive buckets merged, ``(m_lo, m_hi, first route)``: those with the same backend, why
        and configuration (or, ``by_backend_only``, the same backend); ``m_hi`` None is unbounded."""
        out: list[tuple[int, int | None, Route]] = []
        for route in self.routes:
            lo, hi = bucket_range(route.bucket)
            if out and _same(out[-1][2], route, by_backend_only):
                out[-1] = (out[-1][0], hi, out[-1][2])
            else:
                out.append((lo, hi, route))
        return out

    def summary(self) -> str:
        """``M 1-4: triton, M 5-64: cuda-scaled-mm, M >= 65: deepgemm`` (one line)."""
        text = ", ".join(f"{span(lo, hi)}: {route.backend or 'none'}" for lo, hi, route in self.ranges(by_backend_only=True))
        return text + (" (batch-invariant)" if self.invariant else "")

    def describe(self) -> str:
        """Several lines: per M range the backend, why and its launch configuration (Triton's kernel
        path and tiles), then the weights held."""
        bn, bk = self.problem.block_size
        lines = [f"plan for N={self.problem.n}, K={self.problem.k}, block [{bn}, {bk}]"
                 + (f" (explicit choice: {self.explicit})" if self.explicit else "")]
        if self.invariant:
            lines.append(f"  batch-invariant: a row's output depends only on that row (any M, any position); {self.invariant}")
        for lo, hi, route in self.ranges():
            at = f"at M={route.bucket}: " if (lo, hi) != bucket_range(route.bucket) else ""
            kernel = f"[{route.config.describe()}] " if hasattr(route.config, "describe") else ""
            lines.append(f"  {span(lo, hi):<14} {route.backend or '-':<15} {route.why:<9} {kernel}{at}{route.detail}")
        for use in self.weights:
            kind = "a copy" if use.copy else "the checkpoint's"
            lines.append(f"  weight layout {use.layout!r} ({kind}) for {', '.join(use.backends)}")
        lines.extend(f"  not for this layer: {c.name}: {c.reason}" for c in self.candidates if not c.accepted)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.problem.n, "k": self.problem.k, "block_size": list(self.problem.block_size),
                "explicit": self.explicit, "max_weight_copies": self.max_weight_copies,
                "routes": [r.to_dict() for r in self.routes],
                "weights": [{"layout": w.layout, "backends": list(w.backends), "copy": w.copy} for w in self.weights],
                "notes": list(self.notes), "batch_invariant": self.invariant}

    def fingerprint(self) -> str:
        """A short hash of the decisions (backends, configs, weights): equal plans, equal fingerprints."""
        data = self.to_dict()
        for route in data["routes"]:
            route.pop("detail"), route.pop("us")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _same(a: Route, b: Route, by_backend_only: bool) -> bool:
    return a.backend == b.backend and (by_backend_only or (a.why, a.config) == (b.why, b.config))


