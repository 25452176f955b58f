"""The decision: which backend runs on this machine, and every candidate's verdict (a value).

:func:`choose` is a pure function of (capabilities, candidates in priority order, explicit
choice, disabled set) returning a :class:`Decision`. It imports nothing that prepares, plans or
measures: :func:`fp8select.resolve` gathers its inputs (detection, plugins, the environment),
verifies and reconciles it, and returns a :class:`~fp8select.selection.Selection` (a decision
with the means to prepare layers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fp8select.backends import BUILTIN_BACKENDS, Backend
from fp8select.capabilities import Capabilities
from fp8select.errors import BackendRejectedError, NoBackendError, UnknownBackendError
from fp8select.guard import safe_verdict
from fp8select.verdict import Candidate

__all__ = ["ENV_BACKEND", "ENV_DISABLE", "SOURCES", "Decision", "builtin_backends", "choose"]

SOURCES = ("argument", "environment", "auto")


@dataclass(frozen=True)
class Decision:
    """What was chosen: ``backend``; ``verdicts``, one per candidate in priority order (never
    pre-filtered), plus one rejected entry per plugin that failed to load; ``source``, whether the
    choice came from an ``argument``, the ``environment`` or ``auto``; ``chain``, the accepted
    backends, chosen first; the ``capabilities`` it was made for, the ``disabled`` names and
    ``notes`` (verification, reconciliation across ranks)."""

    backend: Backend
    verdicts: tuple[Candidate, ...]
    source: str
    capabilities: Capabilities
    chain: tuple[Backend, ...]
    disabled: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def explicit(self) -> str | None:
        """The backend named by ``backend=`` / ``FP8SELECT_BACKEND``, None for an automatic choice."""
        return None if self.source == "auto" else self.backend.name

    @property
    def fallbacks(self) -> tuple[Backend, ...]:
        return self.chain[1:]


ENV_BACKEND = "FP8SELECT_BACKEND"
ENV_DISABLE = "FP8SELECT_DISABLE"


def builtin_backends() -> dict[str, Backend]:
    """A fresh instance of every built-in backend, by name."""
    return {cls.name: cls() for cls in BUILTIN_BACKENDS}


def _check(backend: Backend, caps: Capabilities) -> tuple[bool, str]:
    """A backend's device-level verdict; a (plugin) gate that raises (even SystemExit) or answers nonsense is a rejection."""
    verdict = safe_verdict(backend.check, caps, what="device-level check")
    return verdict.ok, verdict.reason


def choose(caps: Capabilities, backends: Mapping[str, Backend], order: Sequence[str], *,
           explicit: str | None = None, explicit_source: str = "argument",
           disabled: Sequence[str] = (), disabled_source: str = "argument",
           origins: Mapping[str, str] | None = None, failures: Sequence[tuple[str, str]] = ()) -> Decision:
    """Evaluate every candidate in ``order`` against ``caps`` and pick one (pure). A name repeated in
    ``order`` counts once, at its first place."""
    valid = tuple(dict.fromkeys(order))
    for name in valid:
        if name not in backends:
            raise UnknownBackendError(name, sorted(backends), parameter="order")
    if explicit is not None and explicit not in backends:
        raise UnknownBackendError(explicit, valid, parameter="backend" if explicit_source == "argument" else ENV_BACKEND)
    for name in disabled:
        if name not in backends:
            raise UnknownBackendError(name, valid, parameter="disable" if disabled_source == "argument" else ENV_DISABLE)
    origins = origins or {}
    candidates: list[Candidate] = []
    names = list(valid) + ([explicit] if explicit is not None and explicit not in valid else [])
    for rank, name in enumerate(names, 1):
        if name in disabled:
            how = "disable=" if disabled_source == "argument" else f"{ENV_DISABLE}="
            candidates.append(Candidate(rank, name, False, f"disabled by {how}{','.join(disabled)}", origins.get(name, "builtin")))
            continue
        ok, reason = _check(backends[name], caps)
        candidates.append(Candidate(rank, name, ok, reason, origins.get(name, "builtin")))
    for offset, (plugin, reason) in enumerate(failures, len(candidates) + 1):
        candidates.append(Candidate(offset, f"plugin:{plugin}", False, reason, "plugin"))

    accepted = [backends[c.name] for c in candidates if c.accepted]
    if explicit is not None:
        requested = next(c for c in candidates if c.name == explicit)
        if not requested.accepted:
            raise BackendRejectedError(explicit, explicit_source, candidates)
        chosen, source = backends[explicit], explicit_source
    elif accepted:
        chosen, source = accepted[0], "auto"
    else:
        raise NoBackendError(f"this machine ({caps.device_kind}, torch {caps.torch_version})", candidates)
    chain = (chosen, *[b for b in accepted if b is not chosen])
    return Decision(chosen, tuple(candidates), source, caps, chain, tuple(disabled))
