"""Third-party backends through pluggy (project ``fp8select``, entry-point group ``fp8select``).

A plugin module (or object) implements the hook :func:`fp8select_backends`, returning a list
of backend classes or instances, each optionally wrapped in :class:`Placement` to say where it
goes in the priority order (by default just before ``reference``). Entry points are loaded
when :func:`load_plugins` runs (from :func:`fp8select.resolve`), never at import.

Plugin code is foreign code (:mod:`fp8select.guard`): a plugin that fails to import, exits
(``SystemExit`` from an ``argparse`` at import), does not finish importing within
``FP8SELECT_PLUGIN_TIMEOUT_S`` seconds (default :data:`DEFAULT_TIMEOUT_S`), raises in its hook,
returns something that is not a list of backends, or offers a backend whose name is invalid,
reserved or taken is reported (a :class:`PluginWarning` and a rejected ``plugin:NAME``
verdict) and ignored; the rest works without it.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import math
import re
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from fp8select.backends.base import Backend
from fp8select.errors import InvalidInputError
from fp8select.guard import Outcome, call_foreign, safe_repr
from fp8select.names import RESERVED, canonical

PROJECT = "fp8select"
BACKEND_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
ENV_TIMEOUT = "FP8SELECT_PLUGIN_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
"""Seconds an entry point may take to import (and its hook to answer) before it is reported and skipped.

Generous because a plugin module that imports a CUDA library at import can take seconds; a
plugin that blocks costs this much once per process (later resolutions do not wait for it again).
"""
MAX_BACKENDS = 64
"""The most backends one plugin's hook may return (a runaway generator is cut off, not drained)."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class Placement:
    """Where a plugin backend goes: before or after a named backend (default: before ``reference``)."""

    backend: Backend | type[Backend]
    before: str | None = None
    after: str | None = None


class PluginWarning(UserWarning):
    """A plugin could not be used; fp8select carries on without it."""


class _Spec:
    @hookspec
    def fp8select_backends(self) -> Sequence[Placement | Backend | type[Backend]]:  # type: ignore[empty-body]
        """Return the backends this plugin provides."""


@dataclass(frozen=True)
class PluginBackend:
    backend: Backend
    plugin: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    reason: str


@dataclass(frozen=True)
class LoadedPlugins:
    backends: tuple[PluginBackend, ...] = ()
    failures: tuple[PluginFailure, ...] = ()


def plugin_timeout(env: Mapping[str, str]) -> float | None:
    """The import time limit from ``FP8SELECT_PLUGIN_TIMEOUT_S`` in ``env`` (None: no limit, for ``inf``)."""
    raw = env.get(ENV_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise InvalidInputError(f"{ENV_TIMEOUT}: expected a positive number of seconds (or inf for no limit), found {raw!r}")
    return None if math.isinf(value) else value


def load_plugins(extra: Iterable[Any] = (), *, entry_points: bool = True, taken: Iterable[str] = (),
                 timeout_s: float | None = DEFAULT_TIMEOUT_S) -> LoadedPlugins:
    """Load entry-point plugins (and ``extra`` plugin objects) and collect their backends.

    ``timeout_s`` bounds each entry point's import and each hook call (None: no bound).
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(_Spec)
    failures: list[PluginFailure] = []

    def fail(plugin: str, reason: str) -> None:
        failures.append(PluginFailure(plugin, reason))
        warnings.warn(f"fp8select plugin {plugin!r} ignored: {reason}", PluginWarning, stacklevel=3)

    candidates: list[tuple[str, Any]] = []
    if entry_points:
        listed = call_foreign(lambda: list(importlib.metadata.entry_points(group=PROJECT)))
        if listed.error is not None:
            fail("entry-points", f"could not list the {PROJECT!r} entry points: {listed.error}")
        for ep in listed.value or ():
            loaded = _load_entry_point(ep, timeout_s)
            if loaded.error is not None:
                fail(ep.name, f"failed to load entry point {ep.value!r}: {loaded.error}")
            else:
                candidates.append((ep.name, loaded.value))
    for obj in extra:
        named = call_foreign(lambda obj=obj: getattr(obj, "__name__", None))
        candidates.append((named.value if isinstance(named.value, str) else type(obj).__name__, obj))

    names = set(taken)
    found: list[PluginBackend] = []
    for plugin_name, obj in candidates:
        registered = call_foreign(pm.register, obj, plugin_name)
        if registered.error is not None:
            fail(plugin_name, f"is not a valid plugin: {registered.error}")
            continue
        for impl in pm.hook.fp8select_backends.get_hookimpls():
            if impl.plugin is not obj:
                continue
            returned = call_foreign(_collect, impl.function, timeout_s=timeout_s)
            if returned.error is not None:
                verb = "" if returned.timed_out else "raised "
                fail(plugin_name, f"hook fp8select_backends {verb}{returned.error}")
                continue
            items, problem = returned.value or ([], None)
            if problem is not None:
                fail(plugin_name, problem)
                continue
            for backend, before, after, problem in items:
                if backend is None:
                    fail(plugin_name, problem or "returned something that is not a Backend subclass or instance")
                    continue
                problem = _name_problem(backend, names)
                if problem is not None:
                    fail(plugin_name, problem)
                else:
                    names.add(backend.name)
                    found.append(PluginBackend(backend, plugin_name, before, after))
    return LoadedPlugins(tuple(found), tuple(failures))


def _collect(hook: Any) -> tuple[list[tuple[Backend | None, str | None, str | None, str | None]], str | None]:
    """Call a plugin's hook and construct its backends (in the time-limited call).

    Returns (one :func:`_unpack` result per item, None), or ([], why the answer is not a list
    of backends).
    """
    returned = hook()
    if returned is None:
        return [], None
    if isinstance(returned, (str, bytes, Mapping, Placement, Backend)) or (
            isinstance(returned, type) and issubclass(returned, Backend)):
        return [], f"returned {safe_repr(returned)}, expected a list of backends (Backend subclasses, instances or Placements)"
    if not isinstance(returned, Iterable):
        return [], f"returned {safe_repr(returned)}, expected a list of backends (Backend subclasses, instances or Placements)"
    items = list(itertools.islice(returned, MAX_BACKENDS + 1))
    if len(items) > MAX_BACKENDS:
        return [], f"returned more than {MAX_BACKENDS} backends (a runaway generator?)"
    return [_unpack(item) for item in items], None


def _unpack(item: Any) -> tuple[Backend | None, str | None, str | None, str | None]:
    """(backend instance, before, after, None), or (None, ..., why not)."""
    before = after = None
    if isinstance(item, Placement):
        for label, target in (("before", item.before), ("after", item.after)):
            if target is not None and not isinstance(target, str):
                return None, None, None, f"Placement {label}={safe_repr(target)}: expected a backend name or None"
        before = canonical(item.before) if item.before is not None else None
        after = canonical(item.after) if item.after is not None else None
        item = item.backend
    if isinstance(item, type) and issubclass(item, Backend):
        made = call_foreign(item)
        if made.error is not None:
            return None, None, None, f"constructing backend {item.__name__} raised {made.error}"
        item = made.value
    if isinstance(item, Backend):
        return item, before, after, None
    return None, None, None, f"returned {safe_repr(item)}, which is not a Backend subclass or instance"


def _name_problem(backend: Backend, taken: set[str]) -> str | None:
    """Why ``backend``'s name cannot be used, or None."""
    read = call_foreign(lambda: backend.name)
    kind = type(backend).__name__
    if read.error is not None:
        return f"backend {kind}: reading its name raised {read.error}"
    name = read.value
    if not name:
        return f"backend {kind} has no name"
    if not isinstance(name, str) or not BACKEND_NAME.fullmatch(name):
        return (f"backend name {safe_repr(name)} is not valid: expected lowercase letters, digits, "
                "'-', '_' or '.', starting with a letter or digit (it is used in FP8SELECT_DISABLE lists)")
    if name in RESERVED:
        return f"backend name {name!r} is reserved (it means {canonical(name)!r} when typed); choose another"
    if name in taken:
        return f"backend name {name!r} is already taken"
    return None


def place(order: Sequence[str], plugins: Sequence[PluginBackend]) -> list[str]:
    """``order`` with each plugin backend inserted where its placement says.

    A placement naming a backend that is not in ``order`` (a typo, or a backend of a plugin
    that is not installed) puts the backend at the default place, just before ``reference``,
    with a :class:`PluginWarning` saying so.
    """
    result = list(order)
    for p in plugins:
        if p.after is not None and p.after in result:
            result.insert(result.index(p.after) + 1, p.backend.name)
            continue
        if p.before is not None and p.before in result:
            result.insert(result.index(p.before), p.backend.name)
            continue
        missing = p.after if p.after is not None else p.before
        fallback = "reference" if "reference" in result else None
        if missing is not None:
            warnings.warn(f"fp8select plugin {p.plugin!r}: backend {p.backend.name!r} is to be placed "
                          f"{'after' if p.after is not None else 'before'} {missing!r}, which is not in the order; "
                          f"placed {'before ' + repr(fallback) if fallback else 'last'} instead", PluginWarning, stacklevel=3)
        if fallback is not None:
            result.insert(result.index(fallback), p.backend.name)
        else:
            result.append(p.backend.name)
    return result


# --- entry-point imports with a time limit --------------------------------------------------------
# An import that runs past its limit is left running in its daemon thread (Python cannot stop a
# thread). It is remembered here, by entry point, for the life of the process: a later load then
# waits for that same import instead of starting another one that would block on its module lock,
# and uses its result if it has finished meanwhile. This is process state by nature (the thread is).

@dataclass
class _Import:
    thread: threading.Thread
    box: list[Outcome[Any]]
    started: float


_PENDING: dict[str, _Import] = {}
_PENDING_LOCK = threading.Lock()


def _load_entry_point(ep: importlib.metadata.EntryPoint, timeout_s: float | None) -> Outcome[Any]:
    """``ep.load()`` in a daemon thread, waited for until ``timeout_s`` after the import started."""
    if timeout_s is None:
        return call_foreign(ep.load)
    key = f"{ep.group}:{ep.name}={ep.value}"
    with _PENDING_LOCK:
        job = _PENDING.get(key)
        if job is None:
            box: list[Outcome[Any]] = []
            thread = threading.Thread(target=lambda: box.append(call_foreign(ep.load)), name=f"fp8select-plugin-import-{ep.name}",
                                      daemon=True)
            job = _PENDING[key] = _Import(thread, box, time.monotonic())
            thread.start()
    job.thread.join(max(0.0, job.started + timeout_s - time.monotonic()))
    if job.thread.is_alive():
        waited = time.monotonic() - job.started
        return Outcome(error=f"did not finish importing within {timeout_s:g} s (still running after {waited:.1f} s, "
                             f"abandoned; raise {ENV_TIMEOUT} if it is only slow)", timed_out=True)
    with _PENDING_LOCK:
        if _PENDING.get(key) is job:
            del _PENDING[key]
    return job.box[0] if job.box else Outcome(error="its import thread ended without a result")

