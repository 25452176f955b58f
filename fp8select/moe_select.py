"""Which MoE experts backends a selection runs: the built-in ones its machine accepts, in priority order.

The dense decision (:mod:`fp8select.decision`) is made over the dense backends; a MoE layer asks the
same snapshot about the MoE backends (:data:`~fp8select.backends.moe_builtin.MOE_BACKENDS`), leaving
out the names the selection disabled. An explicit dense choice (``resolve(backend=...)``) that names
a MoE backend too is the MoE layer's explicit choice as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from fp8select.backends.moe import MoeBackend, MoeProblem
from fp8select.backends.moe_builtin import MOE_BACKENDS
from fp8select.decision import Decision
from fp8select.errors import InvalidInputError, NoBackendError
from fp8select.guard import safe_verdict
from fp8select.inputs import check_block_size
from fp8select.measured.invariance import Invariance
from fp8select.measured.moe import MoeMeasurements, check_moe_times
from fp8select.measured.table import backend_versions
from fp8select.moe_plan import MoePlan, MoeTimes, build_moe_plan
from fp8select.verdict import Candidate

__all__ = ["checked_times", "moe_chain", "moe_explicit", "moe_measurements", "moe_plan_for", "moe_verdicts"]


def moe_verdicts(decision: Decision) -> tuple[tuple[MoeBackend, Candidate], ...]:
    """Every built-in MoE backend with its device-level verdict on the decision's snapshot."""
    out = []
    for rank, cls in enumerate(MOE_BACKENDS, 1):
        backend = cls()
        if backend.name in decision.disabled:
            out.append((backend, Candidate(rank, backend.name, False, "disabled")))
            continue
        verdict = safe_verdict(backend.check, decision.capabilities, what="device-level check")
        out.append((backend, Candidate(rank, backend.name, verdict.ok, verdict.reason)))
    return tuple(out)


def moe_chain(decision: Decision) -> tuple[MoeBackend, ...]:
    """The accepted MoE backends, priority order; :class:`NoBackendError` when none is."""
    verdicts = moe_verdicts(decision)
    chain = tuple(b for b, c in verdicts if c.accepted)
    if not chain:
        raise NoBackendError("MoE experts layers", [c for _, c in verdicts])
    return chain


def moe_explicit(decision: Decision, chain: Sequence[MoeBackend]) -> str | None:
    explicit = decision.explicit
    return explicit if explicit is not None and any(b.name == explicit for b in chain) else None


def moe_measurements(decision: Decision, chain: Sequence[MoeBackend],
                     tables: Iterable[Mapping[str, Any]]) -> MoeMeasurements | None:
    """The MoE rows of the device's tuning tables (the selection's ``tables``) for ``chain``'s backends at
    their versions here; None when the tables hold none."""
    caps = decision.capabilities
    found = MoeMeasurements(tables, {b.name: backend_versions(caps, b.packages) for b in chain})
    return found if found else None


def checked_times(measured: object) -> MoeTimes | None:
    """Rows a user gives (``prepare_moe(measured=...)``, ``moe_plan_for``) checked against every declared
    route (:func:`~fp8select.measured.moe.check_moe_times`), as a copy; None stays None (the tables' rows)."""
    if measured is None:
        return None
    return check_moe_times(measured, (f"{cls.name}/{layout}" for cls in MOE_BACKENDS for layout in cls.layouts))


def moe_plan_for(decision: Decision, chain: Sequence[MoeBackend], experts: int, hidden: int, intermediate: int,
                 top_k: int, block_size: Sequence[int] = (128, 128), measured: MoeTimes | None = None,
                 table: MoeMeasurements | None = None, invariance: Invariance | None = None) -> MoePlan:
    block = check_block_size(block_size)
    for name, value in (("experts", experts), ("hidden", hidden), ("intermediate", intermediate), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name}: expected a positive int, found {value!r}")
    problem = MoeProblem(experts, hidden, intermediate, top_k, block, None, torch.float8_e4m3fn, torch.bfloat16)
    measured, estimated = checked_times(measured), None
    if measured is None and table is not None:
        measured = table.times(experts, hidden, intermediate, top_k)
        estimated = table.estimates(experts, hidden, intermediate, top_k)
    return build_moe_plan(problem, chain, decision.capabilities, measured=measured, estimated=estimated,
                          explicit=moe_explicit(decision, chain), invariance=invariance)
