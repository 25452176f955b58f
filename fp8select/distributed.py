"""One decision across ranks: exchange choices over a ``torch.distributed`` group and reconcile them.

Tensor- and pipeline-parallel ranks must run the same kernel: different backends round
differently, so ranks that disagree produce outputs that differ in the last bits and, with
a broken backend on one rank, outright wrong shards. :func:`agree` gathers every rank's
decision (snapshot fingerprint, choice, every verdict) and either confirms it, replaces it by
the best backend every rank accepts (``on_mismatch="common"``), or raises with each rank's
verdicts (``on_mismatch="raise"``). A rank whose own resolution failed still takes part in
the exchange, so the others raise instead of waiting for it forever.

:func:`broadcast_table` / :func:`measure_on_one_rank` send a tuning table measured on one
rank to all of them, so every rank runs the same configs (and the device is measured once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from fp8select._log import get_logger
from fp8select.decision import Decision
from fp8select.errors import InvalidDtypeError, InvalidInputError, RankMismatchError
from fp8select.verdict import Candidate

D = TypeVar("D", bound=Decision)
"""A decision or a subclass of it (a Selection): returned as the type it was given."""

__all__ = ["MISMATCH_POLICIES", "RankReport", "agree", "broadcast_table", "measure_on_one_rank"]

MISMATCH_POLICIES = ("common", "raise")


@dataclass(frozen=True)
class RankReport:
    """What one rank decided, as plain picklable data (what :func:`agree` exchanges).

    ``backend`` is None when the rank's resolution failed; ``error`` then says how.
    ``order`` lists every candidate in that rank's priority order, ``accepted`` the backends
    it could use (its chain: accepted and, where verification ran, verified) and ``reasons``
    every candidate's verdict reason.
    """

    rank: int
    fingerprint: str | None
    backend: str | None
    source: str | None
    order: tuple[str, ...] = ()
    accepted: tuple[str, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def of(cls, rank: int, outcome: Decision | BaseException) -> RankReport:
        if isinstance(outcome, Decision):
            return cls(rank, outcome.capabilities.fingerprint(), outcome.backend.name, outcome.source,
                       tuple(c.name for c in outcome.verdicts), tuple(b.name for b in outcome.chain),
                       {c.name: c.reason for c in outcome.verdicts})
        candidates = getattr(outcome, "candidates", ())
        return cls(rank, None, None, None, tuple(c.name for c in candidates),
                   (), {c.name: c.reason for c in candidates}, error=f"{type(outcome).__name__}: {outcome}")

    def describe(self) -> str:
        """Several lines: the rank's choice (or error), then each candidate's verdict."""
        if self.error is not None:
            head = f"rank {self.rank}: failed: {self.error.splitlines()[0]}"
        else:
            head = f"rank {self.rank} (snapshot {self.fingerprint}): chose {self.backend!r} ({self.source})"
        lines = [head]
        for name in self.order:
            verdict = "accepted" if name in self.accepted else "rejected"
            lines.append(f"    {name}: {verdict}: {self.reasons.get(name, '')}")
        return "\n".join(lines)


def _dist() -> Any:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise InvalidInputError("group: expected an initialised torch.distributed process group "
                                "(call torch.distributed.init_process_group first), found none")
    return dist


def _check_policy(on_mismatch: object) -> str:
    if on_mismatch not in MISMATCH_POLICIES:
        raise InvalidInputError(f"on_mismatch: expected one of {', '.join(map(repr, MISMATCH_POLICIES))}, "
                                f"found {on_mismatch!r}")
    return str(on_mismatch)


def exchange(report: RankReport, group: Any = None) -> list[RankReport]:
    """Every rank's report, in group rank order (a collective: every rank must call it)."""
    dist = _dist()
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, report, group=group)
    return [r if isinstance(r, RankReport) else RankReport(i, None, None, None, error=f"sent {type(r).__name__}")
            for i, r in enumerate(gathered)]


def agree(outcome: D | BaseException, group: Any = None, *, on_mismatch: str = "common") -> D:
    """Reconcile this rank's decision with every other rank's in ``group`` (a collective).

    ``outcome`` is this rank's :class:`~fp8select.selection.Selection`, or the exception its
    resolution raised (it is re-raised here after the exchange, so no rank waits forever).
    When every rank chose the same backend it is kept, with the fallback chain narrowed to
    backends every rank accepts. When choices differ, ``on_mismatch="common"`` takes the first
    backend, in rank 0's priority order, that every rank accepts (unless some rank's choice was
    explicit, which is never substituted), and ``"raise"`` raises :class:`RankMismatchError`
    listing each rank's verdicts. ``group=None`` is the default (world) group.
    """
    policy = _check_policy(on_mismatch)
    dist = _dist()
    rank = dist.get_rank(group)
    if not isinstance(outcome, (Decision, BaseException)):
        # Still take part in the exchange (the other ranks are waiting), then raise.
        outcome = InvalidDtypeError(f"outcome: expected a Selection or the exception resolve raised, "
                                    f"found {type(outcome).__name__}")
    reports = exchange(RankReport.of(rank, outcome), group)
    log = get_logger()
    failed = [r for r in reports if r.error is not None]
    if failed:
        log.warning("fp8select.ranks_disagree", reason="resolution failed", ranks=[r.rank for r in failed])
        if isinstance(outcome, BaseException):
            raise outcome
        raise RankMismatchError(_message("resolution failed on rank(s) " + ", ".join(str(r.rank) for r in failed), reports),
                                reports)
    if isinstance(outcome, BaseException):  # unreachable: its own report carried the error
        raise outcome
    common = [name for name in reports[0].accepted if all(name in r.accepted for r in reports)]
    choices = {r.backend for r in reports}
    fingerprints = {r.fingerprint for r in reports}
    if len(choices) == 1:
        chosen = outcome.backend.name
    elif policy == "raise":
        log.warning("fp8select.ranks_disagree", reason="different choices", choices=[r.backend for r in reports])
        raise RankMismatchError(_message("ranks chose different backends (on_mismatch='raise')", reports), reports)
    elif any(r.source != "auto" for r in reports):
        log.warning("fp8select.ranks_disagree", reason="explicit choice differs", choices=[r.backend for r in reports])
        raise RankMismatchError(_message("ranks chose different backends and at least one choice is explicit, "
                                         "which is never substituted", reports), reports)
    elif not common:
        log.warning("fp8select.ranks_disagree", reason="no common backend", choices=[r.backend for r in reports])
        raise RankMismatchError(_message("ranks chose different backends and no backend is accepted by every rank",
                                         reports), reports)
    else:
        chosen = common[0]
    result = _narrow(outcome, reports, chosen, common)
    log.info("fp8select.ranks_agree", backend=chosen, ranks=len(reports), changed=chosen != outcome.backend.name,
             choices=[r.backend for r in reports], fingerprints=sorted(str(f) for f in fingerprints))
    return result


def _narrow(selection: D, reports: Sequence[RankReport], chosen: str, common: Sequence[str]) -> D:
    """``selection`` with ``chosen`` first and only backends every rank accepts in its chain."""
    by_name = {b.name: b for b in selection.chain}
    chain = [by_name[chosen]] + [by_name[n] for n in common if n != chosen and n in by_name]
    verdicts: list[Candidate] = []
    for c in selection.verdicts:
        elsewhere = [r for r in reports if c.name not in r.accepted]
        if c.accepted and elsewhere:
            why = "; ".join(f"rank {r.rank}: {r.reasons.get(c.name, 'not a candidate')}" for r in elsewhere)
            c = replace(c, accepted=False, reason=f"accepted on this rank, rejected on another: {why}")
        verdicts.append(c)
    notes = list(selection.notes)
    if chosen != selection.backend.name:
        notes.append(f"ranks disagreed ({', '.join(f'rank {r.rank}: {r.backend}' for r in reports)}); "
                     f"{chosen!r} is the best backend every rank accepts")
    if len({r.fingerprint for r in reports}) > 1:
        notes.append("snapshots differ across ranks: " + ", ".join(f"rank {r.rank}: {r.fingerprint}" for r in reports))
    return replace(selection, backend=by_name[chosen], chain=tuple(chain), verdicts=tuple(verdicts), notes=tuple(notes))


def _message(head: str, reports: Sequence[RankReport]) -> str:
    return head + ":\n" + "\n".join(r.describe() for r in reports)


def _global_src(dist: Any, group: Any, src: int) -> int:
    return src if group is None else int(dist.get_global_rank(group, src))


def broadcast_table(table: Mapping[str, Any] | None, group: Any = None, src: int = 0) -> dict[str, Any]:
    """Rank ``src``'s tuning table on every rank (a collective; ``src`` is a rank of ``group``).

    Only ``src``'s ``table`` is used (others typically pass None). It is validated against the
    tuning-table schema on ``src`` before sending: an invalid one raises
    :class:`~fp8select.errors.InvalidInputError` on ``src`` and
    :class:`~fp8select.errors.RankMismatchError` naming it on the other ranks, rather than spreading.
    """
    from fp8select.measured.table import validate_table

    def checked() -> dict[str, Any]:
        if table is None:
            raise InvalidInputError(f"table: expected a tuning table on rank {src} (the source), found None")
        problem = validate_table(dict(table) if isinstance(table, Mapping) else table)
        if problem is not None:
            raise InvalidInputError(f"table: {problem}")
        return dict(table)

    return measure_on_one_rank(checked, group, src)


def measure_on_one_rank(measure: Callable[[], Mapping[str, Any]], group: Any = None, src: int = 0) -> dict[str, Any]:
    """Run ``measure`` on rank ``src`` only and return its result on every rank (a collective).

    For tuning: the device is measured once and every rank gets the same table. If
    ``measure`` raises on ``src``, ``src`` re-raises it and every other rank raises
    :class:`~fp8select.errors.RankMismatchError` naming it; nobody waits forever.
    """
    dist = _dist()
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < world:
        raise InvalidInputError(f"src: expected a rank of the group in [0, {world}), found {src!r}")
    payload: list[Any] = [None]
    error: BaseException | None = None
    if rank == src:
        try:
            payload[0] = ("ok", dict(measure()))
        except Exception as exc:  # noqa: BLE001 - sent to the other ranks, then re-raised here
            error = exc
            payload[0] = ("error", f"{type(exc).__name__}: {exc}")
    dist.broadcast_object_list(payload, src=_global_src(dist, group, src), group=group)
    if error is not None:
        raise error
    received = payload[0]
    if isinstance(received, tuple) and len(received) == 2 and received[0] == "ok" and isinstance(received[1], dict):
        return received[1]
    detail = received[1] if isinstance(received, tuple) and len(received) == 2 else repr(received)
    raise RankMismatchError(f"measurement on rank {src} failed: {detail}", ())

