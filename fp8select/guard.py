"""Calling code fp8select does not own (plugins), so that whatever it does becomes a value.

Third-party code can raise anything, including ``SystemExit`` (a module that runs
``argparse`` at import) and other ``BaseException`` subclasses that ``except Exception``
lets through; it can return nonsense, raise an exception whose ``str()`` raises, or block.
The helpers here turn each of those into a description or a rejected
:class:`~fp8select.verdict.Verdict`, so one bad plugin never exits, hangs or crashes the host.
Only ``KeyboardInterrupt`` passes through: the user asked to stop.
"""

from __future__ import annotations

import reprlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fp8select.verdict import Verdict

T = TypeVar("T")

PASS_THROUGH: tuple[type[BaseException], ...] = (KeyboardInterrupt,)
"""Exceptions foreign code may raise through fp8select: only the user's interrupt."""

_REPR_LIMIT = 200


def describe(exc: BaseException) -> str:
    """``"RuntimeError: boom"`` (the first line of its message); never raises, even when the
    exception's ``__str__`` does."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except PASS_THROUGH:
        raise
    except BaseException as inner:  # noqa: BLE001 - a broken __str__ must not escape
        text = f"<str() raised {type(inner).__name__}>"
    if isinstance(exc, SystemExit):
        text = f"exit status {exc.code!r}" if exc.code is not None else "no exit status"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    text = lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""  # one line: it goes into verdict tables
    return f"{name}: {_shorten(text)}" if text else name


def safe_repr(obj: object) -> str:
    """``repr(obj)`` cut to a readable length (long strings and containers abbreviated, integers too
    long to print named by size); never raises."""
    try:
        text = _REPR.repr(_shrink(obj))
    except PASS_THROUGH:
        raise
    except BaseException as exc:  # noqa: BLE001 - a broken __repr__ must not escape
        text = f"<{type(obj).__name__} whose repr() raised {type(exc).__name__}>"
    return _shorten(text)


class _Huge:
    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of about {self.digits} digits>"


def _shrink(obj: object, depth: int = 0) -> object:
    """``obj`` with integers too long to print (over 1000 digits) replaced by a note of their size."""
    if isinstance(obj, int) and not isinstance(obj, bool) and obj.bit_length() > 3300:
        return _Huge(int(obj.bit_length() * 0.30103) + 1)
    if depth < 3 and isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_shrink(v, depth + 1) for v in obj)
    if depth < 3 and isinstance(obj, dict) and type(obj) is dict:
        return {k: _shrink(v, depth + 1) for k, v in obj.items()}
    return obj


def _make_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxstring = r.maxother = 160
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 12
    r.maxlevel = 4
    return r


_REPR = _make_repr()


def _shorten(text: str) -> str:
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT - 3] + "..."


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What a foreign call did: its ``value``, or ``error`` (a description) when it failed."""

    value: T | None = None
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def call_foreign(fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> Outcome[T]:
    """Call foreign ``fn(*args)``; any exception but ``KeyboardInterrupt`` becomes an error.

    With ``timeout_s``, the call runs in a daemon thread and is abandoned (left to finish or
    block on its own; Python cannot stop a thread) after that many seconds, which is reported
    as an error: use it for one-time work such as importing a plugin, not for hot paths.
    """
    if timeout_s is None:
        try:
            return Outcome(value=fn(*args))
        except PASS_THROUGH:
            raise
        except BaseException as exc:  # noqa: BLE001 - foreign code may raise anything, SystemExit included
            return Outcome(error=describe(exc))
    box: list[Outcome[T]] = []

    def run() -> None:
        box.append(call_foreign(fn, *args))

    thread = threading.Thread(target=run, name="fp8select-foreign-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive() or not box:
        return Outcome(error=f"did not finish within {timeout_s:g} s (still running; abandoned)", timed_out=True)
    return box[0]


def safe_verdict(fn: Callable[..., object], *args: Any, what: str = "gate") -> Verdict:
    """``fn(*args)`` as a :class:`Verdict`; an exception or a non-verdict answer is a rejection.

    For a backend's gates (``check(caps)``, ``supports(problem, caps)``): a plugin's gate that
    raises, or returns something other than a verdict (``"yes"``, ``None``, a verdict-like
    object whose ``ok`` is not a bool), rejects the backend with a reason naming what happened
    (``its problem-level gate raised RuntimeError: boom``), so it is never chosen and then fails.
    """
    outcome = call_foreign(fn, *args)
    if outcome.error is not None:
        return Verdict.reject(f"its {what} raised {outcome.error}")
    verdict = outcome.value
    if isinstance(verdict, Verdict) and isinstance(verdict.ok, bool) and isinstance(verdict.reason, str):
        return verdict
    read = call_foreign(lambda: (getattr(verdict, "ok", None), getattr(verdict, "reason", None)))
    ok, reason = read.value if read.value is not None else (None, None)
    if isinstance(ok, bool) and isinstance(reason, str):
        return Verdict(ok, reason)
    return Verdict.reject(f"its {what} returned {safe_repr(verdict)}, expected a Verdict")
