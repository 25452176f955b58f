"""Decisions as values: every probe and gate answers with a :class:`Verdict`; a chain lists
:class:`Candidate` verdicts, one per backend."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """The answer of one probe or gate: accepted or rejected, and why.

    ``reason`` always names what was required and what was found, so a rejection can be
    read on its own in a log line or a bug report.
    """

    ok: bool
    reason: str

    @classmethod
    def accept(cls, reason: str) -> Verdict:
        return cls(True, reason)

    @classmethod
    def reject(cls, reason: str) -> Verdict:
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.ok


def first_rejection(verdicts: list[Verdict] | tuple[Verdict, ...], accepted: str) -> Verdict:
    """The first rejected verdict, or one acceptance summarising ``accepted``."""
    for verdict in verdicts:
        if not verdict.ok:
            return verdict
    return Verdict.accept(accepted)


@dataclass(frozen=True)
class Candidate:
    """One backend's verdict in a chain (rank is 1-based in priority order)."""

    rank: int
    name: str
    accepted: bool
    reason: str
    origin: str = "builtin"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "backend": self.name, "accepted": self.accepted, "reason": self.reason, "origin": self.origin}


def prepare_failures(failed: Mapping[str, str], ranked: int) -> list[Candidate]:
    """A rejected verdict per backend whose ``prepare()`` failed (``failed``: name -> error), ranked after
    ``ranked`` others: what a layer's plans add to their verdicts, dense and MoE alike."""
    return [Candidate(ranked + i, name, False, f"prepare() raised {why}") for i, (name, why) in enumerate(failed.items(), 1)]
