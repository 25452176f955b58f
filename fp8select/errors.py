"""Typed errors. Each subclasses a built-in so callers can catch what they already expect."""

from __future__ import annotations

from collections.abc import Sequence

from fp8select.verdict import Candidate


def _format_candidates(candidates: Sequence[Candidate]) -> str:
    return "\n".join(f"  {c.name}: {'accepted' if c.accepted else 'rejected'}: {c.reason}" for c in candidates)


class Fp8SelectError(Exception):
    """Base class of every error fp8select raises on purpose."""


class UnknownBackendError(Fp8SelectError, LookupError):
    """A backend name that is neither built in nor provided by a plugin."""

    def __init__(self, name: str, valid: Sequence[str], parameter: str = "backend") -> None:
        self.name = name
        self.valid = tuple(valid)
        super().__init__(f"{parameter}: unknown backend {name!r}; valid names: {', '.join(self.valid)}")


class BackendRejectedError(Fp8SelectError, ValueError):
    """An explicitly requested backend cannot run here; it is never silently replaced."""

    def __init__(self, name: str, source: str, candidates: Sequence[Candidate]) -> None:
        self.name = name
        self.source = source
        self.candidates = tuple(candidates)
        reason = next((c.reason for c in self.candidates if c.name == name), "not a candidate")
        super().__init__(
            f"backend {name!r} was requested ({source}) but is rejected: {reason}\n"
            f"all verdicts:\n{_format_candidates(self.candidates)}"
        )


class NoBackendError(Fp8SelectError, RuntimeError):
    """No candidate accepted this machine (or this problem)."""

    def __init__(self, what: str, candidates: Sequence[Candidate]) -> None:
        self.candidates = tuple(candidates)
        super().__init__(f"no backend can run {what}:\n{_format_candidates(self.candidates)}")


class UnsupportedProblemError(Fp8SelectError, ValueError):
    """No backend in the selection's chain accepts this layer or call (block size, dtypes, shape)."""

    def __init__(self, what: str, candidates: Sequence[Candidate]) -> None:
        self.candidates = tuple(candidates)
        super().__init__(f"no backend in the chain supports {what}:\n{_format_candidates(self.candidates)}")


class BatchInvariantError(Fp8SelectError, LookupError):
    """Batch-invariant plans asked for (``resolve(batch_invariant=True)``, ``FP8SELECT_BATCH_INVARIANT=1``)
    and no backend of the chain is known to give a row the same bits whatever its batch, for this
    layer or on this machine: each backend's reason is listed."""

    def __init__(self, what: str, candidates: Sequence[Candidate]) -> None:
        self.candidates = tuple(candidates)
        super().__init__(
            f"no backend runs {what} batch-invariant here:\n{_format_candidates(self.candidates)}\n"
            "measure this device with `python -m benchmarks.invariance --out DIR --write-record FILE`, or resolve "
            "without batch_invariant")


class CapabilitiesError(Fp8SelectError, ValueError):
    """A capability snapshot (JSON or an override) that is malformed."""


class InvalidInputError(Fp8SelectError, ValueError):
    """A tensor or argument with the wrong shape, value or device."""


class InvalidDtypeError(Fp8SelectError, TypeError):
    """A tensor or argument of the wrong dtype or type."""


class RankMismatchError(Fp8SelectError, RuntimeError):
    """Ranks of a process group reached decisions that cannot be reconciled (or one failed).

    ``reports`` holds each rank's report (:class:`fp8select.distributed.RankReport`): its
    snapshot fingerprint, its choice and every candidate's verdict, so the error shows why
    each rank decided as it did.
    """

    def __init__(self, message: str, reports: Sequence[object]) -> None:
        self.reports = tuple(reports)
        super().__init__(message)


class NotPreparedError(Fp8SelectError, RuntimeError):
    """A module called before its weights were loaded and laid out for a backend (or while they
    sit on a device its selection does not run on)."""


class NotPicklableError(Fp8SelectError, TypeError):
    """An object that holds device-bound state (a prepared layer's launches) asked to be pickled or
    deep-copied: pickle what it was made from instead."""
